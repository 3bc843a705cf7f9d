//! [`Backend`] for gVisor.

use crate::control::{self, ShimRequest};
use crate::runsc::Runsc;
use crate::shells::ShellStore;
use crate::shim::{is_zombie, Shell, Start, SHELL_CLAIMED};
use branchbox_model::{
    AgentConn, Backend, BackendKind, ChildResult, Error, Limits, RestoreShells, Result, SandboxId,
    SandboxPlan, ShellInfo, ShellsToEnd,
};
use branchbox_net::Egress;
use branchbox_protocol::{AgentClient, HookReport};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Longest a sandbox may take to start or restore.
const START_TIMEOUT: Duration = Duration::from_secs(90);
/// Children restored at once during a fork (each restore is mostly one runsc process).
const RESTORE_PARALLELISM: usize = 4;
/// Unix socket paths must fit `sockaddr_un` (108 bytes with the terminator).
const MAX_SOCKET_PATH: usize = 107;
/// The most of one of the guest's `/proc/net/tcp` tables read before a checkpoint (about
/// 150 bytes a socket; `branchbox_net::conns` reads at most 8,192 lines of it).
const MAX_TCP_TABLE_BYTES: u64 = 4 << 20;

/// The gvisor backend.
#[derive(Debug, Clone)]
pub struct GvisorBackend {
    runsc: Runsc,
    shim: PathBuf,
    /// Its restore shells, where they are kept ([`GvisorBackend::with_shells`]).
    shells: Option<Box<GvisorShells>>,
}

fn socket(dir: &Path) -> PathBuf {
    dir.join("agent.sock")
}

fn log_tail(dir: &Path) -> String {
    // The shim rotates its log (see `shimlog`): the last lines may begin in the older file.
    let log = dir.join(crate::shimlog::LOG_NAME);
    let mut bytes = std::fs::read(crate::shimlog::older(&log)).unwrap_or_default();
    bytes.extend(std::fs::read(&log).unwrap_or_default());
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(4)..].join(" / ")
}

impl GvisorBackend {
    /// A backend using `runsc` with state under `runsc_root`, and the shim executable `shim`.
    pub fn new(runsc: PathBuf, runsc_root: PathBuf, shim: PathBuf) -> Self {
        GvisorBackend { runsc: Runsc::new(runsc, runsc_root), shim, shells: None }
    }

    /// This backend with restore shells (docs/architecture.md, "Restore shells"): their
    /// markers under `root`, each shell's runtime directory under `sandboxes`, the directory
    /// that holds the runtime directories of the plans it is given.
    pub fn with_shells(mut self, root: PathBuf, sandboxes: PathBuf) -> Self {
        let store = ShellStore::new(root, sandboxes);
        self.shells = Some(Box::new(GvisorShells { backend: self.clone(), store }));
        self
    }

    /// How this backend invokes runsc.
    pub(crate) fn runsc(&self) -> &Runsc {
        &self.runsc
    }

    /// The runsc version line, or why runsc cannot be used (missing, or older than
    /// [`crate::version::OLDEST`]).
    pub fn check(&self) -> Result<String> {
        if !self.shim.is_file() {
            return Err(Error::Unavailable(format!(
                "the shim executable {} is missing; build the workspace (`cargo build --release`)",
                self.shim.display()
            )));
        }
        self.runsc.check()
    }

