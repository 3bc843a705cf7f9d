//! branchbox's KVM virtual machine monitor (work in progress).
