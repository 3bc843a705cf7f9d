//! branchboxd and a corrupt metadata store: it refuses to start on one, naming the file, its
//! backup and what to do, and starts again once the backup is put back
//! (docs/architecture.md, "Metadata store"). No sandbox is started.

use branchbox_model::{BackendKind, Limits, Snapshot, SnapshotId, SnapshotKind};
use branchbox_store::{file, Store};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn branchboxd(data: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_branchboxd"));
    cmd.arg("--data-dir")
        .arg(data)
        .args(["--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "warn")
        .env("BRANCHBOX_RUNSC", "/nonexistent/runsc")
        .stdin(Stdio::null());
    cmd
}

#[test]
fn a_corrupt_meta_db_is_refused_naming_its_backup_and_restore_brings_the_lineage_back() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let meta = data.join("meta.db");
    let kept = Snapshot {
        id: SnapshotId::generate(),
        parent: None,
        source: None,
        backend: BackendKind::Gvisor,
        image: "img-0123456789abcdef".into(),
        kind: SnapshotKind::Snapshot,
        name: Some("warm".into()),
        created_ms: 1,
        size_bytes: 0,
        limits: Limits::default(),
        expires_ms: None,
        deleted_ms: None,
    };
    Store::open(&meta).unwrap().insert_snapshot(&kept).unwrap();
    file::backup(&meta).unwrap();
    // What the damaged file held: a b-tree leaf index page where page 1 belongs.
    let mut bytes = std::fs::read(&meta).unwrap();
    bytes[..4096].fill(0);
    bytes[..10].copy_from_slice(&[0x0a, 0, 0, 0, 1, 0x0f, 0xe8, 0, 0x0f, 0xe8]);
    std::fs::write(&meta, &bytes).unwrap();

    let out = branchboxd(&data).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "branchboxd started on a corrupt store: {err}");
    assert!(err.contains(&meta.display().to_string()), "{err}");
    assert!(err.contains(&file::backup_path(&meta).display().to_string()), "{err}");
    assert!(err.contains("branchbox store restore"), "{err}");
    assert!(!data.join("service/url").exists());

    file::restore(&meta).unwrap();
    let mut child = branchboxd(&data).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !data.join("service/url").exists() {
        assert!(child.try_wait().unwrap().is_none(), "branchboxd exited on the restored store");
        assert!(Instant::now() < deadline, "branchboxd did not start on the restored store");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        Store::open(&meta).unwrap().snapshot("warm").unwrap(),
        kept,
        "the restored store lost the lineage"
    );
}