    /// Starts a shim for `plan` and waits until its socket answers; with `network`, in a
    /// network of its own with that policy.
    fn start_shim(&self, plan: &SandboxPlan, restore: Option<&Path>, network: Option<&Egress>) -> Result<()> {
        let start = restore.map_or(Start::Fresh, |image| Start::Restore(image.to_path_buf()));
        let mut child = self.spawn_shim(plan, &start, network)?;
        let sock = socket(&plan.dir);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if UnixStream::connect(&sock).is_ok() {
                // Reap the shim when it ends, so a long-lived caller collects no zombies.
                std::thread::spawn(move || child.wait());
                return Ok(());
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(Error::Backend(format!(
                    "the sandbox failed to start ({status}): {}",
                    log_tail(&plan.dir)
                )));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return Err(Error::Backend(format!(
                    "the sandbox did not start within {}s: {}",
                    START_TIMEOUT.as_secs(),
                    log_tail(&plan.dir)
                )));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Starts a restore shell for `plan` (docs/architecture.md, "Restore shells") and returns
    /// without waiting: its shim creates the container and then renames `<marker>.starting`,
    /// which the caller made, to `marker`; a shell that fails removes `<marker>.starting`.
    /// Unclaimed, it ends itself after `idle`. Networks are not prepared in shells.
    pub(crate) fn start_shell(&self, plan: &SandboxPlan, marker: &Path, idle: Duration) -> Result<()> {
        let shell = Start::Shell(Shell { marker: marker.to_path_buf(), idle });
        let mut child = self.spawn_shim(plan, &shell, None)?;
        std::thread::spawn(move || child.wait());
        Ok(())
    }

    /// Restores the snapshot in `src` into the shell a claim gave `plan` (its directory holds
    /// [`SHELL_CLAIMED`]).
    fn restore_into_shell(&self, src: &Path, plan: &SandboxPlan) -> Result<()> {
        let image = checkpoint_image(src)?.canonicalize().map_err(|e| Error::io(src, e))?;
        let req = ShimRequest::ShimRestore { image: image.display().to_string() };
        control::call_within(&socket(&plan.dir), &req, Some(START_TIMEOUT))
    }

    /// Writes `plan`'s bundle and starts its shim; the shim's socket is not up yet.
    fn spawn_shim(&self, plan: &SandboxPlan, start: &Start, network: Option<&Egress>) -> Result<Child> {
        self.runsc.check()?;
        let sock = socket(&plan.dir);
        if sock.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(Error::InvalidInput(format!(
                "the data directory path is too long for a Unix socket ({}); choose a shorter --data-dir",
                sock.display()
            )));
        }
        std::fs::create_dir_all(&plan.dir).map_err(|e| Error::io(&plan.dir, e))?;
        std::fs::create_dir_all(&self.runsc.root).map_err(|e| Error::io(&self.runsc.root, e))?;
        let cgroup = format!("/branchbox/{}", plan.id);
        let net = match network {
            Some(egress) => Some(crate::network::attach(plan.id.as_str(), &plan.dir, egress)?),
            None => None,
        };
        let bundle_net =
            net.as_ref().map(|n| crate::bundle::Network { netns: &n.netns, resolv_conf: &n.resolv_conf });
        crate::bundle::write(
            &plan.dir.join("bundle"),
            &plan.rootfs,
            &plan.hostname,
            &plan.limits,
            &cgroup,
            bundle_net,
        )?;
        let log_path = plan.dir.join("shim.log");
        let log = std::fs::File::create(&log_path).map_err(|e| Error::io(&log_path, e))?;
        let mut cmd = Command::new(&self.shim);
        cmd.arg("--dir")
            .arg(&plan.dir)
            .arg("--id")
            .arg(plan.id.as_str())
            .arg("--runsc")
            .arg(&self.runsc.bin)
            .arg("--runsc-root")
            .arg(&self.runsc.root);
        match start {
            Start::Fresh => {}
            Start::Restore(image) => {
                cmd.arg("--restore").arg(image);
            }
            Start::Shell(shell) => {
                let idle = shell.idle.as_secs().max(1).to_string();
                cmd.arg("--shell").arg(&shell.marker).arg("--shell-idle-s").arg(idle);
            }
        }
        if net.is_some() {
            cmd.arg("--network");
        }
        // Its own process group: the shim outlives the command that started it.
        let mut child =
            cmd.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .process_group(0)
                .spawn()
                .map_err(|e| Error::Unavailable(format!("cannot start {}: {e}", self.shim.display())))?;
        let pid_path = plan.dir.join("shim.pid");
        if let Err(e) = std::fs::write(&pid_path, child.id().to_string()) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Error::io(&pid_path, e));
        }
        Ok(child)
    }

    /// Refuses, before anything pauses, to checkpoint a networked sandbox whose guest holds a
    /// TCP connection leaving it: runsc saves one only by aborting it, in the running source
    /// too (`--net-disconnect-ok`, see `runsc`). Closed ones still in `TIME_WAIT`, listening
    /// sockets and loopback connections are saved whole and never block. A connection opened
    /// between this look and the checkpoint (milliseconds) is aborted (docs/network.md).
    fn refuse_open_connections(&self, dir: &Path) -> Result<()> {
        let mut agent = self.connect(dir)?;
        let mut open = Vec::new();
        for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
            let bytes = agent.read_file_bytes(table, MAX_TCP_TABLE_BYTES).map_err(|e| {
                Error::Backend(format!("cannot read the guest's {table} to look for open connections: {e}"))
            })?;
            open.extend(branchbox_net::conns::leaving(&String::from_utf8_lossy(&bytes)));
        }
        if open.is_empty() {
            return Ok(());
        }
        let shown: Vec<String> = open.iter().take(4).map(|c| c.to_string()).collect();
        let more = if open.len() > shown.len() {
            format!(" and {} more", open.len() - shown.len())
        } else {
            String::new()
        };
        Err(Error::Conflict(format!(
            "the sandbox holds {} open TCP connection(s) leaving it: {}{more}; runsc 20240729 can checkpoint it only by aborting them, in this sandbox too, so nothing was paused or saved: close them (connections closed since are no obstacle) and retry (docs/network.md)",
            open.len(),
            shown.join(", ")
        )))
    }

    /// Checkpoints the sandbox in `dir` into `dest`; the sandbox runs on.
    fn checkpoint(&self, dir: &Path, dest: &Path) -> Result<u64> {
        if crate::network::recorded(dir)?.is_some() {
            self.refuse_open_connections(dir)?;
        }
        let image = dest.join("checkpoint");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&image)
            .map_err(|e| Error::io(&image, e))?;
        let image = image.canonicalize().map_err(|e| Error::io(&image, e))?;
        control::call(&socket(dir), &ShimRequest::ShimCheckpoint { image: image.display().to_string() })?;
        crate::network::carry(dir, dest)?;
        restrict_tree(dest).map_err(|e| Error::io(dest, e))?;
        Ok(dir_size(dest))
    }

    /// Stops everything sandbox `id` (directory `dir`) runs: its shim, every runsc container
    /// of its generations, its host cgroups. The directory and the network stay.
    fn stop_runtime(&self, id: &SandboxId, dir: &Path) {
        let _ = control::call(&socket(dir), &ShimRequest::ShimStop);
        for cid in self.runsc.list(&format!("{id}-")) {
            self.runsc.destroy(&cid);
        }
        if let Some(pid) =
            std::fs::read_to_string(dir.join("shim.pid")).ok().and_then(|s| s.trim().parse::<i32>().ok())
        {
            let deadline = Instant::now() + Duration::from_secs(5);
            // SAFETY: kill(pid, 0) only probes for existence.
            while unsafe { libc::kill(pid, 0) } == 0 && Instant::now() < deadline {
                if is_zombie(pid) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            if !is_zombie(pid) && is_our_shim(pid, id) {
                // SAFETY: the shim we started for this sandbox; it should be gone already.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        crate::hostcg::remove_all(id.as_str());
    }

    /// Stops every process of sandbox `id`, which has no record (reconciliation, gc), and
    /// removes its directory `dir`. The shim goes first, so it starts nothing more; runsc
    /// processes it had started but runsc had not yet registered are killed by command line,
    /// and what runsc registered meanwhile is destroyed.
    pub fn reap(&self, id: &SandboxId, dir: &Path) -> Result<()> {
        crate::reap::kill_runtime(id, true);
        self.destroy(id, dir)?;
        if crate::reap::kill_runtime(id, false) > 0 {
            self.destroy(id, dir)?;
        }
        Ok(())
    }

    fn thaw_child(&self, plan: &SandboxPlan) -> Result<HookReport> {
        let mut conn = self.connect(&plan.dir)?;
        conn.after_fork(plan.id.as_str(), &plan.hostname).map_err(|e| {
            Error::Backend(format!("the restored sandbox did not wake up: {e}; {}", log_tail(&plan.dir)))
        })
    }
}

/// The runsc image directory of the snapshot in `src`, checked to hold a checkpoint.
fn checkpoint_image(src: &Path) -> Result<PathBuf> {
    let image = src.join("checkpoint");
    if !image.join("checkpoint.img").is_file() {
        return Err(Error::Backend(format!(
            "snapshot data is missing at {}; the snapshot cannot be restored",
            image.display()
        )));
    }
    Ok(image)
}

/// Makes everything under `dir` owner-only (directories 0700, files 0600): runsc writes the
/// image with modes of its own, and the image holds the sandbox's memory and files. Symlinks
/// are left alone, not followed.
fn restrict_tree(dir: &Path) -> std::io::Result<()> {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            restrict_tree(&entry.path())?;
        } else if kind.is_file() {
            std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o600))?;
        }
    }
    Ok(())
}

