//! The `branchbox-vhost` binary's layered-disk arguments: the chain is opened (or created
//! over a base) before the server waits for a front end, and a missing chain is an error that
//! names it.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_branchbox-vhost");

#[test]
fn blk_layers_creates_the_chain_over_a_base_then_serves_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path().join("base.img");
    std::fs::write(&base, vec![0u8; 64 << 10]).expect("base");
    let store = dir.path().join("store");
    let mut server = Command::new(BIN)
        .arg("--socket")
        .arg(dir.path().join("blk.sock"))
        .args(["blk-layers", "--chain", "vm", "--store"])
        .arg(&store)
        .arg("--create-over")
        .arg(&base)
        .stderr(Stdio::piped())
        .spawn()
        .expect("start branchbox-vhost");
    let manifest = store.join("chains/vm.json");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !manifest.exists() {
        if let Ok(Some(status)) = server.try_wait() {
            panic!("branchbox-vhost exited ({status}) before creating the chain");
        }
        assert!(Instant::now() < deadline, "no chain manifest after 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The server holds the chain open (its top locked) while it waits for a front end.
    let layers = branchbox_disk::Store::open(&store).expect("store");
    assert!(matches!(
        branchbox_disk::LayeredBackend::open(&layers, "vm"),
        Err(branchbox_disk::LayerError::TopInUse { .. })
    ));
    server.kill().expect("stop the server");
    server.wait().expect("reap the server");
    branchbox_disk::LayeredBackend::open(&layers, "vm").expect("the chain opens once the server is gone");
}

#[test]
fn blk_layers_refuses_a_missing_chain_and_names_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(BIN)
        .arg("--socket")
        .arg(dir.path().join("blk.sock"))
        .args(["blk-layers", "--chain", "nosuch", "--store"])
        .arg(dir.path().join("store"))
        .output()
        .expect("run branchbox-vhost");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no chain named nosuch"), "stderr: {stderr}");
}
