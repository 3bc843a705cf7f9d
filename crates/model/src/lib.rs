//! branchbox's domain model: the words every other crate uses.
//!
//! This crate holds types and the [`Backend`] trait only; it performs no I/O of its own.
//! Backends (gvisor, microvm) implement the trait; `branchbox-core` composes them with the
//! store and the image builder. Not for: runtime logic of any backend.

pub mod backend;
pub mod error;
pub mod ids;
pub mod names;
pub mod sandbox;

pub use backend::{AgentConn, Backend, ChildResult, RestoreShells, SandboxPlan, ShellInfo, ShellsToEnd};
pub use error::{Error, Result};
pub use ids::{SandboxId, SnapshotId};
pub use names::{check_snapshot_ref, Name, MAX_NAME_BYTES, NAME_RULE};
pub use sandbox::{BackendKind, Limits, Sandbox, SandboxState, Snapshot, SnapshotKind};

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
