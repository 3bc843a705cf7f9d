//! The conformance suite's harness: runs the real `branchbox` binary against one backend, in a
//! data directory of that backend's own, and decides once (in [`missing`]) whether a backend can
//! run on this host. The tests are in `tests/suite`; `docs/conformance.md` says what they cover.

pub mod counter;

pub use counter::{ask, ask_count, ask_mark, counter_pid, eventually, fork_loop, set_mark, Shell, COUNTER};

use branchbox_core::host::{detect_kvm, KvmKind};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

/// A backend the suite runs against, as `--backend` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// gVisor (runsc): runs wherever runsc does.
    Gvisor,
    /// branchbox's own KVM microVMs with a Linux guest.
    Microvm,
}

impl Backend {
    /// The name `--backend` takes and `ls --json` reports.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Gvisor => "gvisor",
            Backend::Microvm => "microvm",
        }
    }
}

/// What this host lacks to run `backend`, or `None` when the backend's tests must run here.
///
/// microvm runs Linux guests, which need hardware virtualization behind `/dev/kvm` (core's
/// detection, the one `branchbox doctor` reports): PVM hosts have a `/dev/kvm` too, but a Linux
/// kernel stops there at its first emulated instruction. Whether the microvm backend is built
/// yet is deliberately not asked: on a hardware-KVM host its tests run, and fail until it is.
/// gvisor is never skipped: a host without a working runsc fails its tests.
pub fn missing(backend: Backend) -> Option<String> {
    match backend {
        Backend::Gvisor => None,
        Backend::Microvm => {
            let kvm = detect_kvm();
            match kvm.kind {
                KvmKind::Hardware | KvmKind::Emulated => None,
                KvmKind::Pvm | KvmKind::None => Some(format!(
                    "Linux guests need hardware KVM (VMX/SVM), which this host lacks: {}",
                    kvm.detail
                )),
            }
        }
    }
}

/// Runs `body` against `backend`, or prints one skip line naming what the host lacks.
pub fn conform(backend: Backend, test: &str, body: fn(&Ctx)) {
    if let Some(why) = missing(backend) {
        // Written past the test harness's capture, so every run shows the skip.
        let _ = writeln!(std::io::stderr(), "SKIP {} {test}: {why}", backend.name());
        return;
    }
    body(&Ctx::new(backend));
}

/// The directory holding `branchbox`, `branchbox-agent` and `branchbox-shim`: this test
/// binary's profile directory (`target/debug`, next to `deps/`).
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe.parent().and_then(Path::parent).expect("the test binary lies in <profile>/deps");
    for bin in ["branchbox", "branchbox-agent", "branchbox-shim"] {
        assert!(
            dir.join(bin).is_file(),
            "{} is missing: build the whole workspace first (`cargo build --workspace`)",
            dir.join(bin).display()
        );
    }
    dir.to_path_buf()
}

