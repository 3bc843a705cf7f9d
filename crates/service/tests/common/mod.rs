//! A real `branchboxd` for the integration tests: a data directory of its own, no runsc (no
//! sandbox can start, whatever a request asks for), killed when dropped.

use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running branchboxd over a data directory of its own, killed when dropped.
pub struct Daemon {
    /// The process (a test may signal it and wait for its exit).
    pub child: Child,
    _dir: tempfile::TempDir,
    /// Its data directory.
    pub data: PathBuf,
    /// Its address, `127.0.0.1:PORT`.
    pub addr: String,
}

impl Daemon {
    /// The service's token.
    pub fn token(&self) -> String {
        std::fs::read_to_string(self.data.join("service/token")).unwrap().trim().to_string()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts branchboxd with umask 000, as a careless service manager would.
pub fn start(args: &[&str]) -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_branchboxd"));
    cmd.arg("--data-dir")
        .arg(&data)
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env("RUST_LOG", "warn")
        // No sandbox can start, whatever a request that slipped through asked for.
        .env("BRANCHBOX_RUNSC", "/nonexistent/runsc")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    // SAFETY: umask is async-signal-safe and has no preconditions.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0);
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let url = data.join("service/url");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !url.exists() {
        assert!(child.try_wait().unwrap().is_none(), "branchboxd exited early");
        assert!(Instant::now() < deadline, "branchboxd wrote no url file");
        std::thread::sleep(Duration::from_millis(20));
    }
    let addr = std::fs::read_to_string(&url).unwrap().trim().trim_start_matches("http://").to_string();
    Daemon { child, _dir: dir, data, addr }
}

/// A connection to `addr` whose reads give up after a minute.
pub fn connect(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    // A bound on how long a test waits, never an assertion about how fast the service is.
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s
}
