//! The synthetic guest's VM, beside [`linux`](crate::linux)'s: the machinery of snapshot,
//! fork and time travel on a guest that runs in guest user mode, so it works at native speed
//! on hosts without hardware virtualization (PVM), where a Linux kernel cannot boot.
//!
//! [`vm::Vm`] composes the KVM VM, guest RAM ([`memory`](crate::memory)), the vCPUs and the
//! devices of [`devices`] (the doorbell, an optional virtio-blk disk), and runs its
//! [`vcpu`]; [`checkpoint`] is its
//! snapshot, checkpoint, rollback and live branch; [`fork`] makes many VMs of one snapshot;
//! [`testguest`] is the guest's code and mailbox protocol. The tests and benchmarks of the
//! monitor drive it; the VMM process (`process`) serves it beside Linux guests.

pub mod checkpoint;
pub mod devices;
pub mod fork;
pub mod testguest;
pub mod vcpu;
pub mod vm;
