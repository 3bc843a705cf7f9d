//! The backend contract: everything a way of isolating sandboxes must do. The core drives
//! backends only through this trait; the conformance tests check each backend against it.

use crate::sandbox::{BackendKind, Limits};
use crate::{Result, SandboxId};
use branchbox_protocol::{AgentClient, HookReport};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// A connection to one sandbox's agent.
pub type AgentConn = AgentClient<UnixStream>;

/// Everything a backend needs to start one sandbox.
#[derive(Debug, Clone)]
pub struct SandboxPlan {
    /// The sandbox's id.
    pub id: SandboxId,
    /// A directory owned by this sandbox for runtime files (sockets, logs, bundles).
    pub dir: PathBuf,
    /// Root filesystem of its image (read-only; the backend layers writes on top).
    pub rootfs: PathBuf,
    /// Its limits.
    pub limits: Limits,
    /// Its hostname.
    pub hostname: String,
    /// Its network and egress policy; `None`: no network (docs/network.md). Children and
    /// restores take the one their snapshot was taken with.
    pub network: Option<branchbox_net::Egress>,
}

/// Outcome of starting one child from a snapshot.
pub type ChildResult = Result<HookReport>;

/// One way of isolating sandboxes.
pub trait Backend: Send + Sync {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// Starts a fresh sandbox; returns once its agent answers.
    fn create(&self, plan: &SandboxPlan) -> Result<()>;

    /// Opens a new connection to the agent of the sandbox whose runtime directory is `dir`.
    fn connect(&self, dir: &Path) -> Result<AgentConn>;

    /// Stops every process of the sandbox in place.
    fn pause(&self, dir: &Path) -> Result<()>;

    /// Continues a paused sandbox.
    fn resume(&self, dir: &Path) -> Result<()>;

    /// Captures the full state (processes, memory, files) into the empty directory `dest`;
    /// the sandbox keeps running. Returns the bytes written.
    fn snapshot(&self, dir: &Path, dest: &Path) -> Result<u64>;

    /// Returns the running sandbox in `dir` to the snapshot in `src`, which was taken of this
    /// same sandbox: processes, memory and files. On failure the sandbox is unchanged.
    fn rollback(&self, dir: &Path, src: &Path) -> Result<()>;

    /// Starts a new sandbox from the snapshot in `src`, gives it a fresh identity and returns
    /// what the after-fork hook did.
    fn restore(&self, src: &Path, plan: &SandboxPlan) -> Result<HookReport>;

    /// Captures the sandbox in `dir` into `dest` (as [`Backend::snapshot`]) and starts one child
    /// per plan from it. The snapshot's failure fails the call; each child fails on its own.
    fn fork(&self, dir: &Path, dest: &Path, children: &[SandboxPlan]) -> Result<(u64, Vec<ChildResult>)>;

    /// Stops the sandbox and removes every process, mount and runtime file it had.
    fn destroy(&self, id: &SandboxId, dir: &Path) -> Result<()>;

    /// True when the sandbox's runtime is still there.
    fn is_alive(&self, dir: &Path) -> bool;
}
