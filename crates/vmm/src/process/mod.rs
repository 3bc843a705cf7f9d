//! VMs in processes: one VMM process per sandbox, as Firecracker does, driven by the engine
//! over a Unix socket. A VMM escape or crash reaches one sandbox, each process has its own
//! seccomp filters, and forks spread over cores. Forks stay fast through a [`VmmPool`] of
//! pre-started processes, each already holding a built VM shell.
//!
//! - [`protocol`]: frames and typed messages (`docs/microvm.md`, "Where VMs live");
//! - [`serve`], [`serve_listener`]: the process's side (the `branchbox-vmm` binary calls
//!   them), on an inherited socket or on a listening one that outlives the engine;
//! - [`VmmProcess`]: the engine's side of one process;
//! - [`VmmPool`]: pre-started processes and fork into them.

mod client;
mod linux;
mod pool;
pub mod protocol;
mod server;

pub use client::{
    describe_exit, spawn, spawn_listening, ClientError, ClientResult, PendingHello, Spawned, VmmProcess,
    CONTROL_FD, VMM_ENV,
};
pub use pool::{default_program, PoolFork, VmmPool};
pub use server::{serve, serve_listener};
