//! Hostile workloads on real gVisor sandboxes: each must leave its sandbox answering (or end
//! it with the right reason), leave other sandboxes answering and the host responsive, and
//! leave nothing behind once the sandbox is killed.

mod common;

use common::*;
use std::path::PathBuf;

/// Creates a sandbox with extra `create` flags (limits).
fn create(flags: &[&str]) -> Sandbox {
    let mut args = vec!["create", "--backend", "gvisor"];
    args.extend_from_slice(flags);
    Sandbox(ok(&args).trim().to_string(), data_dir().to_path_buf())
}

fn sandbox_dir(id: &str) -> PathBuf {
    data_dir().join("sandboxes").join(id)
}

/// Why the sandbox's runtime ended, as the shim recorded it.
fn ended(id: &str) -> Option<serde_json::Value> {
    let text = std::fs::read(sandbox_dir(id).join("ended.json")).ok()?;
    serde_json::from_slice(&text).ok()
}

fn shim_log(id: &str) -> String {
    std::fs::read_to_string(sandbox_dir(id).join("shim.log")).unwrap_or_default()
}

/// The host can still start processes (a host out of pids or memory cannot).
fn host_responsive() {
    let out = std::process::Command::new("true").output().expect("the host cannot start a process");
    assert!(out.status.success());
}

/// Host processes whose command line names `id`.
fn host_processes_of(id: &str) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter(|e| e.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()))
        .filter_map(|e| {
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            cmd.contains(id).then_some(cmd)
        })
        .collect()
}

/// Kills the sandbox and checks that nothing of it is left: runsc container, shim or runsc
/// processes, its directory, its host cgroups.
fn kill_and_check_nothing_leaks(s: Sandbox) {
    let id = s.0.clone();
    std::mem::forget(s);
    ok(&["kill", &id]);
    assert!(!runsc_containers().contains(&id), "runsc still lists {id}");
    assert!(!sandbox_dir(&id).exists(), "the sandbox directory of {id} is left");
    eventually("the sandbox's host processes to exit", || host_processes_of(&id).is_empty());
    for controller in ["memory", "pids"] {
        let base = PathBuf::from("/sys/fs/cgroup").join(controller).join("branchbox");
        let left: Vec<String> = std::fs::read_dir(&base)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(&id))
                    .collect()
            })
            .unwrap_or_default();
        assert!(left.is_empty(), "host {controller} cgroups left: {left:?}");
    }
}

/// The checks every hostile test ends with.
fn aftermath(hostile: Sandbox, bystander: &Sandbox) {
    assert_eq!(bystander.sh("echo still here").trim(), "still here", "another sandbox stopped answering");
    host_responsive();
    kill_and_check_nothing_leaks(hostile);
}

