//! The gvisor backend: each sandbox is a runsc container whose init is the branchbox agent.
//!
//! A per-sandbox shim process (`branchbox-shim`) owns the container's stdio pipes, which are
//! the agent's transport, and serves them on `<sandbox dir>/agent.sock`. Snapshots are runsc
//! checkpoint images: processes, memory and the in-memory root overlay (every file the
//! sandbox wrote) in one file. Forking restores that image once per child.
//!
//! Not for: building images (branchbox-image) or recording metadata (branchbox-store).

pub mod backend;
pub mod bundle;
pub mod control;
pub mod hostcg;
pub mod runsc;
pub mod shim;
pub mod shimlog;

pub use backend::GvisorBackend;
