//! The shim's container side: starting each container generation (`runsc run`, `restore` or,
//! for a shell, `create`) with the agent's pipes, the control requests (checkpoint, rollback,
//! a shell's restore, pause, resume, stop), a shell's wait for its claim, and the shim's end.

use super::{lock, Container, Routes, Shell, Shim, ShimConfig, Start};
use crate::control::{ShimRequest, ShimResponse};
use branchbox_protocol::{Request, PROTOCOL_VERSION};
use std::collections::HashMap;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Niceness of a shell's runtime processes until a restore claims them: shells are made ahead
/// of time and must not take CPU from running sandboxes (first of all the children of the
/// fork that asked for them). The restore puts them back to 0 first.
const SHELL_NICE: libc::c_int = 10;

/// What a shell renames its own marker to when it expires unclaimed.
const SHELL_EXPIRED: &str = "shell-expired";

/// Sets the niceness of every thread of process `pid` (niceness is per thread on Linux).
fn renice(pid: i32, nice: libc::c_int) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return };
    for tid in tasks.flatten().filter_map(|t| t.file_name().to_str()?.parse::<libc::id_t>().ok()) {
        // SAFETY: setpriority(2) on a thread of the shell's own runtime.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) };
    }
}

/// The processes of a created container's runtime: its sandbox process `sandbox` with every
/// descendant (ptrace's stub processes: guest processes later run in stubs forked from them),
/// and the gofer serving it, found by its command line, which names the generation's bundle.
fn runtime_pids(cid: &str, sandbox: i32) -> Vec<i32> {
    let bundle = format!("/bundle-{cid}");
    let mut parents = Vec::new();
    let mut gofer = None;
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let ppid = std::fs::read_to_string(e.path().join("stat")).ok().and_then(|stat| {
            // `pid (comm) state ppid ...`; comm may hold anything, so read after its last ')'.
            stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse::<i32>().ok()
        });
        if let Some(ppid) = ppid {
            parents.push((pid, ppid));
        }
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else { continue };
        let mut args = cmd.split(|b| *b == 0);
        let is_gofer = args.next().and_then(|p| p.rsplit(|b| *b == b'/').next()) == Some(b"runsc-gofer");
        if is_gofer && args.any(|a| a.starts_with(b"--bundle=") && a.ends_with(bundle.as_bytes())) {
            gofer = Some(pid);
        }
    }
    let mut pids = vec![sandbox];
    let mut i = 0;
    while i < pids.len() {
        let parent = pids[i];
        pids.extend(parents.iter().filter(|(_, pp)| *pp == parent).map(|(p, _)| *p));
        i += 1;
    }
    pids.extend(gofer);
    pids
}

/// The bundle of one container generation: the sandbox's bundle with a cgroup of its own. Two
/// generations are alive at once during a rollback, and a shared cgroup makes runsc wait for
/// the other's processes when it removes the retired one.
fn generation_bundle(cfg: &ShimConfig, cid: &str) -> std::io::Result<PathBuf> {
    let base = cfg.dir.join("bundle").join("config.json");
    let mut spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&base)?)?;
    if let Some(linux) = spec.get_mut("linux").and_then(|l| l.as_object_mut()) {
        linux.insert("cgroupsPath".into(), format!("/branchbox/{cid}").into());
    }
    if let Err(e) = crate::hostcg::prepare(cid, &spec) {
        // runsc then creates (and removes) the cgroups itself; only the reason is lost.
        eprintln!(
            "branchbox-shim: cannot create the host cgroups of {cid} ({e}); why it ends will not be known"
        );
        crate::hostcg::remove(cid);
    }
    let dir = cfg.dir.join(format!("bundle-{cid}"));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&spec)?)?;
    Ok(dir)
}

