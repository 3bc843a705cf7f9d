//! Shared helpers for end-to-end tests: run the real `branchbox` binary against real runsc
//! sandboxes in a data directory of the test run's own.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

// The background process that holds a word in memory, and the polling, are the conformance
// suite's (tests/conformance), which runs the generic behaviours against every backend. Each
// test file uses some of them, as it does the rest of this module.
#[allow(unused_imports)]
pub use branchbox_conformance::{ask_count, counter_pid, eventually, fork_loop, Shell, COUNTER};

fn shared_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base =
            std::env::var_os("BRANCHBOX_TEST_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!("bbt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("data dir");
        dir
    })
}

/// The test run's data directory, with the image built once for all tests.
pub fn data_dir() -> &'static Path {
    static BUILT: OnceLock<()> = OnceLock::new();
    let dir = shared_dir();
    BUILT.get_or_init(|| {
        let out = bb_in(dir).args(["image", "build"]).output().expect("run branchbox");
        assert!(out.status.success(), "image build failed: {}", String::from_utf8_lossy(&out.stderr));
    });
    dir
}

/// A data directory of one test's own (for tests that must see the whole directory, as gc
/// does), sharing the image cache.
pub fn private_dir(name: &str) -> PathBuf {
    let shared = data_dir();
    let dir =
        shared.with_file_name(format!("{}-{name}", shared.file_name().unwrap_or_default().to_string_lossy()));
    std::fs::create_dir_all(&dir).expect("private data dir");
    dir
}

fn target_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_branchbox")).parent().expect("target dir").to_path_buf()
}

/// A `branchbox` command for data directory `dir`.
pub fn bb_in(dir: &Path) -> Command {
    let t = target_dir();
    for bin in ["branchbox-agent", "branchbox-shim"] {
        assert!(
            t.join(bin).is_file(),
            "{} is missing: build the whole workspace first (`cargo build --workspace`)",
            t.join(bin).display()
        );
    }
    let mut c = Command::new(env!("CARGO_BIN_EXE_branchbox"));
    // Every test data directory shares one image cache: the shared directory's, unless the
    // environment names one.
    if std::env::var_os("BRANCHBOX_IMAGES").is_none() {
        c.env("BRANCHBOX_IMAGES", shared_dir().join("images"));
    }
    c.env("BRANCHBOX_DATA", dir)
        .env("BRANCHBOX_AGENT", t.join("branchbox-agent"))
        .env("BRANCHBOX_SHIM", t.join("branchbox-shim"))
        .stdin(Stdio::null());
    c
}

/// A running `branchboxd` (built beside `branchbox`), killed when dropped.
pub struct Daemon {
    child: Child,
    /// Its data directory.
    pub data: PathBuf,
    /// Where it listens, `127.0.0.1:PORT`.
    pub addr: String,
}

