//! What the service's operations take and give, in the native API's wire forms (with the
//! schemas the OpenAPI document is generated from). The engine's types stay free of HTTP
//! concerns; the other surfaces (E2B's adapter, the console, pools) convert to and from these.

use crate::db::{OnTimeout, SandboxMeta};
use crate::error::ErrorDetail;
use branchbox_core::SandboxView;
use branchbox_model::{Limits, Sandbox, Snapshot};
use branchbox_protocol::{ExitStatus, FileKind, FileStat};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::{IntoParams, ToSchema};

/// Resource limits of a sandbox.
#[derive(Debug, Serialize, ToSchema)]
pub struct LimitsInfo {
    /// Memory, MiB.
    pub memory_mib: u64,
    /// CPUs.
    pub cpus: u32,
    /// Most processes and threads.
    pub pids: u32,
}

impl From<Limits> for LimitsInfo {
    fn from(l: Limits) -> Self {
        LimitsInfo { memory_mib: l.memory_mib, cpus: l.cpus, pids: l.pids }
    }
}

/// State of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StateName {
    /// Running.
    Running,
    /// Paused (state kept; `connect` resumes it).
    Paused,
    /// Its runtime is gone; only its record remains (kill it to remove the record).
    Lost,
}

impl From<branchbox_model::SandboxState> for StateName {
    fn from(s: branchbox_model::SandboxState) -> Self {
        match s {
            branchbox_model::SandboxState::Running => StateName::Running,
            branchbox_model::SandboxState::Paused => StateName::Paused,
            branchbox_model::SandboxState::Lost => StateName::Lost,
        }
    }
}

/// A sandbox as the service sees it.
#[derive(Debug, Serialize, ToSchema)]
pub struct SandboxInfo {
    /// Its id.
    pub id: String,
    /// Its state now.
    pub state: StateName,
    /// Isolation backend.
    pub backend: String,
    /// The image it runs.
    pub image: String,
    /// Creation time, ms since the epoch.
    pub created_ms: i64,
    /// The snapshot it was restored or forked from.
    pub parent_snapshot: Option<String>,
    /// Its limits.
    pub limits: LimitsInfo,
    /// Labels given at creation.
    pub metadata: BTreeMap<String, String>,
    /// When its timeout fires, ms since the epoch (`null`: none running, e.g. while paused).
    pub expires_ms: Option<i64>,
    /// What the timeout does.
    pub on_timeout: OnTimeout,
    /// Token id of its creator (`null` for sandboxes made outside the service).
    pub created_by: Option<String>,
    /// Why its runtime ended, when it is lost (`memory_limit: ...`, `process_limit: ...`,
    /// `runtime gone`); `null` otherwise.
    pub lost_reason: Option<String>,
    /// The host limit its answers broke, when they did: a sign that something in the sandbox
    /// forged the agent's frames (docs/security.md); `null` otherwise.
    pub flagged: Option<String>,
    /// Step-history mode: every command ends with a checkpoint recording it
    /// (`POST /v1/sandboxes/{id}/history`, `GET /v1/sandboxes/{id}/timeline`).
    pub history: bool,
    /// The fleet node that holds it: given only in a listing through a node with peers
    /// (docs/fleet.md, "Any node answers for the fleet").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

impl SandboxInfo {
    /// Combines the engine's record, the observed liveness and the service's state.
    pub fn new(s: &Sandbox, alive: bool, meta: Option<SandboxMeta>) -> SandboxInfo {
        let state = if alive { s.state.into() } else { StateName::Lost };
        let m = meta.unwrap_or_default();
        let known = !m.created_by.is_empty();
        SandboxInfo {
            id: s.id.to_string(),
            state,
            backend: s.backend.to_string(),
            image: s.image.clone(),
            created_ms: s.created_ms,
            parent_snapshot: s.parent_snapshot.as_ref().map(ToString::to_string),
            limits: s.limits.into(),
            metadata: m.metadata,
            expires_ms: m.expires_ms,
            on_timeout: m.on_timeout,
            created_by: known.then_some(m.created_by),
            lost_reason: None,
            flagged: None,
            history: s.history,
            node: None,
        }
    }

