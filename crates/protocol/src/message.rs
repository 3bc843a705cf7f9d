//! Typed messages. Requests flow host -> agent, responses agent -> host; both are JSON headers
//! tagged by `op` / `kind`, with bulk bytes in the frame body.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What to run: an argument vector (no shell) or a shell line (`/bin/sh -c`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    /// Executed directly; `argv[0]` is looked up in `PATH`.
    Argv(Vec<String>),
    /// Run by `/bin/sh -c`.
    Shell(String),
}

/// A command to run in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecSpec {
    /// The command.
    pub cmd: Command,
    /// Extra environment variables, added to the agent's base environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory (absolute); `/` when absent.
    #[serde(default)]
    pub cwd: Option<String>,
    /// When true the client streams stdin as `data` frames ended by `eof`; otherwise stdin is
    /// empty.
    #[serde(default)]
    pub stdin: bool,
    /// Wall-clock limit; at expiry the command's whole process group is killed.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Most output bytes (stdout and stderr together) sent back; the rest is discarded and the
    /// result says `truncated`.
    #[serde(default)]
    pub output_cap: Option<u64>,
    /// The image's account to run as (from its `/etc/passwd`); `cwd` then defaults to its home
    /// and `HOME`, `USER` and `LOGNAME` are its. The agent's own (root) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Run on a new pseudo-terminal of this size instead of pipes: the command is a session
    /// leader with the terminal as its controlling tty and as its stdin, stdout and stderr; the
    /// terminal's output comes back as `stdout` frames, the client's `data` frames are typed
    /// into it, and `resize` frames change its size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtySize>,
}

/// The size of a pseudo-terminal in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySize {
    /// Columns, 1 to [`PtySize::MAX`].
    pub cols: u16,
    /// Rows, 1 to [`PtySize::MAX`].
    pub rows: u16,
}

impl PtySize {
    /// Most columns or rows a terminal may have.
    pub const MAX: u16 = 1000;

    /// A size after checking that both sides are between 1 and [`PtySize::MAX`].
    pub fn new(cols: u16, rows: u16) -> Result<PtySize, String> {
        if cols == 0 || rows == 0 || cols > Self::MAX || rows > Self::MAX {
            return Err(format!(
                "a terminal of {cols}x{rows} cells: columns and rows must be between 1 and {}",
                Self::MAX
            ));
        }
        Ok(PtySize { cols, rows })
    }
}

impl ExecSpec {
    /// A spec running `cmd` with defaults for everything else.
    pub fn new(cmd: Command) -> Self {
        ExecSpec {
            cmd,
            env: BTreeMap::new(),
            cwd: None,
            stdin: false,
            timeout_ms: None,
            output_cap: None,
            user: None,
            pty: None,
        }
    }
}

/// The host's contribution after a fork or restore, so that no two sandboxes share identity
/// or randomness. The frame body carries fresh entropy bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AfterFork {
    /// The sandbox's new id.
    pub sandbox_id: String,
    /// New hostname.
    pub hostname: String,
    /// New machine-id (32 lowercase hex digits).
    pub machine_id: String,
    /// Host wall clock, nanoseconds since the Unix epoch.
    pub wall_clock_ns: u64,
}

/// Bytes of fresh entropy the host sends with an [`AfterFork`] (the `thaw` frame's body).
pub const AFTER_FORK_ENTROPY: usize = 64;

impl AfterFork {
    /// A new identity for sandbox `sandbox_id` called `hostname`: a random machine-id and the
    /// host's wall clock now, with [`AFTER_FORK_ENTROPY`] random bytes to send as the frame
    /// body. Built in this one place for every backend and the pool's claim, so that each
    /// child of a snapshot gets its own. Fails only when the host's random source does.
    pub fn fresh(sandbox_id: &str, hostname: &str) -> std::io::Result<(AfterFork, Vec<u8>)> {
        let mut machine = [0u8; 16];
        getrandom::getrandom(&mut machine)?;
        let mut entropy = vec![0u8; AFTER_FORK_ENTROPY];
        getrandom::getrandom(&mut entropy)?;
        let after_fork = AfterFork {
            sandbox_id: sandbox_id.to_string(),
            hostname: hostname.to_string(),
            machine_id: machine.iter().map(|b| format!("{b:02x}")).collect(),
            wall_clock_ns: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0),
        };
        Ok((after_fork, entropy))
    }
}

