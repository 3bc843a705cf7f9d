//! End-to-end: the `branchbox` CLI against real gVisor sandboxes on this host, where the
//! behaviour is gVisor's own (runsc's containers, a missing runsc). What every backend must do
//! (exec, files, limits, fork, snapshots, rollback, lineage, errors) is in the conformance
//! suite, `tests/conformance`.

mod common;

use common::*;

#[test]
fn a_missing_runsc_and_an_unwritable_data_directory_get_clear_errors() {
    let err = bb()
        .env("BRANCHBOX_RUNSC", "/nonexistent/runsc")
        .args(["create", "--backend", "gvisor"])
        .output()
        .unwrap();
    assert!(!err.status.success());
    assert!(
        String::from_utf8_lossy(&err.stderr).contains("runsc"),
        "{}",
        String::from_utf8_lossy(&err.stderr)
    );
    let err = bb_in(std::path::Path::new("/proc/branchbox-forbidden")).arg("ls").output().unwrap();
    assert!(!err.status.success());
    assert!(String::from_utf8_lossy(&err.stderr).contains("not writable"));
}

#[test]
fn kill_removes_every_process_and_file() {
    let s = Sandbox::new();
    let id = s.0.clone();
    assert!(runsc_containers().contains(&id));
    ok(&["kill", &id]);
    assert!(!runsc_containers().contains(&id), "runsc still has {id}");
    assert!(!data_dir().join("sandboxes").join(&id).exists());
    assert!(fails(&["exec", &id, "--", "true"]).contains("not found"));
    std::mem::forget(s);
}