/// Starts container generation `generation` as `start` says, with pipes for the agent's
/// stdio: a created container (a shell) keeps those of `runsc create`, and a restore into it
/// later inherits them.
fn spawn_container(
    cfg: &ShimConfig,
    generation: u64,
    start: &Start,
) -> std::io::Result<(Container, ChildStdout)> {
    let cid = format!("{}-g{generation}", cfg.id);
    let bundle = generation_bundle(cfg, &cid)?;
    let mut cmd: Command = cfg.runsc.start_command();
    match start {
        Start::Restore(image) => cmd.arg("restore").arg("--image-path").arg(image),
        Start::Fresh => cmd.arg("run"),
        Start::Shell(_) => cmd.arg("create"),
    };
    cmd.arg("--bundle").arg(&bundle).arg(&cid);
    let create = matches!(start, Start::Shell(_));
    if create {
        // SAFETY: setpriority(2) on the child itself, between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::setpriority(libc::PRIO_PROCESS, 0, SHELL_NICE);
                Ok(())
            });
        }
    }
    // Standard error is the shim's own: a pipe into the capped log (see `shimlog`).
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn()?;
    let stdin = child.stdin.take().ok_or_else(|| std::io::Error::other("no stdin pipe"))?;
    let stdout = child.stdout.take().ok_or_else(|| std::io::Error::other("no stdout pipe"))?;
    if create {
        let status = child.wait()?;
        if !status.success() {
            return Err(std::io::Error::other(format!("runsc create failed ({status})")));
        }
        return Ok((Container { cid, generation, child: None, stdin }, stdout));
    }
    Ok((Container { cid, generation, child: Some(child), stdin }, stdout))
}

/// Exits the shim with `code` shortly, so that the answer being sent reaches the caller,
/// which waits for it.
fn exit_after_answer(code: i32) {
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        crate::shimlog::flush();
        std::process::exit(code);
    });
}

impl Shim {
    /// Stops a container the shim started. Its `runsc run` process lingers for seconds after
    /// the container is gone, so it is reaped on a thread of its own instead of waited for.
    fn retire(&self, c: &mut Container) {
        self.retire_parts(&c.cid, c.child.take());
    }

    /// [`Shim::retire`] of container `cid` whose `runsc` process is `child`.
    fn retire_parts(&self, cid: &str, child: Option<Child>) {
        self.cfg.runsc.destroy(cid);
        let _ = std::fs::remove_dir_all(self.cfg.dir.join(format!("bundle-{cid}")));
        if let Some(mut child) = child {
            std::thread::spawn(move || child.wait());
        }
        let cid = cid.to_string();
        std::thread::spawn(move || crate::hostcg::remove(&cid));
    }

    /// After the agent's pipe of container `generation` closed: when that is the current
    /// container and no swap is under way, the sandbox ended, so the shim records why and ends.
    pub(super) fn agent_pipe_closed(&self, generation: u64) {
        let current = lock(&self.container).generation == generation;
        if current && !self.swapping.load(Ordering::SeqCst) {
            let ended = crate::hostcg::verdict(&lock(&self.container).cid);
            if let Err(e) = crate::hostcg::record(&self.cfg.dir, &ended) {
                eprintln!("branchbox-shim: cannot record why the sandbox ended: {e}");
            }
            eprintln!(
                "branchbox-shim: the sandbox ended ({}): {}; shutting down",
                ended.reason, ended.detail
            );
            self.shutdown(0);
        }
    }

    fn shutdown(&self, code: i32) -> ! {
        if let Some(shell) = self.shell.as_ref().filter(|_| !self.restore_taken.load(Ordering::SeqCst)) {
            // A shell that ended unclaimed: no claim may pick it any more.
            let _ = std::fs::remove_file(&shell.marker);
        }
        self.retire(&mut lock(&self.container));
        let _ = std::fs::remove_file(self.cfg.dir.join("agent.sock"));
        crate::shimlog::flush();
        std::process::exit(code);
    }

