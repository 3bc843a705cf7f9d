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
fn a_runsc_older_than_20240729_is_refused_by_doctor_and_create_with_the_fix() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("runsc");
    std::fs::write(&old, "#!/bin/sh\necho 'runsc version 0.0~20221219.0'\necho 'spec: 1.0.2-dev'\n").unwrap();
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
    let doctor = bb().env("BRANCHBOX_RUNSC", &old).args(["--json", "doctor"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&doctor.stdout).expect("doctor json");
    assert_eq!(v["gvisor"]["usable"], false, "{v}");
    let why = v["gvisor"]["why_not"].as_str().unwrap_or_default();
    assert!(why.contains("20221219.0") && why.contains("./scripts/setup.sh"), "{why}");
    let err = bb().env("BRANCHBOX_RUNSC", &old).args(["create", "--backend", "gvisor"]).output().unwrap();
    assert!(!err.status.success());
    let text = String::from_utf8_lossy(&err.stderr);
    assert!(text.contains("older than 20240729") && text.contains("bookworm-backports"), "{text}");
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

/// A process that ticks every 10 ms and keeps the longest wall-clock gap between two ticks
/// since it was last asked. When /tmp/ask-gap appears it writes `PID TICKS GAP_MS` to /tmp/gap
/// and starts a new gap. Wall clock, not monotonic: a restored gVisor sandbox's monotonic clock
/// hides the time it was stopped, its wall clock does not.
const TICKER: &str = r#"
import os, time
n = 0
last = time.time()
worst = 0.0
while True:
    time.sleep(0.01)
    now = time.time()
    worst = max(worst, now - last)
    last = now
    n += 1
    if os.path.exists('/tmp/ask-gap'):
        os.remove('/tmp/ask-gap')
        open('/tmp/gap.tmp', 'w').write('%d %d %d' % (os.getpid(), n, worst * 1000))
        os.rename('/tmp/gap.tmp', '/tmp/gap')
        worst = 0.0
"#;

/// The longest pause of the source a fork, snapshot or checkpoint may cause, as the source's
/// own ticker sees it: docs/architecture.md ("runsc release, platform and images") documents the pause (`runsc checkpoint --leave-running`
/// writing the image) and this bound, which leaves room for a loaded 2-core host.
const PAUSE_BOUND_MS: u64 = 2000;

/// Asks the ticker for (pid, ticks, longest gap in ms since the last ask).
fn ask_ticker(s: &Sandbox) -> (u64, u64, u64) {
    s.sh("rm -f /tmp/gap; touch /tmp/ask-gap");
    let mut seen = (0, 0, 0);
    eventually("the ticker to answer", || {
        let out = s.sh_output("cat /tmp/gap 2>/dev/null");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let v: Vec<u64> = text.split_whitespace().filter_map(|w| w.parse().ok()).collect();
        if let [pid, ticks, gap] = v[..] {
            seen = (pid, ticks, gap);
            return true;
        }
        false
    });
    seen
}

/// The runsc containers of sandbox `id`.
fn containers_of(id: &str) -> Vec<String> {
    runsc_containers().lines().filter(|l| l.starts_with(&format!("{id}-"))).map(str::to_string).collect()
}

#[test]
fn a_fork_never_stops_the_source_which_keeps_counting_in_the_same_container() {
    let s = Sandbox::new();
    put_text(&s, "/root/ticker.py", TICKER);
    ok(&["spawn", &s.0, "--", "python3", "/root/ticker.py"]);
    let (pid, first, _) = ask_ticker(&s);
    let mut before = first;
    let container = containers_of(&s.0);
    assert_eq!(container.len(), 1, "{container:?}");
    let mut kids = Vec::new();
    for op in [&["fork", "-n", "2"][..], &["snapshot"], &["checkpoint"], &["fork"]] {
        let mut args = vec!["--json"];
        args.extend_from_slice(op);
        args.push(&s.0);
        let v: serde_json::Value = serde_json::from_str(&ok(&args)).expect("json");
        if let Some(children) = v["children"].as_array() {
            kids.extend(children.iter().filter_map(|c| c["id"].as_str()).map(Sandbox::adopt));
        }
        let (now_pid, ticks, gap) = ask_ticker(&s);
        // A restarted ticker would have another pid or start again from zero ticks.
        assert_eq!(now_pid, pid, "after {op:?} the ticker is another process");
        assert!(ticks > before, "after {op:?} the ticker went back from {before} to {ticks} ticks");
        assert!(gap <= PAUSE_BOUND_MS, "after {op:?} the source stood still for {gap} ms");
        // Never stopped and restored: the source is still the container it started as.
        assert_eq!(containers_of(&s.0), container, "after {op:?}");
        before = ticks;
    }
    assert_eq!(kids.len(), 3);
    for kid in &kids {
        let (kid_pid, kid_ticks, _) = ask_ticker(kid);
        assert_eq!(kid_pid, pid, "a child's ticker is the source's process, restored");
        assert!(kid_ticks >= first, "a child's ticker started over ({kid_ticks} < {first})");
    }
}

#[test]
fn a_rollback_replaces_the_container_and_retires_the_old_one_after_answering() {
    let s = Sandbox::new();
    let v: serde_json::Value = serde_json::from_str(&ok(&["--json", "checkpoint", &s.0])).expect("json");
    let checkpoint = v["id"].as_str().expect("checkpoint id").to_string();
    s.sh("echo after > /root/after");
    let before = containers_of(&s.0);
    ok(&["rollback", &s.0, &checkpoint]);
    s.sh("test ! -e /root/after");
    // The old container is retired in the background: it must still go.
    eventually("the old container to be retired", || {
        let now = containers_of(&s.0);
        now.len() == 1 && now != before
    });
}
