//! The backend contract: everything a way of isolating sandboxes must do. The core drives
//! backends only through this trait; the conformance tests check each backend against it.

use crate::sandbox::{BackendKind, Limits};
use crate::{Result, SandboxId};
use branchbox_protocol::{AgentClient, HookReport};
use serde::Serialize;
use std::collections::BTreeSet;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

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

    /// Its restore shells, for a backend that has them (docs/architecture.md, "Restore
    /// shells"); `None` by default.
    fn shells(&self) -> Option<&dyn RestoreShells> {
        None
    }
}

/// A restore shell as [`RestoreShells::list`] gives it.
#[derive(Debug, Clone, Serialize)]
pub struct ShellInfo {
    /// The id of the child it will become.
    pub id: SandboxId,
    /// The kind of sandbox whose forks it takes (its image's root filesystem and limits).
    pub key: String,
    /// Whether it is ready to be claimed (else still starting).
    pub ready: bool,
}

/// Which restore shells [`RestoreShells::end`] ends besides those whose runtime is gone or
/// that never became ready.
#[derive(Debug, Clone, Copy)]
pub enum ShellsToEnd<'a> {
    /// Every one.
    All,
    /// Only the stale ones.
    Stale,
    /// Every shell of a key not in `needed` that no sandbox has needed for `idle`; the keys
    /// in `needed` count as needed now.
    Unneeded {
        /// The keys some live sandbox's forks would take.
        needed: &'a BTreeSet<String>,
        /// How long a key goes unneeded before its shells end.
        idle: Duration,
    },
}

/// An optional capability of a backend: restore shells, sandboxes started ahead with nothing in
/// them, each already holding the id and runtime directory of the child it will become, so
/// that a fork only loads each child's state into one. A shell is made for one kind of sandbox
/// (its key). [`Backend::fork`] restores a child into the shell claimed for its plan.
pub trait RestoreShells: Send + Sync {
    /// The key of the shells that can take children of sandboxes with `rootfs` and `limits`.
    fn key(&self, rootfs: &Path, limits: &Limits) -> String;

    /// Starts one shell of `key` that will become the sandbox of `plan` and ends itself after
    /// `idle` unclaimed; returns without waiting for it to be ready. On failure nothing of it
    /// is left.
    fn start(&self, key: &str, plan: &SandboxPlan, idle: Duration) -> Result<()>;

    /// Every shell, ready or starting.
    fn list(&self) -> Vec<ShellInfo>;

    /// Claims up to `n` ready shells of `key` and returns their ids; no two claims, in any
    /// process, get the same shell.
    fn claim(&self, key: &str, n: usize) -> Vec<SandboxId>;

    /// The host memory a shell uses, where the host says.
    fn memory_bytes(&self, id: &SandboxId) -> Option<u64>;

    /// Ends the shells `which` names: each is taken first, so no claim gets it meanwhile, and
    /// then `reap` stops its runtime and removes its directory. Returns the ids ended.
    fn end(&self, which: ShellsToEnd<'_>, reap: &dyn Fn(&SandboxId) -> Result<()>) -> Vec<SandboxId>;
}