/// Where this run keeps its data directories: `$BRANCHBOX_TEST_DIR` (the test command's
/// scratch directory, whose sandboxes it kills at the end) or the system's temporary directory.
fn base_dir() -> PathBuf {
    std::env::var_os("BRANCHBOX_TEST_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir)
}

/// A `branchbox` command for data directory `dir`, with the agent and shim built beside it.
pub fn bb_in(dir: &Path) -> Command {
    let bins = bin_dir();
    let mut c = Command::new(bins.join("branchbox"));
    // Every data directory of the run shares one image cache: the environment's, or one under
    // the run's base directory.
    if std::env::var_os("BRANCHBOX_IMAGES").is_none() {
        c.env("BRANCHBOX_IMAGES", base_dir().join("branchbox-images"));
    }
    // The suite tests this host's CLI, never a service some variable points at.
    c.env_remove("BRANCHBOX_URL")
        .env_remove("BRANCHBOX_TOKEN")
        .env("BRANCHBOX_DATA", dir)
        .env("BRANCHBOX_AGENT", bins.join("branchbox-agent"))
        .env("BRANCHBOX_SHIM", bins.join("branchbox-shim"))
        .stdin(Stdio::null());
    c
}

/// One test's view of one backend: its data directory (shared by the backend's tests in this
/// process, with the image built once) and the commands to drive it.
pub struct Ctx {
    backend: Backend,
    dir: PathBuf,
}

impl Ctx {
    fn new(backend: Backend) -> Ctx {
        static DIRS: [OnceLock<PathBuf>; 2] = [OnceLock::new(), OnceLock::new()];
        let dir = DIRS[backend as usize].get_or_init(|| {
            let dir = base_dir().join(format!("conformance-{}-{}", std::process::id(), backend.name()));
            std::fs::create_dir_all(&dir).expect("the data directory");
            let out = bb_in(&dir).args(["image", "build"]).output().expect("run branchbox");
            assert!(out.status.success(), "image build failed: {}", String::from_utf8_lossy(&out.stderr));
            dir
        });
        Ctx { backend, dir: dir.clone() }
    }

    /// The backend under test.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A `branchbox` command on this data directory.
    pub fn bb(&self) -> Command {
        bb_in(&self.dir)
    }

    /// Runs `branchbox args...` and returns its output.
    pub fn run(&self, args: &[&str]) -> Output {
        self.bb().args(args).output().expect("run branchbox")
    }

    /// Runs `branchbox args...`, asserting success, and returns stdout as text.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "branchbox {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `branchbox args...`, asserting it exits 1 (an error, not a usage mistake), and
    /// returns stderr as text.
    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert_eq!(
            out.status.code(),
            Some(1),
            "branchbox {args:?} should have failed with an error: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// Runs `branchbox --json args...`, asserting success, and parses its output.
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut full = vec!["--json"];
        full.extend_from_slice(args);
        serde_json::from_str(&self.ok(&full)).expect("json output")
    }

    /// Creates a sandbox on this backend with extra `create` flags (limits), and checks that it
    /// runs on this backend (so a fallback can never pass for it).
    pub fn create(&self, flags: &[&str]) -> Sandbox<'_> {
        let mut args = vec!["create", "--backend", self.backend.name()];
        args.extend_from_slice(flags);
        let s = self.adopt(self.ok(&args).trim());
        let listed = self.json(&["ls"]);
        let record = listed.as_array().and_then(|l| l.iter().find(|x| x["id"] == s.id.as_str()));
        let record = record.unwrap_or_else(|| panic!("{} is not listed: {listed}", s.id));
        assert_eq!(record["backend"], self.backend.name(), "{record}");
        s
    }

    /// A sandbox of this data directory, killed when dropped.
    pub fn adopt(&self, id: &str) -> Sandbox<'_> {
        Sandbox { id: id.trim().to_string(), ctx: self }
    }
}

/// A sandbox, killed when dropped (also when its test panics).
pub struct Sandbox<'a> {
    /// Its id.
    pub id: String,
    ctx: &'a Ctx,
}

impl Sandbox<'_> {
    /// Writes `text` to `path` inside through `files put` from standard input.
    pub fn put_text(&self, path: &str, text: &str) {
        let mut child = self
            .ctx
            .bb()
            .args(["files", "put", &self.id, "-", path])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn branchbox");
        child.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("write to branchbox");
        assert!(child.wait().expect("wait for branchbox").success(), "files put {path} failed");
    }

    /// Starts [`COUNTER`] in the background.
    pub fn start_counter(&self) {
        self.put_text("/root/counter.py", COUNTER);
        self.ctx.ok(&["spawn", &self.id, "--", "python3", "/root/counter.py"]);
    }

    /// Kills it now and forgets it (for tests that need it gone while they go on).
    pub fn kill(self) -> String {
        let id = self.id.clone();
        self.ctx.ok(&["kill", &id]);
        std::mem::forget(self);
        id
    }
}

impl Shell for Sandbox<'_> {
    fn sh_output(&self, line: &str) -> Output {
        self.ctx.run(&["exec", &self.id, "-s", "--", line])
    }
}

impl Drop for Sandbox<'_> {
    fn drop(&mut self) {
        let _ = self.ctx.run(&["kill", &self.id]);
    }
}