    /// From a listing entry.
    pub fn from_view(v: &SandboxView, meta: Option<SandboxMeta>) -> SandboxInfo {
        let mut info = SandboxInfo::new(&v.sandbox, v.alive, meta);
        if !v.alive {
            info.lost_reason.clone_from(&v.lost_reason);
        }
        info.flagged.clone_from(&v.flagged);
        info
    }
}

/// An immutable snapshot.
#[derive(Debug, Serialize, ToSchema)]
pub struct SnapshotInfo {
    /// Its id.
    pub id: String,
    /// The snapshot its source sandbox came from (the lineage edge).
    pub parent: Option<String>,
    /// The sandbox it was taken of.
    pub source: Option<String>,
    /// Backend that can restore it.
    pub backend: String,
    /// The image its sandbox ran.
    pub image: String,
    /// `snapshot`, `checkpoint` or `fork_point`.
    pub kind: String,
    /// Optional name.
    pub name: Option<String>,
    /// Creation time, ms since the epoch.
    pub created_ms: i64,
    /// Bytes on disk.
    pub size_bytes: u64,
    /// Limits its children inherit.
    pub limits: LimitsInfo,
    /// True when its data was deleted and only its place in the lineage remains.
    pub deleted: bool,
}

impl From<&Snapshot> for SnapshotInfo {
    fn from(s: &Snapshot) -> Self {
        SnapshotInfo {
            id: s.id.to_string(),
            parent: s.parent.as_ref().map(ToString::to_string),
            source: s.source.as_ref().map(ToString::to_string),
            backend: s.backend.to_string(),
            image: s.image.clone(),
            kind: s.kind.as_str().to_string(),
            name: s.name.clone(),
            created_ms: s.created_ms,
            size_bytes: s.size_bytes,
            limits: s.limits.into(),
            deleted: s.deleted_ms.is_some(),
        }
    }
}

/// Backend choice for a new sandbox.
#[derive(Debug, Clone, Copy, Default, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BackendName {
    /// microvm where Linux guests can run, gvisor elsewhere.
    #[default]
    Auto,
    /// gVisor (runsc).
    Gvisor,
    /// branchbox's own KVM microVMs.
    Microvm,
}

/// Creates a sandbox from the default template or from a snapshot.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    /// Template name (`GET /v1/templates`); `default` or `null` is the default image.
    pub template: Option<String>,
    /// Start from this snapshot (id or name) instead of the template.
    pub snapshot_id: Option<String>,
    /// Image: `default` (when absent), `minimal`, or a name given to `branchbox image import`.
    pub image: Option<String>,
    /// Seconds until the timeout fires (default 300).
    pub timeout: Option<f64>,
    /// What the timeout does (default `kill`).
    pub on_timeout: Option<OnTimeout>,
    /// Labels to find it by (at most 64).
    pub metadata: Option<BTreeMap<String, String>>,
    /// Environment for every command run in it (at most 64).
    pub envs: Option<BTreeMap<String, String>>,
    /// Isolation backend.
    pub backend: Option<BackendName>,
    /// Memory limit, MiB (not with `snapshot_id`: a restored sandbox keeps its snapshot's).
    pub memory_mib: Option<u64>,
    /// CPU limit.
    pub cpus: Option<u32>,
    /// Process limit.
    pub pids: Option<u32>,
    /// A network with this egress policy (docs/network.md). Without it, or
    /// `allow_internet_access`, the sandbox has no network.
    pub network: Option<super::network::NetworkPolicy>,
    /// E2B's switch: true is `network` `{"mode": "internet"}`, false `{"mode": "deny_all"}`.
    pub allow_internet_access: Option<bool>,
    /// True: the sandbox's exposed ports answer every local user of the host at its `host`
    /// address; otherwise only root and the service's user reach them there, everyone else
    /// through the proxy with the token (docs/network.md). Needs a network.
    pub open_ports: Option<bool>,
}

/// Reconnects to a sandbox: resumes it when paused and restarts its timeout.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConnectSandbox {
    /// New timeout in seconds (default: the one it had).
    pub timeout: Option<f64>,
}

/// Sets a sandbox's timeout, counted from now.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetTimeout {
    /// Seconds from now; 0 ends the sandbox now (its timeout action, kill or pause, runs within
    /// a second), as E2B's `set_timeout(0)` does.
    pub timeout: f64,
}

/// Turns step-history mode on or off.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetHistory {
    /// When true, every command ends with a checkpoint (returned in its result).
    pub enabled: bool,
}

/// Query of the sandbox listing.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListSandboxes {
    /// Only sandboxes whose metadata has all these pairs, URL-encoded as `k1=v1&k2=v2`.
    pub metadata: Option<String>,
    /// Only sandboxes in this state.
    pub state: Option<StateName>,
}

/// Forks a running sandbox.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkSandbox {
    /// Number of children (default 1).
    pub count: Option<u32>,
}

/// One child of a fork: a sandbox, or why it failed.
#[derive(Debug, Serialize, ToSchema)]
pub struct ForkChild {
    /// True when the child started.
    pub ok: bool,
    /// The child.
    pub sandbox: Option<SandboxInfo>,
    /// Why it did not start.
    pub error: Option<ErrorDetail>,
}