/// Host -> agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Version handshake.
    Hello {
        /// The host's protocol version.
        version: u32,
    },
    /// Liveness check.
    Ping,
    /// Agent and sandbox facts.
    Info,
    /// Run a command to completion, streaming its output.
    Exec(ExecSpec),
    /// Start a background process.
    Spawn(ExecSpec),
    /// List background processes.
    ListProcs,
    /// Send a signal to a background process (or its whole process group).
    Signal {
        /// Process id returned by `spawn`.
        pid: i32,
        /// Signal number.
        signal: i32,
        /// Signal the process group instead of the process.
        #[serde(default)]
        group: bool,
    },
    /// Wait for a background process to exit; its captured output comes back as
    /// `stdout`/`stderr` frames before the result.
    Wait {
        /// Process id returned by `spawn`.
        pid: i32,
        /// Give up after this long (`timed_out` in the result); forever when absent.
        #[serde(default)]
        timeout_ms: Option<u64>,
    },
    /// Write the body to the stdin of a background process started with `stdin`; with `eof`,
    /// close its stdin afterwards.
    ProcInput {
        /// Process id returned by `spawn`.
        pid: i32,
        /// Close the process's stdin after writing the body.
        #[serde(default)]
        eof: bool,
    },
    /// Stream a background process's output from now on as `stdout`/`stderr` frames, then its
    /// `exited` (at once when it has already ended). An empty `data` frame says the reader is
    /// in place (after the replayed output): everything printed later follows it. Its tails
    /// are still kept for `wait`.
    Attach {
        /// Process id returned by `spawn`.
        pid: i32,
        /// Send the output kept so far first (its last 1 MiB of stdout, then of stderr), with
        /// nothing lost or repeated between that and what follows: a caller that spawns and
        /// then attaches sees all of a short-lived command's output.
        #[serde(default)]
        replay: bool,
    },
    /// Watch a directory: one JSON [`WatchEvent`] per line in `data` frames as files under it
    /// are created, written, removed, renamed or change mode, until the request is cancelled
    /// (then `ok`) or the directory itself goes (then `file_end` with the event count).
    Watch {
        /// Absolute path of a directory.
        path: String,
        /// Watch its subdirectories too (those made later included).
        #[serde(default)]
        recursive: bool,
    },
    /// Read a regular file; data arrives as `data` frames, then `file_end`. Other kinds
    /// (FIFOs, devices, sockets) are refused.
    ReadFile {
        /// Absolute path.
        path: String,
        /// Refuse a file larger than this many bytes.
        #[serde(default)]
        max: Option<u64>,
        /// The image's account to act as (from its `/etc/passwd`): the agent's thread takes its
        /// filesystem ids, so the kernel allows what the account's commands could do and what
        /// is created is the account's. The agent's own (root) when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
    },
    /// Write a file from the `data` frames that follow, ended by `eof`. Replaces the file
    /// atomically unless `append`.
    WriteFile {
        /// Absolute path.
        path: String,
        /// Permission bits; 0o644 when absent.
        #[serde(default)]
        mode: Option<u32>,
        /// Append instead of replacing.
        #[serde(default)]
        append: bool,
        /// Create missing parent directories.
        #[serde(default)]
        parents: bool,
        /// The image's account to act as (from its `/etc/passwd`): the agent's thread takes its
        /// filesystem ids, so the kernel allows what the account's commands could do and what
        /// is created is the account's. The agent's own (root) when absent. Older hosts sent it
        /// as `owner`.
        #[serde(default, alias = "owner", skip_serializing_if = "Option::is_none")]
        user: Option<String>,
    },
    /// List a directory.
    ListDir {
        /// Absolute path.
        path: String,
        /// The image's account to act as (from its `/etc/passwd`): the agent's thread takes its
        /// filesystem ids, so the kernel allows what the account's commands could do and what
        /// is created is the account's. The agent's own (root) when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
    },
    /// Walk a directory tree (without following symlinks), streaming one JSON [`FileStat`] per
    /// line (with full paths) in `data` frames, then `file_end` with the entry count.
    Walk {
        /// Absolute root.
        path: String,
        /// Absolute paths not to descend into (e.g. `/proc`).
        #[serde(default)]
        exclude: Vec<String>,
    },
    /// Stat a path (without following a final symlink).
    Stat {
        /// Absolute path.
        path: String,
        /// The image's account to act as (from its `/etc/passwd`): the agent's thread takes its
        /// filesystem ids, so the kernel allows what the account's commands could do and what
        /// is created is the account's. The agent's own (root) when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
    },
    /// Follow every symbolic link of a path: answers the `stat` of where it leads, its `name`
    /// the absolute path reached (`not_found` when a link leads nowhere).
    Resolve {
        /// Absolute path.
        path: String,
        /// The image's account to act as (as for `stat`); the agent's own (root) when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
    },
    /// Remove a file, or a directory (`recursive` for a non-empty one).
    Remove {
        /// Absolute path.
        path: String,
        /// Remove a directory tree.
        #[serde(default)]
        recursive: bool,
        /// The image's account to act as (from its `/etc/passwd`): the agent's thread takes its
        /// filesystem ids, so the kernel allows what the account's commands could do and what
        /// is created is the account's. The agent's own (root) when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
    },
    /// Rename a path.
    Rename {
        /// Absolute source path.
        from: String,
        /// Absolute destination path.
        to: String,
        /// The image's account to act as (from its `/etc/passwd`): the agent's thread takes its
        /// filesystem ids, so the kernel allows what the account's commands could do and what
        /// is created is the account's. The agent's own (root) when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
    },
    /// Create a directory.
    Mkdir {
        /// Absolute path.
        path: String,
        /// Create missing parents; no error if it exists.
        #[serde(default)]
        parents: bool,
        /// The image's account to act as (from its `/etc/passwd`): the agent's thread takes its
        /// filesystem ids, so the kernel allows what the account's commands could do and what
        /// is created is the account's. The agent's own (root) when absent. Older hosts sent it
        /// as `owner`.
        #[serde(default, alias = "owner", skip_serializing_if = "Option::is_none")]
        user: Option<String>,
    },
    /// Stop every outgoing frame at a frame boundary (before a checkpoint).
    Freeze,
    /// Let outgoing frames flow again, after applying the after-fork hook when given.
    Thaw {
        /// Identity for a forked or restored copy.
        #[serde(default)]
        after_fork: Option<AfterFork>,
    },
    /// Sync the disks and power the Linux VM off (or restart it with `reboot`), after the `ok`.
    /// Only the agent of a microVM does this; elsewhere it is refused.
    Shutdown {
        /// Restart instead of powering off.
        #[serde(default)]
        reboot: bool,
    },
    /// A chunk of a client stream (stdin, file data) for request `id`.
    Data,
    /// End of a client stream for request `id`.
    Eof,
    /// New size of the terminal of request `id` (an `exec` with `pty`); no answer.
    Resize(PtySize),
    /// Stop request `id` (its client went away): the agent stops streaming and kills a
    /// command's process group; the request ends with an `error` that is not routed anywhere.
    Cancel,
}

