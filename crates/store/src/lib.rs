//! branchbox store (being written).