#[test]
fn a_memory_hog_is_killed_inside_and_the_sandbox_keeps_answering() {
    let bystander = Sandbox::new();
    let s = create(&["--memory", "256"]);
    s.sh("echo kept > /root/state");
    let out = run(&["--json", "exec", &s.0, "--", "python3", "-c", "x = b'x' * (600 << 20)"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["status"]["oom_killed"], true, "{v}\n{}", shim_log(&s.0));
    assert_eq!(v["status"]["signal"], 9, "{v}");
    assert_eq!(s.sh("cat /root/state").trim(), "kept", "the sandbox lost its state");
    let plain = run(&["exec", &s.0, "-s", "--", "python3 -c \"x = b'x' * (600 << 20)\""]);
    assert_eq!(plain.status.code(), Some(137));
    assert!(String::from_utf8_lossy(&plain.stderr).contains("memory limit"));
    assert!(ended(&s.0).is_none());
    aftermath(s, &bystander);
}

#[test]
fn a_hundred_background_sleeps_fit_the_default_limits() {
    let bystander = Sandbox::new();
    let s = create(&[]);
    for _ in 0..100 {
        ok(&["spawn", &s.0, "--", "sleep", "600"]);
    }
    assert_eq!(s.sh("pgrep -c -x sleep").trim(), "100");
    aftermath(s, &bystander);
}

#[test]
fn a_thousand_background_processes_stop_at_the_process_limit_with_eagain() {
    let bystander = Sandbox::new();
    let s = create(&["--pids", "128"]);
    let script = fork_loop(1000);
    put_text(&s, "/root/forks.py", &script);
    let out = s.sh("python3 /root/forks.py");
    let (err, n) = out.trim().split_once(' ').expect("two words");
    assert_eq!(err, "EAGAIN", "{out}");
    let n: u32 = n.parse().unwrap();
    // gVisor 20221219's pids cgroup lets a fast fork loop past its limit (129, 134 and 141 of
    // 128 seen here, 158 in CI on a loaded host; the guest's own pids.current read 142 at
    // 141), so the count is held to the limit with half of it as slack: the point is EAGAIN
    // near the limit instead of the 1,000 forks the loop asks for.
    assert!(n > 64 && n <= 128 + 64, "{n} forks succeeded under a limit of 128: {out}\n{}", shim_log(&s.0));
    // At the limit, a command still runs (in the agent's reserve), so the user can clean up.
    s.sh("pkill -x python3; true");
    eventually("the processes to go", || s.sh("pgrep -c -x python3 || true").trim() == "0");
    aftermath(s, &bystander);
}

#[test]
fn a_fork_bomb_is_contained_to_its_own_sandbox() {
    let bystander = Sandbox::new();
    let s = create(&["--pids", "64"]);
    let pgid = ok(&["spawn", &s.0, "-s", "--", "bomb() { bomb | bomb & }; bomb"]).trim().to_string();
    let held = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| bomb_is_held(&s, &pgid)));
    if let Err(failure) = held {
        // Under ptrace the bomb can outrun the agent's breaker, whose looks wait behind it in
        // the sentry, and the host's task backstop ends its sandbox (docs/limits.md: 2 of 6
        // here). The host and every other sandbox are safe then too, and that is what is
        // asserted; anything else that ends the sandbox fails the test.
        match ended(&s.0) {
            Some(e) if e["reason"] == "process_limit" => {
                eprintln!("the bomb outran the breaker and the backstop ended its sandbox: {e}");
            }
            other => {
                eprintln!("the sandbox ended: {other:?}\n{}", shim_log(&s.0));
                std::panic::resume_unwind(failure);
            }
        }
    }
    aftermath(s, &bystander);
}