/// Outcome of a fork.
#[derive(Debug, Serialize, ToSchema)]
pub struct ForkResult {
    /// The fork point the children start from.
    pub snapshot: SnapshotInfo,
    /// One entry per child, in order.
    pub children: Vec<ForkChild>,
}

/// Takes a snapshot or checkpoint.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TakeSnapshot {
    /// A unique name to find it by.
    pub name: Option<String>,
}

/// Deletes a snapshot.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeleteSnapshot {
    /// Also delete every snapshot descending from it (otherwise such a snapshot is refused, 409).
    pub cascade: Option<bool>,
}

/// Rolls a sandbox back to one of its checkpoints.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Rollback {
    /// The checkpoint's id or name.
    pub checkpoint: String,
}

/// A command to run.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCommand {
    /// A shell line (`/bin/sh -c`); give this or `argv`.
    pub cmd: Option<String>,
    /// An argument vector (no shell); give this or `cmd`.
    pub argv: Option<Vec<String>>,
    /// Extra environment (over the sandbox's `envs`).
    pub envs: Option<BTreeMap<String, String>>,
    /// Working directory (absolute).
    pub cwd: Option<String>,
    /// Seconds before its whole process group is killed (default 60).
    pub timeout: Option<f64>,
    /// Standard input, as text. For a background process: written first, and its stdin stays
    /// open for `POST .../processes/{pid}/stdin` (give `""` to open it with nothing yet).
    pub stdin: Option<String>,
    /// The image's account to run as (e.g. `user`); its home is then the default cwd. The
    /// agent's (root, cwd `/`) when absent.
    pub user: Option<String>,
}

/// How a command ended, with its output.
#[derive(Debug, Serialize, ToSchema)]
pub struct CommandResult {
    /// Standard output (invalid UTF-8 replaced).
    pub stdout: String,
    /// Standard error (invalid UTF-8 replaced).
    pub stderr: String,
    /// Exit code (`null` when killed by a signal).
    pub exit_code: Option<i32>,
    /// Terminating signal.
    pub signal: Option<i32>,
    /// Killed at its timeout.
    pub timed_out: bool,
    /// Output beyond the cap was dropped.
    pub truncated: bool,
    /// A process of the command was killed at the sandbox's memory limit (docs/limits.md).
    pub oom_killed: bool,
    /// Run time, ms.
    pub duration_ms: u64,
    /// The checkpoint taken after the command in step-history mode.
    pub checkpoint: Option<String>,
}

impl CommandResult {
    /// From collected output.
    pub fn new(stdout: &[u8], stderr: &[u8], s: &ExitStatus) -> CommandResult {
        CommandResult {
            stdout: String::from_utf8_lossy(stdout).into_owned(),
            stderr: String::from_utf8_lossy(stderr).into_owned(),
            exit_code: s.code,
            signal: s.signal,
            timed_out: s.timed_out,
            truncated: s.truncated,
            oom_killed: s.oom_killed,
            duration_ms: s.duration_ms,
            checkpoint: None,
        }
    }
}

/// A background process that started.
#[derive(Debug, Serialize, ToSchema)]
pub struct ProcessStarted {
    /// Its pid inside the sandbox.
    pub pid: i32,
}

/// A background process.
#[derive(Debug, Serialize, ToSchema)]
pub struct ProcessInfo {
    /// Its pid.
    pub pid: i32,
    /// What was started (argv, or `["/bin/sh", "-c", line]`).
    pub argv: Vec<String>,
    /// True until it exits.
    pub running: bool,
    /// Exit code once it exited.
    pub exit_code: Option<i32>,
    /// Terminating signal once it exited.
    pub signal: Option<i32>,
}

/// Sends a signal.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SendSignal {
    /// Signal number (1-64; 15 is TERM, 9 is KILL).
    pub signal: i32,
    /// Signal its whole process group.
    #[serde(default)]
    pub group: bool,
}

/// Waits for a background process.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitProcess {
    /// Give up after this many seconds (default 60).
    pub timeout: Option<f64>,
}

/// Outcome of a wait.
#[derive(Debug, Serialize, ToSchema)]
pub struct WaitResult {
    /// True when the process was still running at the timeout.
    pub running: bool,
    /// Its result once it exited (its output tails).
    pub result: Option<CommandResult>,
}

/// A file or directory in a sandbox.
#[derive(Debug, Serialize, ToSchema)]
pub struct EntryInfo {
    /// Final path component.
    pub name: String,
    /// Full path.
    pub path: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Modification time, ns since the epoch.
    pub mtime_ns: i64,
}