impl Daemon {
    /// Starts branchboxd over `data` on a free loopback port, with the environment `bb_in`
    /// gives the CLI (the same agent, shim and images) plus `env`, and waits for its url file.
    pub fn start(data: &Path, env: &[(&str, &str)]) -> Daemon {
        let exe = target_dir().join("branchboxd");
        assert!(exe.is_file(), "{} is missing: `cargo build --workspace` first", exe.display());
        let mut cmd = with_bb_env(exe, data);
        cmd.arg("--data-dir")
            .arg(data)
            .args(["--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let mut child = cmd.spawn().expect("start branchboxd");
        let url = data.join("service/url");
        let deadline = Instant::now() + Duration::from_secs(60);
        while !url.exists() {
            assert!(child.try_wait().expect("branchboxd's status").is_none(), "branchboxd exited early");
            assert!(Instant::now() < deadline, "branchboxd wrote no url file");
            std::thread::sleep(Duration::from_millis(20));
        }
        let addr =
            std::fs::read_to_string(&url).expect("url file").trim().trim_start_matches("http://").to_string();
        Daemon { child, data: data.to_path_buf(), addr }
    }

    /// The service's token.
    pub fn token(&self) -> String {
        std::fs::read_to_string(self.data.join("service/token")).expect("token file").trim().to_string()
    }

    /// Sends `method path` with a JSON `body` (and the service's token unless `token` is
    /// false) on a connection of its own and returns the status and body of the answer.
    pub fn request(&self, method: &str, path: &str, body: &str, token: bool) -> (u16, String) {
        self.request_with(method, path, "", body, token)
    }

    /// [`Daemon::request`] with more header lines (each ending in CRLF).
    pub fn request_with(
        &self,
        method: &str,
        path: &str,
        headers: &str,
        body: &str,
        token: bool,
    ) -> (u16, String) {
        let mut s = TcpStream::connect(&self.addr).expect("connect to branchboxd");
        // A bound on how long a test waits, never an assertion about how fast the service is.
        s.set_read_timeout(Some(Duration::from_secs(120))).expect("read timeout");
        let auth = if token { format!("authorization: Bearer {}\r\n", self.token()) } else { String::new() };
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nhost: {}\r\n{auth}{headers}content-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .expect("send the request");
        let mut answer = String::new();
        s.read_to_string(&mut answer).expect("read the answer");
        let status = answer.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        (status, body)
    }

    /// [`Daemon::request`] of `GET path`.
    pub fn get(&self, path: &str, token: bool) -> (u16, String) {
        self.request("GET", path, "", token)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A command running `program` with the environment [`bb_in`] gives `branchbox` for `dir`.
pub fn with_bb_env(program: impl AsRef<std::ffi::OsStr>, dir: &Path) -> Command {
    let mut cmd = Command::new(program);
    for (k, v) in bb_in(dir).get_envs() {
        if let Some(v) = v {
            cmd.env(k, v);
        }
    }
    cmd
}

/// A `branchbox` command for the shared data directory.
pub fn bb() -> Command {
    bb_in(data_dir())
}

/// Runs `branchbox args...` and returns its output.
pub fn run(args: &[&str]) -> Output {
    run_in(data_dir(), args)
}

/// Runs `branchbox args...` on data directory `dir`.
pub fn run_in(dir: &Path, args: &[&str]) -> Output {
    bb_in(dir).args(args).output().expect("run branchbox")
}

/// Runs `branchbox args...`, asserting success, and returns stdout as text.
pub fn ok(args: &[&str]) -> String {
    ok_in(data_dir(), args)
}

/// As [`ok`], on data directory `dir`.
pub fn ok_in(dir: &Path, args: &[&str]) -> String {
    let out = run_in(dir, args);
    assert!(
        out.status.success(),
        "branchbox {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `branchbox args...`, asserting failure, and returns stderr as text.
pub fn fails(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        !out.status.success(),
        "branchbox {args:?} should have failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A sandbox (id, data directory) killed when dropped.
pub struct Sandbox(pub String, pub PathBuf);

impl Sandbox {
    /// Creates one in the shared data directory.
    pub fn new() -> Sandbox {
        Sandbox::new_in(data_dir())
    }

    /// Creates one in data directory `dir`.
    pub fn new_in(dir: &Path) -> Sandbox {
        Sandbox(ok_in(dir, &["create", "--backend", "gvisor"]).trim().to_string(), dir.to_path_buf())
    }

    /// Adopts an existing id of the shared data directory.
    pub fn adopt(id: &str) -> Sandbox {
        Sandbox(id.trim().to_string(), data_dir().to_path_buf())
    }
}

impl Shell for Sandbox {
    fn sh_output(&self, line: &str) -> Output {
        run_in(&self.1, &["exec", &self.0, "-s", "--", line])
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = run_in(&self.1, &["kill", &self.0]);
    }
}

/// The runsc containers under the shared data directory.
pub fn runsc_containers() -> String {
    let out = Command::new(std::env::var("BRANCHBOX_RUNSC").unwrap_or_else(|_| "runsc".into()))
        .arg("--root")
        .arg(data_dir().join("runsc"))
        .args(["list", "-quiet"])
        .output()
        .expect("runsc list");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Writes `text` to `path` inside `s` through `files put` from standard input.
pub fn put_text(s: &Sandbox, path: &str, text: &str) {
    let mut child = bb_in(&s.1)
        .args(["files", "put", &s.0, "-", path])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    use std::io::Write;
    child.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("write");
    assert!(child.wait().expect("wait").success());
}