    /// Performs a control request.
    pub(super) fn control(self: &Arc<Self>, req: ShimRequest) -> ShimResponse {
        let r =
            match req {
                ShimRequest::ShimCheckpoint { image } => crate::control::confine_image(&self.cfg.dir, &image)
                    .and_then(|image| self.checkpoint(image)),
                ShimRequest::ShimRollback { image } => crate::control::confine_image(&self.cfg.dir, &image)
                    .and_then(|image| self.rollback(image)),
                ShimRequest::ShimRestore { image } => crate::control::confine_image(&self.cfg.dir, &image)
                    .and_then(|image| self.restore_into_shell(&image)),
                ShimRequest::ShimPause => {
                    let cid = lock(&self.container).cid.clone();
                    self.cfg
                        .runsc
                        .pause(&cid)
                        .map(|()| self.paused.store(true, Ordering::SeqCst))
                        .map_err(|e| e.to_string())
                }
                ShimRequest::ShimResume => {
                    let cid = lock(&self.container).cid.clone();
                    self.cfg
                        .runsc
                        .resume(&cid)
                        .map(|()| self.paused.store(false, Ordering::SeqCst))
                        .map_err(|e| e.to_string())
                }
                ShimRequest::ShimStop => {
                    self.swapping.store(true, Ordering::SeqCst);
                    self.retire(&mut lock(&self.container));
                    let _ = std::fs::remove_file(self.cfg.dir.join("agent.sock"));
                    exit_after_answer(0);
                    Ok(())
                }
            };
        match r {
            Ok(()) => ShimResponse::ShimDone,
            Err(message) => ShimResponse::ShimError { message },
        }
    }

