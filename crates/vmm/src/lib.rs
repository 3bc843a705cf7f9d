//! branchbox's KVM virtual machine monitor: x86_64 VMs whose RAM is a copy-on-write view of
//! immutable memory layers, complete vCPU/VM state snapshots, and fork of one snapshot into
//! many independent VMs.
//!
//! What it is for: the microVM backend's engine (build, run, pause, snapshot, restore, fork):
//! Linux guests ([`linux`]: a `vmlinux` booted with the structures of `branchbox-arch`,
//! virtio-mmio devices, their snapshots and forks), and the synthetic guest ([`synthetic`])
//! that tests and benchmarks the same machinery on hosts without hardware virtualization.
//! What it is not for: scheduling sandboxes (that is `branchbox-core`, through
//! `branchbox-microvm`).
//!
//! The design and the snapshot format are specified in `docs/microvm.md`.

pub mod config;
pub mod disk;
mod error;
pub mod hypervisor;
pub mod linux;
pub mod memory;
pub mod process;
mod random;
pub mod seccomp;
pub mod snapshot;
pub mod synthetic;
pub mod vstate;

pub use branchbox_persist::{NoContext, RestoreError, Snapshottable};
pub use config::VmConfig;
pub use error::{Error, Result};
pub use hypervisor::Hypervisor;
pub use snapshot::lifecycle::{collect_garbage, Collected};
pub use snapshot::Snapshot;
pub use synthetic::checkpoint::{fork_live, Checkpoint, LiveFork};
pub use synthetic::fork::{fork, fork_paused, fork_with, ShellPool};
pub use synthetic::vm::Vm;