/// Bytes used by the files under `dir`.
fn dir_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_size(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

impl Backend for GvisorBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Gvisor
    }

    fn create(&self, plan: &SandboxPlan) -> Result<()> {
        self.start_shim(plan, None, plan.network.as_ref())
    }

    fn connect(&self, dir: &Path) -> Result<AgentConn> {
        let stream = UnixStream::connect(socket(dir)).map_err(|e| {
            Error::Backend(format!(
                "the sandbox is not reachable ({e}); it may have stopped: check `branchbox ls`"
            ))
        })?;
        Ok(AgentClient::new(stream))
    }

    fn pause(&self, dir: &Path) -> Result<()> {
        control::call(&socket(dir), &ShimRequest::ShimPause)
    }

    fn resume(&self, dir: &Path) -> Result<()> {
        control::call(&socket(dir), &ShimRequest::ShimResume)
    }

    fn snapshot(&self, dir: &Path, dest: &Path) -> Result<u64> {
        self.checkpoint(dir, dest)
    }

    fn rollback(&self, dir: &Path, src: &Path) -> Result<()> {
        let image = checkpoint_image(src)?;
        let image = image.canonicalize().map_err(|e| Error::io(&image, e))?;
        control::call(&socket(dir), &ShimRequest::ShimRollback { image: image.display().to_string() })
    }

    fn restore(&self, src: &Path, plan: &SandboxPlan) -> Result<HookReport> {
        let image = checkpoint_image(src)?;
        // The checkpoint's network, not the plan's: runsc restores a netstack only into a
        // network like the one it was saved with.
        let network = crate::network::recorded(src)?;
        let shelled = network.is_none()
            && plan.dir.join(SHELL_CLAIMED).is_file()
            && match self.restore_into_shell(src, plan) {
                Ok(()) => true,
                Err(e) => {
                    // A shell that died or refused: this child starts the usual way instead.
                    eprintln!(
                        "branchbox: the restore shell of {} failed ({e}); restoring without it",
                        plan.id
                    );
                    // Its directory stays: it holds the child's intent (for crash recovery).
                    self.stop_runtime(&plan.id, &plan.dir);
                    false
                }
            };
        if !shelled {
            self.start_shim(plan, Some(&image), network.as_ref())?;
        }
        match self.thaw_child(plan) {
            Ok(report) => Ok(report),
            Err(e) => {
                let _ = self.destroy(&plan.id, &plan.dir);
                Err(e)
            }
        }
    }

    fn fork(&self, dir: &Path, dest: &Path, children: &[SandboxPlan]) -> Result<(u64, Vec<ChildResult>)> {
        let size = self.checkpoint(dir, dest)?;
        // A few workers take the children in order, each the next as soon as its last is up,
        // so one slow restore holds back only itself.
        let next = AtomicUsize::new(0);
        let results: Vec<Mutex<Option<ChildResult>>> = children.iter().map(|_| Mutex::new(None)).collect();
        std::thread::scope(|s| {
            for _ in 0..RESTORE_PARALLELISM.min(children.len()) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(plan) = children.get(i) else { return };
                    let r = self.restore(dest, plan);
                    *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
                });
            }
        });
        Ok((
            size,
            results
                .into_iter()
                .map(|r| {
                    r.into_inner().unwrap_or_else(|e| e.into_inner()).unwrap_or_else(|| {
                        Err(Error::Backend("the restore of this child did not finish".into()))
                    })
                })
                .collect(),
        ))
    }

    fn destroy(&self, id: &SandboxId, dir: &Path) -> Result<()> {
        self.stop_runtime(id, dir);
        // After runsc is gone; by id, so a sandbox whose directory is gone is cleaned too.
        let network = crate::network::detach(id.as_str());
        match std::fs::remove_dir_all(dir) {
            Ok(()) => network,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => network,
            Err(e) => Err(Error::io(dir, e)),
        }
    }

    fn is_alive(&self, dir: &Path) -> bool {
        UnixStream::connect(socket(dir)).is_ok()
    }

    fn shells(&self) -> Option<&dyn RestoreShells> {
        self.shells.as_deref().map(|s| s as &dyn RestoreShells)
    }
}

