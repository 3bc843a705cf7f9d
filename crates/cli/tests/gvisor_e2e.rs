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

/// Restore shells of data directory `dir`: (ready ones, how many are still starting).
fn shells(dir: &std::path::Path) -> (Vec<String>, usize) {
    let (mut ready, mut starting) = (Vec::new(), 0);
    for key in std::fs::read_dir(dir.join("shells")).into_iter().flatten().flatten() {
        for m in std::fs::read_dir(key.path()).into_iter().flatten().flatten() {
            let name = m.file_name().to_string_lossy().into_owned();
            if name.ends_with(".starting") {
                starting += 1;
            } else {
                ready.push(name);
            }
        }
    }
    ready.sort();
    (ready, starting)
}

/// Waits (at most 60 s) until `dir` has `n` ready shells and none starting.
fn ready_shells(dir: &std::path::Path, n: usize) -> Vec<String> {
    let t = std::time::Instant::now();
    loop {
        let (ready, starting) = shells(dir);
        if ready.len() >= n && starting == 0 {
            return ready;
        }
        assert!(t.elapsed().as_secs() < 60, "{n} shells never became ready: {ready:?}, {starting} starting");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The niceness of every thread of every runtime process (shim, runsc sandbox, gofer and the
/// sandbox's stub processes) whose command line names sandbox `id`.
fn runtime_niceness(id: &str) -> Vec<i32> {
    let mut nice = Vec::new();
    for p in std::fs::read_dir("/proc").unwrap().flatten() {
        if !p.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(cmd) = std::fs::read(p.path().join("cmdline")) else { continue };
        if !String::from_utf8_lossy(&cmd).contains(id) {
            continue;
        }
        for t in std::fs::read_dir(p.path().join("task")).into_iter().flatten().flatten() {
            let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else { continue };
            // Field 19, counted after the `(comm)` field, which may hold spaces.
            if let Some(n) = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(16)) {
                nice.push(n.parse().unwrap());
            }
        }
    }
    nice
}

#[test]
fn a_fork_takes_ready_restore_shells_which_run_niced_until_claimed_and_gc_ends_the_rest() {
    let dir = private_dir("shells");
    let src = Sandbox::new_in(&dir);
    src_write(&src, "/tmp/mark", "from-the-source");
    // The first fork finds no shells; it leaves two for the next fork this wide.
    let first: Vec<Sandbox> = ok_in(&dir, &["fork", &src.0, "-n", "2"])
        .lines()
        .map(|l| Sandbox(l.trim().to_string(), dir.clone()))
        .collect();
    assert_eq!(first.len(), 2);
    let shells_before = ready_shells(&dir, 2);
    assert_eq!(shells_before.len(), 2, "{shells_before:?}");
    for shell in &shells_before {
        let nice = runtime_niceness(shell);
        assert!(nice.contains(&10), "shell {shell} is not niced: {nice:?}");
        assert!(!ok_in(&dir, &["ls"]).contains(shell.as_str()), "shell {shell} is listed as a sandbox");
    }
    let second: Vec<Sandbox> = ok_in(&dir, &["fork", &src.0, "-n", "2"])
        .lines()
        .map(|l| Sandbox(l.trim().to_string(), dir.clone()))
        .collect();
    let mut ids: Vec<String> = second.iter().map(|s| s.0.clone()).collect();
    ids.sort();
    assert_eq!(ids, shells_before, "the fork did not take the ready shells");
    for (i, child) in second.iter().enumerate() {
        let out = ok_in(
            &dir,
            &[
                "exec",
                &child.0,
                "--",
                "sh",
                "-c",
                &format!("cat /tmp/mark; echo; hostname; echo {i} > /tmp/own"),
            ],
        );
        assert_eq!(out.lines().collect::<Vec<_>>(), ["from-the-source", &format!("bb-{}", &child.0[4..12])]);
        let nice = runtime_niceness(&child.0);
        assert!(
            !nice.is_empty() && nice.iter().all(|n| *n == 0),
            "claimed shell {} still niced: {nice:?}",
            child.0
        );
    }
    for (i, child) in second.iter().enumerate() {
        assert_eq!(ok_in(&dir, &["exec", &child.0, "--", "cat", "/tmp/own"]).trim(), i.to_string());
    }
    // The second fork started two more; gc ends them and leaves nothing of them.
    let refilled = ready_shells(&dir, 2);
    assert!(refilled.iter().all(|s| !shells_before.contains(s)), "{refilled:?}");
    let gc = ok_in(&dir, &["--json", "gc"]);
    let v: serde_json::Value = serde_json::from_str(&gc).expect("gc json");
    let mut ended: Vec<String> = v["ended_shells"]
        .as_array()
        .expect("ended_shells")
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect();
    ended.sort();
    assert_eq!(ended, refilled, "{gc}");
    assert!(v["orphan_sandbox_dirs"].as_array().unwrap().is_empty(), "{gc}");
    for shell in &refilled {
        assert!(runtime_niceness(shell).is_empty(), "shell {shell} still runs after gc");
        assert!(!dir.join("sandboxes").join(shell).exists());
    }
    assert_eq!(shells(&dir), (Vec::new(), 0));
    drop((first, second, src));
}

#[test]
fn a_dead_shell_is_passed_over_and_an_unclaimed_one_ends_itself() {
    let dir = private_dir("shells-idle");
    let fork = |src: &str| {
        let out =
            bb_in(&dir).env("BRANCHBOX_SHELL_IDLE_S", "3").args(["fork", src, "-n", "1"]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        Sandbox(String::from_utf8_lossy(&out.stdout).trim().to_string(), dir.clone())
    };
    let src = Sandbox::new_in(&dir);
    src_write(&src, "/tmp/mark", "kept");
    let _first = fork(&src.0);
    let dead = ready_shells(&dir, 1).remove(0);
    // Its shim dies without a word: the marker stays, the socket no longer answers.
    let shim = std::fs::read_to_string(dir.join("sandboxes").join(&dead).join("shim.pid")).unwrap();
    assert!(std::process::Command::new("kill").args(["-KILL", shim.trim()]).status().unwrap().success());
    let child = fork(&src.0);
    assert_ne!(child.0, dead, "the fork took a dead shell");
    assert_eq!(ok_in(&dir, &["exec", &child.0, "--", "cat", "/tmp/mark"]).trim(), "kept");
    assert!(runtime_niceness(&dead).is_empty(), "the dead shell's runtime is still there");
    assert!(!dir.join("sandboxes").join(&dead).exists());
    // The shell that fork started waits three seconds unclaimed, then ends itself.
    let idle = ready_shells(&dir, 1).remove(0);
    assert!(!runtime_niceness(&idle).is_empty());
    let t = std::time::Instant::now();
    while !runtime_niceness(&idle).is_empty() || dir.join("sandboxes").join(&idle).exists() {
        assert!(t.elapsed().as_secs() < 30, "idle shell {idle} never ended");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(shells(&dir), (Vec::new(), 0));
}

#[test]
fn ls_all_lists_restore_shells_which_end_once_no_sandbox_of_their_kind_is_left() {
    let dir = private_dir("shells-orphaned");
    let src = Sandbox::new_in(&dir);
    let child = Sandbox(ok_in(&dir, &["fork", &src.0, "-n", "1"]).trim().to_string(), dir.clone());
    let ready = ready_shells(&dir, 1);
    let all: serde_json::Value = serde_json::from_str(&ok_in(&dir, &["--json", "ls", "--all"])).unwrap();
    let mut listed: Vec<String> =
        all["shells"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_string()).collect();
    listed.sort();
    assert_eq!(listed, ready, "{all}");
    for shell in &ready {
        assert!(!ok_in(&dir, &["ls"]).contains(shell.as_str()), "{shell} is listed as a sandbox");
    }
    // While a sandbox of their kind lives, a reconciliation with no idle time keeps them.
    let reconcile = || {
        let out = bb_in(&dir).env("BRANCHBOX_SHELL_IDLE_S", "0").arg("ls").output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    reconcile();
    assert_eq!(shells(&dir).0, ready, "shells of a kind still in use were ended");
    ok_in(&dir, &["kill", &src.0, &child.0]);
    reconcile();
    assert_eq!(shells(&dir), (Vec::new(), 0), "shells outlived every sandbox of their kind");
    for shell in &ready {
        assert!(runtime_niceness(shell).is_empty(), "shell {shell} still runs");
        assert!(!dir.join("sandboxes").join(shell).exists());
    }
}

/// Writes `text` to `path` in sandbox `s`.
fn src_write(s: &Sandbox, path: &str, text: &str) {
    ok_in(&s.1, &["exec", &s.0, "--", "sh", "-c", &format!("printf %s {text} > {path}")]);
}