impl EntryInfo {
    /// From the agent's stat, with the full path it lives at.
    pub fn new(s: &FileStat, path: String) -> EntryInfo {
        let kind = match s.kind {
            FileKind::File => "file",
            FileKind::Dir => "dir",
            FileKind::Symlink => "symlink",
            FileKind::Other => "other",
        };
        let name = path.rsplit('/').find(|c| !c.is_empty()).unwrap_or("/").to_string();
        EntryInfo { name, path, kind: kind.into(), size: s.size, mode: s.mode, mtime_ns: s.mtime_ns }
    }
}

/// A path in a sandbox.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PathQuery {
    /// Absolute path.
    pub path: String,
    /// The image's account to act as (e.g. `user`): the call gets what that account's
    /// commands would (root's when absent).
    pub user: Option<String>,
}

/// Where and how to write a file.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WriteQuery {
    /// Absolute path.
    pub path: String,
    /// Permission bits in octal (e.g. `755`); 644 when absent.
    pub mode: Option<String>,
    /// Create missing parent directories (default true).
    pub parents: Option<bool>,
    /// The image's account that writes the file (e.g. `user`): it and the directories made
    /// for it are that account's, and a path the account may not write is refused (root's when
    /// absent).
    pub user: Option<String>,
}

/// What to remove.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RemoveQuery {
    /// Absolute path.
    pub path: String,
    /// Remove a directory tree.
    pub recursive: Option<bool>,
    /// The image's account to act as (e.g. `user`): the call gets what that account's
    /// commands would (root's when absent).
    pub user: Option<String>,
}

/// A file written.
#[derive(Debug, Serialize, ToSchema)]
pub struct Written {
    /// Its path.
    pub path: String,
    /// Bytes written.
    pub size: u64,
}

/// Renames a path.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RenamePath {
    /// Absolute source path.
    pub from: String,
    /// Absolute destination path.
    pub to: String,
    /// The image's account to act as (e.g. `user`): the call gets what that account's
    /// commands would (root's when absent).
    pub user: Option<String>,
}

/// Creates a directory.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MakeDir {
    /// Absolute path.
    pub path: String,
    /// Create missing parents; no error if it exists (default true).
    pub parents: Option<bool>,
    /// The image's account that makes the directories (e.g. `user`): they are its, and a
    /// place the account may not write is refused (root's when absent).
    pub user: Option<String>,
}

/// A snapshot node of the lineage.
#[derive(Debug, Serialize, ToSchema)]
pub struct LineageSnapshot {
    /// Its id.
    pub id: String,
    /// The snapshot its source came from.
    pub parent: Option<String>,
    /// The sandbox it was taken of.
    pub source: Option<String>,
    /// `snapshot`, `checkpoint` or `fork_point`.
    pub kind: String,
    /// Its name.
    pub name: Option<String>,
    /// Creation time, ms since the epoch.
    pub created_ms: i64,
    /// True when its data was deleted.
    pub deleted: bool,
    /// The refs that name it (`/v1/refs`).
    pub refs: Vec<String>,
}

/// A sandbox node of the lineage.
#[derive(Debug, Serialize, ToSchema)]
pub struct LineageSandbox {
    /// Its id.
    pub id: String,
    /// The snapshot it started from.
    pub parent_snapshot: Option<String>,
    /// Its state now.
    pub state: StateName,
}

/// The lineage: snapshots and sandboxes joined by their parent edges.
#[derive(Debug, Serialize, ToSchema)]
pub struct Lineage {
    /// Snapshots, oldest first.
    pub snapshots: Vec<LineageSnapshot>,
    /// Sandboxes, oldest first.
    pub sandboxes: Vec<LineageSandbox>,
}

/// Query of the lineage.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LineageQuery {
    /// Only the part connected to this sandbox (its ancestors and descendants).
    pub sandbox: Option<String>,
}

/// Query of the audit log.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Only records about this sandbox.
    pub sandbox: Option<String>,
    /// Only records of this token id.
    pub who: Option<String>,
    /// Only records after this sequence number (for paging).
    pub after: Option<i64>,
    /// At most this many (1-1000, default 100).
    pub limit: Option<u32>,
}

/// Names of the events of a streamed command.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StreamEventName {
    /// A chunk of standard output.
    Stdout,
    /// A chunk of standard error.
    Stderr,
    /// The command ended (the last event).
    Exit,
    /// The command could not be run or followed (the last event).
    Error,
}

/// One server-sent event of a streamed command.
#[derive(Debug, Serialize, ToSchema)]
pub struct StreamEvent {
    /// Which event.
    pub event: StreamEventName,
    /// JSON: `{"data": base64}` for output, `{exit_code, signal, timed_out, truncated,
    /// oom_killed, duration_ms}` for `exit`, `{"error": {code, message}}` for `error`.
    pub data: String,
}

/// Liveness answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// Always `ok` when the service answers.
    pub status: String,
}