/// Machine-readable error class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The request was malformed or violated a limit.
    BadRequest,
    /// The peer speaks another protocol version.
    UnsupportedVersion,
    /// No such file, directory or process.
    NotFound,
    /// The path exists already.
    AlreadyExists,
    /// Permission denied.
    PermissionDenied,
    /// The command could not be started.
    SpawnFailed,
    /// Any other operating-system failure.
    Io,
}

/// File type in a [`FileStat`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link.
    Symlink,
    /// Anything else (device, socket, fifo).
    Other,
}

/// Metadata of one path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStat {
    /// Final path component (for listings) or the full path (for `stat`).
    pub name: String,
    /// File type.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Modification time, nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
    /// The owner's name in the guest's `/etc/passwd` (its uid when it has none), from `stat`,
    /// `resolve` and `list_dir`; absent from walks and from older agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The group's name in the guest's `/etc/group` (its gid when it has none), as `owner`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// What happened to a path under a watched directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchKind {
    /// Created (a file, directory or link).
    Create,
    /// Written and closed, or modified.
    Write,
    /// Removed.
    Remove,
    /// Renamed (its old name; the new one is a `create`).
    Rename,
    /// Mode, owner or times changed.
    Chmod,
}

/// One event of a `watch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEvent {
    /// What happened.
    #[serde(rename = "type")]
    pub kind: WatchKind,
    /// The path it happened to (absolute).
    pub name: String,
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitStatus {
    /// Exit code, when it exited normally.
    pub code: Option<i32>,
    /// Terminating signal, when killed.
    pub signal: Option<i32>,
    /// Killed because its timeout expired.
    pub timed_out: bool,
    /// Output beyond the cap was discarded.
    pub truncated: bool,
    /// Wall-clock run time.
    pub duration_ms: u64,
    /// A process of its group was killed because the sandbox reached its memory limit (absent
    /// from older agents, hence the default).
    #[serde(default)]
    pub oom_killed: bool,
}

/// One background process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcInfo {
    /// Process id.
    pub pid: i32,
    /// What was started.
    pub cmd: Command,
    /// Exit status, once it has exited.
    pub exit: Option<ExitStatus>,
}

/// Outcome of one step of the after-fork hook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "status", content = "detail")]
pub enum StepOutcome {
    /// Done.
    Applied,
    /// The sandbox kernel does not offer this; the reason says why that is safe or not.
    Unsupported(String),
    /// Tried and failed.
    Failed(String),
}

