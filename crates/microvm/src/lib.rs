//! The microvm backend: each sandbox is a Linux guest (the project's kernel and root disk,
//! `docs/guest.md`) in its own `branchbox-vmm` process, which listens on a control socket in
//! the sandbox's directory and outlives the engine command that started it. The guest's agent
//! (PID 1) is reached over vsock: `CONNECT 1024` on the vsock device's Unix socket, then the
//! agent protocol's handshake.
//!
//! Built: create, connect (so exec and files), pause and resume, snapshot, restore and fork
//! (with the agent's after-fork hook), rollback in place (a second VMM restores the snapshot,
//! then takes over the sandbox's sockets: `rollback.rs`), destroy, liveness; networked
//! sandboxes (`network.rs`: a tap in the sandbox's guest namespace, docs/network.md).

mod backend;
mod files;
mod network;
mod rollback;
mod snapshots;

pub use branchbox_vmm::process::default_program as default_vmm_program;

pub use backend::{MicrovmBackend, MicrovmConfig, AGENT_TIMEOUT};
