//! branchbox gvisor (being written).