/// What the after-fork hook did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookReport {
    /// Entropy added to the kernel pool and the CRNG reseeded.
    pub entropy: StepOutcome,
    /// Wall clock set.
    pub clock: StepOutcome,
    /// Hostname set.
    pub hostname: StepOutcome,
    /// `/etc/machine-id` written.
    pub machine_id: StepOutcome,
    /// Time the hook took, microseconds.
    pub duration_us: u64,
}

/// Facts the agent reports about itself and its sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentInfo {
    /// Sandbox id as last set by the host (empty before the first after-fork hook).
    pub sandbox_id: String,
    /// Current hostname.
    pub hostname: String,
    /// The agent's own pid.
    pub pid: i32,
    /// The agent's build version.
    pub agent_version: String,
    /// Protocol version.
    pub protocol_version: u32,
    /// Kernel name and release as the sandbox sees them.
    pub kernel: String,
}

/// Agent -> host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Response {
    /// Handshake accepted.
    Hello {
        /// The agent's protocol version.
        version: u32,
        /// The agent's build version.
        agent_version: String,
    },
    /// Answer to `ping`.
    Pong {
        /// Milliseconds since the agent started (continues across restores).
        uptime_ms: u64,
    },
    /// Answer to `info`.
    Info(AgentInfo),
    /// A chunk of a command's standard output (body).
    Stdout,
    /// A chunk of a command's standard error (body).
    Stderr,
    /// A chunk of file data (body).
    Data,
    /// A command or background process ended.
    Exited(ExitStatus),
    /// A background process started.
    Spawned {
        /// Its process id.
        pid: i32,
    },
    /// Background processes.
    Procs {
        /// One entry per process started with `spawn`.
        procs: Vec<ProcInfo>,
    },
    /// A `wait` gave up before the process exited.
    StillRunning,
    /// End of a file read.
    FileEnd {
        /// Bytes sent.
        size: u64,
    },
    /// A file write completed.
    Written {
        /// Bytes written.
        size: u64,
    },
    /// Directory listing.
    Entries {
        /// Entries, sorted by name.
        entries: Vec<FileStat>,
        /// True when the listing was cut at the entry limit.
        truncated: bool,
    },
    /// Metadata of one path.
    Stat(FileStat),
    /// The request succeeded with nothing to report.
    Ok,
    /// Outgoing frames are now held (answer to `freeze`).
    Frozen,
    /// Outgoing frames flow again (answer to `thaw`).
    Thawed {
        /// What the after-fork hook did, when one was given.
        hook: Option<HookReport>,
    },
    /// The request failed.
    Error {
        /// Error class.
        code: ErrorCode,
        /// Human-readable message.
        message: String,
    },
}

impl Response {
    /// True when this response ends its request (no more frames follow for that id).
    pub fn is_terminal(&self) -> bool {
        !matches!(self, Response::Stdout | Response::Stderr | Response::Data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now_ns() -> u64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    }

    #[test]
    fn an_older_hosts_owner_is_the_account_a_write_or_mkdir_acts_as() {
        let w: Request = serde_json::from_str(r#"{"op":"write_file","path":"/f","owner":"user"}"#).unwrap();
        assert!(matches!(w, Request::WriteFile { user: Some(u), .. } if u == "user"));
        let m: Request = serde_json::from_str(r#"{"op":"mkdir","path":"/d","owner":"user"}"#).unwrap();
        assert!(matches!(m, Request::Mkdir { user: Some(u), .. } if u == "user"));
        // Sent as `user`, and not at all when absent, so older agents parse it as before.
        let r = Request::Stat { path: "/".into(), user: None };
        assert_eq!(serde_json::to_string(&r).unwrap(), r#"{"op":"stat","path":"/"}"#);
    }

    #[test]
    fn a_fresh_identity_carries_the_given_names_and_new_randomness_each_call() {
        let before = now_ns();
        let (a, seed_a) = AfterFork::fresh("sbx-0123456789abcdef", "bb-01234567").unwrap();
        let (b, seed_b) = AfterFork::fresh("sbx-0123456789abcdef", "bb-01234567").unwrap();
        let after = now_ns();
        assert_eq!(a.sandbox_id, "sbx-0123456789abcdef");
        assert_eq!(a.hostname, "bb-01234567");
        for id in [&a.machine_id, &b.machine_id] {
            assert_eq!(id.len(), 32, "{id}");
            assert!(id.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)), "{id}");
        }
        assert_eq!((seed_a.len(), seed_b.len()), (AFTER_FORK_ENTROPY, AFTER_FORK_ENTROPY));
        assert_ne!(seed_a, seed_b, "two identities shared their entropy");
        assert_ne!(a.machine_id, b.machine_id, "two identities shared a machine-id");
        assert!((before..=after).contains(&a.wall_clock_ns), "the clock is the host's now");
    }
}