/// The gvisor backend's restore shells ([`GvisorBackend::with_shells`]): kept in a
/// [`ShellStore`], started as shims in shell mode (`GvisorBackend::start_shell`).
#[derive(Debug, Clone)]
pub struct GvisorShells {
    backend: GvisorBackend,
    store: ShellStore,
}

impl RestoreShells for GvisorShells {
    fn key(&self, rootfs: &Path, limits: &Limits) -> String {
        crate::shells::key(rootfs, limits)
    }

    fn start(&self, key: &str, plan: &SandboxPlan, idle: Duration) -> Result<()> {
        self.store.start(key, plan, |marker| self.backend.start_shell(plan, marker, idle))
    }

    fn list(&self) -> Vec<ShellInfo> {
        self.store.list()
    }

    fn claim(&self, key: &str, n: usize) -> Vec<SandboxId> {
        self.store.claim(key, n)
    }

    fn memory_bytes(&self, id: &SandboxId) -> Option<u64> {
        crate::hostcg::memory_bytes(&format!("{id}-g1"))
    }

    fn end(&self, which: ShellsToEnd<'_>, reap: &dyn Fn(&SandboxId) -> Result<()>) -> Vec<SandboxId> {
        self.store.end(which, &|dir| self.backend.is_alive(dir), reap)
    }
}

/// True when `pid` is still the shim of sandbox `id` (pids are reused; never signal a stranger).
fn is_our_shim(pid: i32, id: &SandboxId) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            let text = String::from_utf8_lossy(&c);
            text.contains("branchbox-shim") && text.contains(id.as_str())
        })
        .unwrap_or(false)
}