    /// Restores `image` into this shell's created container. One restore per shell: a second
    /// one, or one sent to a sandbox that runs already, is refused.
    fn restore_into_shell(&self, image: &Path) -> Result<(), String> {
        if self.restored.load(Ordering::SeqCst) || self.restore_taken.swap(true, Ordering::SeqCst) {
            return Err("this sandbox is not an empty shell; only a shell takes a restore".into());
        }
        let cid = lock(&self.container).cid.clone();
        for pid in lock(&self.shell_pids).drain(..) {
            renice(pid, 0);
        }
        self.cfg.runsc.restore_created(&cid, image).map_err(|e| e.to_string())?;
        self.restored.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Watches an unclaimed shell once a second: it ends itself when its sandbox directory is
    /// gone (a data directory removed under it) or when it has waited [`Shell::idle`], taking
    /// its marker away first so that no claim can race its end. A claim ends the watch.
    fn watch_shell(&self, shell: &Shell, pid: Option<i32>) {
        let born = Instant::now();
        loop {
            std::thread::sleep(Duration::from_secs(1));
            if self.restore_taken.load(Ordering::SeqCst) {
                return;
            }
            let expired = born.elapsed() >= shell.idle;
            if self.cfg.dir.is_dir() && !expired {
                continue;
            }
            match std::fs::rename(&shell.marker, self.cfg.dir.join(SHELL_EXPIRED)) {
                Ok(()) => {}
                // Claimed in the meantime: the claimer's restore follows.
                Err(_) if self.cfg.dir.is_dir() && shell.marker.parent().is_some_and(Path::is_dir) => return,
                Err(_) => {}
            }
            eprintln!(
                "branchbox-shim: the shell {}; ending it",
                if expired { "waited its idle limit unclaimed" } else { "lost its directory" }
            );
            self.swapping.store(true, Ordering::SeqCst);
            if let Some(pid) = pid {
                // SAFETY: the pid runsc reported for this shell's sandbox process when it was
                // created; the shim would have ended with that process.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            self.retire(&mut lock(&self.container));
            let _ = std::fs::remove_dir_all(&self.cfg.dir);
            crate::shimlog::flush();
            std::process::exit(0);
        }
    }

    /// Freezes the agent's answers, checkpoints the container with `--leave-running` and thaws
    /// it: the sandbox keeps its container, its processes and every in-flight request, and
    /// only pauses while runsc writes the image. The freeze is what the image records: an agent
    /// restored from it holds its answers until its creator thaws it with a new identity.
    fn checkpoint(&self, image: PathBuf) -> Result<(), String> {
        if self.paused.load(Ordering::SeqCst) {
            return Err("the sandbox is paused; resume it before taking a snapshot".into());
        }
        let _closed = self.gate.write().unwrap_or_else(|e| e.into_inner());
        self.internal(&Request::Freeze, &[])?;
        let cid = lock(&self.container).cid.clone();
        let saved = self.cfg.runsc.checkpoint(&cid, &image).map_err(|e| e.to_string());
        let thawed = self.internal(&Request::Thaw { after_fork: None }, &[]).map(drop);
        saved.and(thawed)
    }

    /// Starts the checkpoint in `image` beside the running container, thaws it, and only then
    /// retires the old container: a rollback that fails leaves the sandbox as it was.
    fn rollback(self: &Arc<Self>, image: PathBuf) -> Result<(), String> {
        if self.paused.load(Ordering::SeqCst) {
            return Err("the sandbox is paused; resume it before rolling back".into());
        }
        if self.cfg.runsc.network {
            return self.rollback_networked(image);
        }
        let _closed = self.gate.write().unwrap_or_else(|e| e.into_inner());
        let next = lock(&self.container).generation + 1;
        let (mut target, stdout) = spawn_container(&self.cfg, next, &Start::Restore(image.clone()))
            .map_err(|e| format!("runsc restore: {e}"))?;
        self.start_reader(stdout, next);
        if let Err(e) = self.internal_to(&Request::Thaw { after_fork: None }, &mut target) {
            self.retire(&mut target);
            return Err(format!("the checkpoint did not come up ({e}); the sandbox is unchanged"));
        }
        let mut old = std::mem::replace(&mut *lock(&self.container), target);
        // Off the rollback's path: `runsc delete` of a container that was itself restored takes
        // about a second (20240729), and nothing needs the old one gone first. Its reader
        // ends without shutting the shim down: it is no longer the current generation.
        let me = Arc::clone(self);
        std::thread::spawn(move || me.retire(&mut old));
        self.abandon_client_requests("the sandbox was rolled back while this request ran");
        Ok(())
    }

    /// Rollback of a sandbox with a network: two generations cannot share the guest
    /// namespace's one interface (each runsc reads every frame on it and takes its address
    /// off), so the old container goes first, the interface is addressed again, and the
    /// checkpoint is restored into it. Slower than the overlapping rollback by the old
    /// container's removal, and a checkpoint that does not come up ends the sandbox (with
    /// `ended.json` saying so) instead of leaving it as it was (docs/network.md).
    fn rollback_networked(self: &Arc<Self>, image: PathBuf) -> Result<(), String> {
        let _closed = self.gate.write().unwrap_or_else(|e| e.into_inner());
        self.swapping.store(true, Ordering::SeqCst);
        let next = {
            let mut old = lock(&self.container);
            self.stop_now(&old.cid);
            // runsc's removal of a restored container takes about 2 s; off the path.
            let (me, cid, child) = (Arc::clone(self), old.cid.clone(), old.child.take());
            std::thread::spawn(move || me.retire_parts(&cid, child));
            old.generation + 1
        };
        self.abandon_client_requests("the sandbox was rolled back while this request ran");
        let restored = crate::network::readdress(&self.cfg.id)
            .map_err(|e| e.to_string())
            .and_then(|()| {
                spawn_container(&self.cfg, next, &Start::Restore(image.clone()))
                    .map_err(|e| format!("runsc restore: {e}"))
            })
            .and_then(|(mut target, stdout)| {
                self.start_reader(stdout, next);
                match self.internal_to(&Request::Thaw { after_fork: None }, &mut target) {
                    Ok(_) => Ok(target),
                    Err(e) => {
                        self.retire(&mut target);
                        Err(format!("the checkpoint did not come up ({e})"))
                    }
                }
            });
        match restored {
            Ok(target) => {
                *lock(&self.container) = target;
                self.swapping.store(false, Ordering::SeqCst);
                Ok(())
            }
            Err(e) => {
                let ended = crate::hostcg::Ended {
                    reason: "rollback_failed",
                    detail: format!("the rollback of this networked sandbox stopped it and then failed: {e}"),
                };
                if let Err(err) = crate::hostcg::record(&self.cfg.dir, &ended) {
                    eprintln!("branchbox-shim: cannot record why the sandbox ended: {err}");
                }
                eprintln!("branchbox-shim: {}; shutting down", ended.detail);
                exit_after_answer(1);
                Err(format!("{e}; the sandbox has ended (the old container was already stopped)"))
            }
        }
    }

    /// Ends container `cid`'s sandbox process at once (SIGKILL) and waits, at most 5 s, until it
    /// is gone: then nothing of it holds the guest namespace's interface.
    fn stop_now(&self, cid: &str) {
        let Some(pid) = self.cfg.runsc.sandbox_pid(cid) else { return };
        // SAFETY: the pid runsc reports for this shim's own container, read just now.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !is_zombie(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Runs the shim until the sandbox ends or is stopped.
pub fn run(cfg: ShimConfig) -> Result<(), String> {
    crate::shimlog::capture_stderr(&cfg.dir).map_err(|e| format!("cannot set up the log: {e}"))?;
    let _ = std::fs::remove_file(cfg.dir.join("agent.sock"));
    let start = cfg.start.clone();
    let shell = match &start {
        Start::Shell(shell) => Some(shell.clone()),
        _ => None,
    };
    let result = serve_sandbox(cfg, start);
    if let (Err(_), Some(shell)) = (&result, shell) {
        // A shell that never became ready: nothing may count on it.
        let _ = std::fs::remove_file(Shell::starting(&shell.marker));
        let _ = std::fs::remove_file(&shell.marker);
    }
    result
}

/// Starts the container `start` asks for, publishes the socket and serves it.
fn serve_sandbox(cfg: ShimConfig, start: Start) -> Result<(), String> {
    let sock = cfg.dir.join("agent.sock");
    if cfg.runsc.network {
        // Before the container: its first lookup finds the resolver there.
        crate::network::serve_dns(&cfg.id, &cfg.dir).map_err(|e| format!("the sandbox's resolver: {e}"))?;
    }
    let fresh = matches!(start, Start::Fresh);
    let (container, stdout) =
        spawn_container(&cfg, 1, &start).map_err(|e| format!("cannot start runsc: {e}"))?;
    let shell = match start {
        Start::Shell(shell) => Some(shell),
        _ => None,
    };
    let shim = Arc::new(Shim {
        cfg,
        container: Mutex::new(container),
        routes: Mutex::new(Routes::default()),
        writers: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(1),
        gate: RwLock::new(()),
        swapping: AtomicBool::new(false),
        paused: AtomicBool::new(false),
        restored: AtomicBool::new(shell.is_none()),
        restore_taken: AtomicBool::new(false),
        shell: shell.clone(),
        shell_pids: Mutex::new(Vec::new()),
    });
    shim.start_reader(stdout, 1);
    if fresh {
        // A restored agent stays frozen until its creator thaws it with a new identity; a
        // fresh one must answer before the sandbox counts as started.
        shim.internal(&Request::Hello { version: PROTOCOL_VERSION }, &[])
            .map_err(|e| format!("the agent did not start: {e}"))?;
    }
    let tmp = sock.with_extension("sock.tmp");
    let _ = std::fs::remove_file(&tmp);
    let listener =
        UnixListener::bind(&tmp).map_err(|e| format!("cannot listen on {}: {e}", tmp.display()))?;
    // Owner only whatever the umask; `serve` also checks each peer's uid.
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(|e| format!("cannot restrict {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, &sock).map_err(|e| format!("cannot publish {}: {e}", sock.display()))?;
    if let Some(shell) = shell {
        // The sandbox process, recorded now: the watch may have to end it after runsc's state
        // directory went away with the data directory.
        let cid = lock(&shim.container).cid.clone();
        let pid = shim.cfg.runsc.sandbox_pid(&cid);
        if let Some(pid) = pid {
            lock(&shim.shell_pids).extend(runtime_pids(&cid, pid));
        }
        if let Err(e) = std::fs::rename(Shell::starting(&shell.marker), &shell.marker) {
            // Its marker was taken away while it started (the shells were dropped).
            eprintln!(
                "branchbox-shim: cannot publish the shell at {}: {e}; ending it",
                shell.marker.display()
            );
            shim.shutdown(1);
        }
        let me = Arc::clone(&shim);
        std::thread::spawn(move || me.watch_shell(&shell, pid));
    }
    shim.serve(listener);
    Ok(())
}

/// True when process `pid` is gone or a zombie (it holds nothing open any more).
pub(crate) fn is_zombie(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}
