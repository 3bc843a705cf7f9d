//! branchbox image (being written).
