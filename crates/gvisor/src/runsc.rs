//! Thin wrapper over the `runsc` command line: one place knows its flags.

use branchbox_model::{Error, Result};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, OnceLock};

/// How to invoke runsc for this data directory.
#[derive(Debug, Clone)]
pub struct Runsc {
    /// The runsc executable.
    pub bin: PathBuf,
    /// runsc's state directory (`--root`).
    pub root: PathBuf,
    /// True for a sandbox with a network: runsc's own netstack over the interfaces of the
    /// network namespace the bundle names, with `--net-disconnect-ok` so that a checkpoint
    /// saves connections closed but still in `TIME_WAIT` (without it runsc refuses them as it
    /// refuses open ones; the backend refuses open ones itself first, docs/network.md); else
    /// `--network=none`.
    pub network: bool,
    /// The version line once [`Runsc::check`] accepted it: every sandbox start checks, and
    /// `runsc --version` costs tens of milliseconds on a loaded host.
    accepted: Arc<OnceLock<String>>,
}

/// Flags every invocation shares, with the network flag ([`Runsc::network`]); checkpoint and
/// restore must agree on them. ptrace, not the newer default systrap: on these hosts systrap
/// starts guest processes 1.3 to 2 times slower and restores no faster (docs/architecture.md,
/// "runsc release, platform and images").
const SANDBOX_FLAGS: [&str; 2] = ["--overlay2=root:memory", "--platform=ptrace"];

/// Checkpoint flags: the source keeps running (20240729 and later, see `version`), and the
/// image is not compressed: the checkpoint (the source's pause) and each restore are faster
/// (same section of docs/architecture.md).
const CHECKPOINT_FLAGS: [&str; 2] = ["--leave-running", "--compression=none"];

impl Runsc {
    /// runsc `bin` with its state in `root`.
    pub fn new(bin: PathBuf, root: PathBuf) -> Runsc {
        Runsc { bin, root, network: false, accepted: Arc::default() }
    }

    /// This runsc for a sandbox with a network (`--network=sandbox`).
    pub fn networked(mut self) -> Runsc {
        self.network = true;
        self
    }

