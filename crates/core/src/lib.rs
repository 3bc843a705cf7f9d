//! The branchbox engine: what the CLI and the service call.
//!
//! It composes the backends (gvisor; microvm once it runs Linux guests), the image cache and
//! the metadata store, and owns the data directory layout:
//! `meta.db`, `images/`, `sandboxes/<id>/` (runtime files), `snapshots/<id>/` (state files),
//! `runsc/` (runsc's own state).
//!
//! Not for: protocol details (branchbox-protocol) or backend internals.

pub mod config;
pub mod diff;
pub mod engine;
pub mod gc;
pub mod host;
pub mod lineage;

/// The image sandboxes get when they name none.
pub use branchbox_image::DEFAULT_IMAGE;
pub use config::Config;
pub use engine::{
    BackendChoice, BuildEvent, Built, Engine, ForkOutcome, SandboxView, ShellInfo, SnapshotOptions, Started,
    StepRecord, Template, TemplateStatus,
};
