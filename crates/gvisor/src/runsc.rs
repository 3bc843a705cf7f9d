//! Thin wrapper over the `runsc` command line: one place knows its flags.

use branchbox_model::{Error, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// How to invoke runsc for this data directory.
#[derive(Debug, Clone)]
pub struct Runsc {
    /// The runsc executable.
    pub bin: PathBuf,
    /// runsc's state directory (`--root`).
    pub root: PathBuf,
}

/// Flags every invocation shares; checkpoint and restore must agree on them.
const SANDBOX_FLAGS: [&str; 2] = ["--network=none", "--overlay2=root:memory"];

impl Runsc {
    /// A command with the global flags set.
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--root").arg(&self.root).args(SANDBOX_FLAGS);
        c
    }

    /// Checks that runsc can be started; the error says how to install it.
    pub fn check(&self) -> Result<String> {
        let out = Command::new(&self.bin).arg("--version").output().map_err(|e| {
            Error::Unavailable(format!(
                "runsc ({}) cannot be started: {e}; install gVisor (`apt-get install runsc` on Debian) \
                 or set BRANCHBOX_RUNSC to its path",
                self.bin.display()
            ))
        })?;
        let text = String::from_utf8_lossy(&out.stdout);
        Ok(text.lines().next().unwrap_or("runsc").to_string())
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

    /// `runsc checkpoint`: saves the container to `image` and stops it.
    pub fn checkpoint(&self, cid: &str, image: &Path) -> Result<()> {
        let mut c = self.command();
        c.arg("checkpoint").arg("--image-path").arg(image).arg(cid);
        self.run("checkpoint", c).map(drop)
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

    /// True while runsc reports the container as running or paused.
    fn is_up(&self, cid: &str) -> bool {
        let mut c = self.command();
        c.arg("state").arg(cid);
        match c.stdin(Stdio::null()).stderr(Stdio::null()).output() {
            Ok(o) if o.status.success() => {
                let text = String::from_utf8_lossy(&o.stdout);
                text.contains("\"running\"") || text.contains("\"paused\"") || text.contains("\"created\"")
            }
            _ => false,
        }
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
