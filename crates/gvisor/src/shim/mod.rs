//! The per-sandbox shim: a small host process that owns the runsc container's stdio pipes
//! (the agent's transport), multiplexes any number of client connections on a Unix socket
//! onto that one agent, and performs checkpoints that keep the sandbox running.
//!
//! Why a shim: the agent's pipes must outlive each CLI invocation, and runsc re-attaches a
//! restored container to whatever stdio the restoring process holds, so the process that owns
//! the pipes is the one that can swap them when a rollback replaces the container.
//!
//! This file holds how a shim is started ([`ShimConfig`], [`Start`], [`Shell`]) and the state
//! its threads share. `mux` is the client side: the connections on `agent.sock`, the routing
//! of their requests onto the agent's one pipe and of its answers back, and the shim's own
//! requests to the agent. `lifecycle` is the container side: starting a generation,
//! checkpoint, rollback, a shell's restore and wait, and the shim's end.

mod lifecycle;
mod mux;

pub(crate) use lifecycle::is_zombie;
pub use lifecycle::run;

use crate::runsc::Runsc;
use branchbox_protocol::frame::RawFrame;
use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::mpsc::SyncSender;
use std::sync::{Mutex, MutexGuard, RwLock};
use std::time::Duration;

/// How the shim starts its container.
#[derive(Debug, Clone)]
pub enum Start {
    /// `runsc run` of the bundle.
    Fresh,
    /// `runsc restore` from a checkpoint image directory.
    Restore(PathBuf),
    /// `runsc create` only: a shell, a sandbox process with nothing in it yet, waiting for a
    /// [`ShimRequest::ShimRestore`](crate::control::ShimRequest::ShimRestore) (docs/architecture.md,
    /// "Restore shells").
    Shell(Shell),
}

/// A shell's place in the engine's list of ready shells.
#[derive(Debug, Clone)]
pub struct Shell {
    /// The ready marker the shim publishes (renaming `<marker>.starting` to it) once the
    /// container is created; whoever renames it away owns the shell from then on.
    pub marker: PathBuf,
    /// How long the shell waits unclaimed before it removes itself.
    pub idle: Duration,
}

/// Suffix of the marker of a shell still being created (see [`Shell::starting`]).
pub const SHELL_STARTING: &str = ".starting";

impl Shell {
    /// The marker of a shell still being created.
    pub fn starting(marker: &Path) -> PathBuf {
        let mut s = marker.as_os_str().to_owned();
        s.push(SHELL_STARTING);
        PathBuf::from(s)
    }
}

/// What a shell's marker is renamed to by a claim, inside the shell's sandbox directory.
pub const SHELL_CLAIMED: &str = "shell-claimed";

/// Shim configuration (its command line).
#[derive(Debug, Clone)]
pub struct ShimConfig {
    /// Sandbox runtime directory (holds `bundle/`, `agent.sock`, `shim.log`).
    pub dir: PathBuf,
    /// Sandbox id (container ids are `<id>-g<generation>`).
    pub id: String,
    /// runsc invocation.
    pub runsc: Runsc,
    /// How to start.
    pub start: Start,
}

enum Route {
    Client { conn: u64, orig: u64 },
    Internal(SyncSender<RawFrame>),
}

#[derive(Default)]
struct Routes {
    by_gid: HashMap<u64, Route>,
    by_client: HashMap<(u64, u64), u64>,
}

struct Container {
    cid: String,
    generation: u64,
    /// The `runsc run`/`restore` process; `None` once handed to a reaper thread.
    child: Option<Child>,
    stdin: ChildStdin,
}

/// What the shim's threads share: its client side's methods are in `mux`, its container
/// side's in `lifecycle`.
struct Shim {
    cfg: ShimConfig,
    container: Mutex<Container>,
    routes: Mutex<Routes>,
    writers: Mutex<HashMap<u64, Writer>>,
    next_id: AtomicU64,
    /// Forwarding holds it shared; a checkpoint holds it exclusively, so no client frame can
    /// reach the agent between freeze and thaw.
    gate: RwLock<()>,
    swapping: AtomicBool,
    paused: AtomicBool,
    /// False only in a shell that no restore has reached yet: its container runs nothing, so
    /// agent frames are refused instead of waiting in the pipe for whatever comes.
    restored: AtomicBool,
    /// Set by the first [`ShimRequest::ShimRestore`](crate::control::ShimRequest::ShimRestore); a
    /// shell takes one.
    restore_taken: AtomicBool,
    /// Where a shell's marker lives (`None` for a sandbox started any other way).
    shell: Option<Shell>,
    /// A shell's runtime processes ([`lifecycle::runtime_pids`]), niced until its restore.
    shell_pids: Mutex<Vec<i32>>,
}

/// The sending side of one client connection.
struct Writer {
    queue: SyncSender<Vec<u8>>,
    /// Shut down to disconnect a client that stalled.
    socket: UnixStream,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
