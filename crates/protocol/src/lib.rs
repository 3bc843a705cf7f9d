//! branchbox protocol (being written).
