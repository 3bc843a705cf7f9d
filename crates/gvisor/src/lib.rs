//! The gvisor backend: each sandbox is a runsc container whose init is the branchbox agent.
//!
//! A per-sandbox shim process (`branchbox-shim`) owns the container's stdio pipes, which are
//! the agent's transport, and serves them on `<sandbox dir>/agent.sock`. Snapshots are runsc
//! checkpoint images, taken with `--leave-running` so the source never stops: processes,
//! memory and the in-memory root overlay (every file the sandbox wrote). Forking restores
//! that image once per child. runsc must be release 20240729 or later (`version`).
//!
//! Not for: building images (branchbox-image) or recording metadata (branchbox-store).

pub mod backend;
pub mod bundle;
pub mod control;
pub mod floor;
pub mod hostcg;
pub mod network;
mod reap;
pub mod runsc;
pub mod shells;
pub mod shim;
pub mod shimlog;
pub mod version;

pub use backend::GvisorBackend;