/// The breaker holds the bomb in `s` and the sandbox survives: the user stops it from inside.
fn bomb_is_held(s: &Sandbox, pgid: &str) {
    let workloads = || {
        s.sh("read n < /sys/fs/cgroup/pids/workloads/pids.current; echo $n")
            .trim()
            .parse::<u32>()
            .unwrap_or(0)
    };
    // The bomb grows to the limit and is held there, or the agent's breaker kills it first
    // (it does when the bomb churns); either way no more than the limit run at once.
    eventually("the bomb to reach its limit or be stopped", || {
        workloads() >= 32 || shim_log(&s.0).contains("a fork bomb")
    });
    // gVisor charges concurrent forks loosely: a bomb is past the limit (69, 131, and up to 409
    // of 64 seen) before the breaker's look, and a killed group's tasks take a while to go
    // under ptrace (375 read right after a kill in CI). So the bound is on what the bomb is
    // held to once the breaker has acted, not on the instant: within a small multiple of the
    // limit. An unchecked bomb stays past it (651 and more, never falling back).
    eventually("the bomb to be held within four times its limit", || workloads() <= 4 * 64);
    for _ in 0..10 {
        let held = workloads();
        assert!(held <= 4 * 64, "{held} tasks under a limit of 64, after it was held below four times that");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(s.sh("echo alive").trim(), "alive");
    // The user can stop it from inside: a command still runs at the limit.
    eventually("the bomb's processes to go", || {
        s.sh(&format!("kill -KILL -- -{pgid} 2>/dev/null; true"));
        workloads() < 8
    });
    assert!(ended(&s.0).is_none(), "the sandbox ended: {:?}\n{}", ended(&s.0), shim_log(&s.0));
    assert_eq!(s.sh("echo alive").trim(), "alive");
}

#[test]
fn an_output_flood_is_capped_and_a_background_one_held_to_its_tail() {
    let bystander = Sandbox::new();
    let s = create(&[]);
    let out = run(&["exec", &s.0, "--output-cap", "1048576", "-s", "--", "head -c 300000000 /dev/zero"]);
    assert!(out.status.success());
    assert_eq!(out.stdout.len(), 1 << 20);
    assert!(String::from_utf8_lossy(&out.stderr).contains("output cap"));
    ok(&["spawn", &s.0, "--", "yes", "flood"]);
    s.sh("sleep 2");
    // The agent keeps a bounded tail of a background process's output, not all of it.
    let rss_kib: u64 = s.sh("awk '/^VmRSS/ {print $2}' /proc/1/status").trim().parse().expect("agent RSS");
    assert!(rss_kib < 64 * 1024, "the agent holds {rss_kib} KiB after a background flood");
    aftermath(s, &bystander);
}

#[test]
fn a_disk_filler_is_killed_and_its_file_can_be_deleted() {
    let bystander = Sandbox::new();
    let s = create(&["--memory", "256"]);
    let out =
        run(&["--json", "exec", &s.0, "--", "dd", "if=/dev/zero", "of=/root/fill", "bs=1M", "count=1000"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["status"]["oom_killed"], true, "{v}\n{}", shim_log(&s.0));
    let size: u64 = s.sh("stat -c %s /root/fill").trim().parse().unwrap();
    assert!(size < 300 << 20, "the filler wrote {size} bytes past a 256 MiB limit");
    s.sh("rm /root/fill");
    let shmem_kib: u64 = s.sh("awk '/^Shmem:/ {print $2}' /proc/meminfo").trim().parse().expect("Shmem");
    assert!(shmem_kib < 64 * 1024, "{shmem_kib} KiB of files left after rm");
    assert_eq!(s.sh("echo alive").trim(), "alive");
    aftermath(s, &bystander);
}

#[test]
fn an_upload_past_the_runtime_allowance_ends_the_sandbox_with_the_memory_reason() {
    let bystander = Sandbox::new();
    // 64 MiB: the host's backstop is the limit plus the runtime's allowance (about 330 MiB).
    // The agent itself writes an upload, and the watcher never kills the agent, so only the
    // backstop can stop it.
    let s = create(&["--memory", "64"]);
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(600 << 20).unwrap();
    let out = run(&["files", "put", &s.0, big.to_str().unwrap(), "/root/big"]);
    assert!(!out.status.success(), "600 MiB fit in a 64 MiB sandbox");
    eventually("the shim to record why the sandbox ended", || ended(&s.0).is_some());
    let e = ended(&s.0).unwrap();
    assert_eq!(e["reason"], "memory_limit", "{e}");
    aftermath(s, &bystander);
}

#[test]
fn processes_that_ignore_sigterm_end_with_their_sandbox() {
    let bystander = Sandbox::new();
    let s = create(&[]);
    ok(&["spawn", &s.0, "-s", "--", "trap '' TERM; sleep 600"]);
    ok(&[
        "spawn",
        &s.0,
        "--",
        "python3",
        "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)",
    ]);
    let out = run(&["exec", &s.0, "--timeout", "1", "-s", "--", "trap '' TERM; sleep 600"]);
    assert_eq!(out.status.code(), Some(124));
    s.sh("pkill -TERM -x sleep; pkill -TERM -x python3; true");
    assert_eq!(s.sh("pgrep -c -x sleep").trim(), "1", "SIGTERM was not ignored: the test proves nothing");
    aftermath(s, &bystander);
}

#[test]
fn limits_and_the_hostname_file_hold_in_a_forked_child() {
    let bystander = Sandbox::new();
    let s = create(&["--memory", "256", "--pids", "64"]);
    assert_eq!(s.sh("cat /etc/hostname"), s.sh("hostname"), "/etc/hostname is the build host's");
    let v: serde_json::Value = serde_json::from_str(&ok(&["--json", "fork", &s.0, "-n", "1"])).unwrap();
    let child = Sandbox::adopt(v["children"][0]["id"].as_str().expect("a child"));
    assert_eq!(child.sh("cat /etc/hostname"), child.sh("hostname"), "/etc/hostname kept the source's name");
    assert_ne!(child.sh("hostname"), s.sh("hostname"));
    let out = run(&["--json", "exec", &child.0, "--", "python3", "-c", "x = b'x' * (600 << 20)"]);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(r["status"]["oom_killed"], true, "{r}\n{}", shim_log(&child.0));
    // Each child becomes a `sleep`: 63 Python children would hold about their own memory limit
    // between them (CI once saw the watcher kill the loop at 256 MiB, right after the OOM
    // above), and the point here is the process limit.
    let forks = child.sh("python3 -c 'import os\nn = 0\ntry:\n    while n < 200:\n        if os.fork() == 0:\n            os.execv(\"/bin/sleep\", [\"sleep\", \"60\"])\n        n += 1\nexcept OSError as e:\n    print(e.errno, n)'");
    assert!(forks.trim().starts_with("11 "), "fork past the limit did not fail with EAGAIN: {forks}");
    kill_and_check_nothing_leaks(child);
    aftermath(s, &bystander);
}