    /// A command with the global flags set.
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--root").arg(&self.root).args(SANDBOX_FLAGS);
        if self.network {
            c.args(["--network=sandbox", "--net-disconnect-ok"]);
        } else {
            c.arg("--network=none");
        }
        c
    }

    /// A command for `runsc run` or `runsc restore`. With a network, runsc 20240729 refuses
    /// to start in any namespace on kernels 6.11 and later: it takes the presence of
    /// `/proc/sys/net/core/rmem_default` as proof of the host's root namespace, and newer
    /// kernels show that file everywhere (gVisor issue 10704). So that runsc starts in a
    /// mount namespace of its own with an empty tmpfs over `/proc/sys/net`; netstack reads
    /// nothing there (docs/network.md).
    pub fn start_command(&self) -> Command {
        let mut c = self.command();
        if self.network {
            // SAFETY: unshare(2) and mount(2) only, between fork and exec, on C strings that
            // are literals.
            unsafe {
                c.pre_exec(|| {
                    let fail = || Err(std::io::Error::last_os_error());
                    if libc::unshare(libc::CLONE_NEWNS) != 0 {
                        return fail();
                    }
                    let none = std::ptr::null();
                    if libc::mount(
                        none,
                        c"/".as_ptr(),
                        none,
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    ) != 0
                    {
                        return fail();
                    }
                    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
                    if libc::mount(
                        c"tmpfs".as_ptr(),
                        c"/proc/sys/net".as_ptr(),
                        c"tmpfs".as_ptr(),
                        flags,
                        std::ptr::null(),
                    ) != 0
                    {
                        return fail();
                    }
                    Ok(())
                });
            }
        }
        c
    }

    /// Checks that runsc can be started and is release [`crate::version::OLDEST`] or later;
    /// returns its version line. The error says how to install one that is.
    pub fn check(&self) -> Result<String> {
        if let Some(line) = self.accepted.get() {
            return Ok(line.clone());
        }
        let out = Command::new(&self.bin).arg("--version").stdin(Stdio::null()).output().map_err(|e| {
            Error::Unavailable(format!(
                "runsc ({}) cannot be started: {e}; {}, or set BRANCHBOX_RUNSC to its path",
                self.bin.display(),
                crate::version::FIX
            ))
        })?;
        let text = String::from_utf8_lossy(&out.stdout);
        crate::version::require(&text)
            .map_err(|why| Error::Unavailable(format!("runsc ({}) {why}", self.bin.display())))?;
        let line = text.lines().next().unwrap_or_default().trim().to_string();
        Ok(self.accepted.get_or_init(|| line).clone())
    }

    fn run(&self, what: &str, mut cmd: Command) -> Result<Output> {
        let out = cmd.stdin(Stdio::null()).output().map_err(|e| {
            Error::Unavailable(format!("runsc ({}) cannot be started: {e}", self.bin.display()))
        })?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let tail: String = err.lines().rev().take(3).collect::<Vec<_>>().join(" / ");
            return Err(Error::Backend(format!("runsc {what} failed ({}): {tail}", out.status)));
        }
        Ok(out)
    }

    /// `runsc checkpoint --leave-running`: saves the container to `image`; it pauses while
    /// its state is written and then runs on, never restarted.
    pub fn checkpoint(&self, cid: &str, image: &Path) -> Result<()> {
        let mut c = self.command();
        c.arg("checkpoint").args(CHECKPOINT_FLAGS).arg("--image-path").arg(image).arg(cid);
        self.run("checkpoint", c).map(drop)
    }

    /// `runsc restore --detach` of `image` as container `cid` with `bundle`: returns once the
    /// restored container runs (the benchmark's floor; the shim restores attached). Its stdio
    /// is null: the restored container keeps the restoring process's, and a pipe held by it
    /// would never close.
    pub fn restore_detached(&self, cid: &str, bundle: &Path, image: &Path) -> Result<()> {
        let mut c = self.command();
        c.arg("restore").arg("--detach").arg("--image-path").arg(image).arg("--bundle").arg(bundle).arg(cid);
        let status =
            c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).status().map_err(|e| {
                Error::Unavailable(format!("runsc ({}) cannot be started: {e}", self.bin.display()))
            })?;
        if !status.success() {
            return Err(Error::Backend(format!("runsc restore --detach of {cid} failed ({status})")));
        }
        Ok(())
    }

    /// `runsc restore --detach` of `image` into container `cid`, which `runsc create` made and
    /// nothing started: the sandbox process and its gofer exist already, so only the state
    /// is loaded. The restored container keeps the stdio `runsc create` had.
    pub fn restore_created(&self, cid: &str, image: &Path) -> Result<()> {
        let mut c = self.command();
        c.arg("restore").arg("--detach").arg("--image-path").arg(image).arg(cid);
        self.run("restore", c).map(drop)
    }

    /// `runsc pause`.
    pub fn pause(&self, cid: &str) -> Result<()> {
        let mut c = self.command();
        c.arg("pause").arg(cid);
        self.run("pause", c).map(drop)
    }

    /// `runsc resume`.
    pub fn resume(&self, cid: &str) -> Result<()> {
        let mut c = self.command();
        c.arg("resume").arg(cid);
        self.run("resume", c).map(drop)
    }

    /// `runsc kill <cid> KILL`: stops every process of the container at once.
    pub fn kill(&self, cid: &str) {
        let mut c = self.command();
        c.arg("kill").arg(cid).arg("KILL");
        let _ = c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).status();
    }

    /// `runsc state` of the container, while runsc knows it.
    fn state(&self, cid: &str) -> Option<serde_json::Value> {
        let mut c = self.command();
        c.arg("state").arg(cid);
        let out =
            c.stdin(Stdio::null()).stderr(Stdio::null()).output().ok().filter(|o| o.status.success())?;
        serde_json::from_slice(&out.stdout).ok()
    }

    /// The host pid of the container's sandbox process, while runsc knows it.
    pub fn sandbox_pid(&self, cid: &str) -> Option<i32> {
        self.state(cid)?["pid"].as_i64().and_then(|p| i32::try_from(p).ok()).filter(|p| *p > 1)
    }

    /// True while runsc reports the container as running, paused or created.
    fn is_up(&self, cid: &str) -> bool {
        self.state(cid)
            .is_some_and(|s| matches!(s["status"].as_str(), Some("running" | "paused" | "created")))
    }

    /// Kills the container, waits (briefly) until it has stopped and removes it. Killing
    /// first matters: `delete -force` of a running container waits out a 5 s deadline.
    pub fn destroy(&self, cid: &str) {
        self.kill(cid);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while self.is_up(cid) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        self.delete(cid);
    }

    /// `runsc delete -force`: removes the container; missing containers are fine.
    pub fn delete(&self, cid: &str) {
        let mut c = self.command();
        c.arg("delete").arg("-force").arg(cid);
        let _ = c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).status();
    }

    /// Ids of every container in this root whose id starts with `prefix`.
    pub fn list(&self, prefix: &str) -> Vec<String> {
        let mut c = self.command();
        c.arg("list").arg("-quiet");
        match c.stdin(Stdio::null()).stderr(Stdio::null()).output() {
            Ok(o) => String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| l.starts_with(prefix))
                .map(str::to_string)
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}
