//! branchbox core (being written).
