//! End-to-end: the `branchbox` CLI against real gVisor sandboxes on this host.

mod common;

use common::*;

#[test]
fn python_runs_in_a_sandbox() {
    let s = Sandbox::new();
    let out = s.sh("python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2], sum(range(10)))'");
    assert_eq!(out.trim(), "3.11 45");
}

#[test]
fn a_one_mib_binary_file_round_trips_byte_exact() {
    let s = Sandbox::new();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.bin");
    let back = dir.path().join("out.bin");
    let data: Vec<u8> = (0..1024 * 1024u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    std::fs::write(&src, &data).unwrap();
    ok(&["files", "put", &s.0, src.to_str().unwrap(), "/root/blob.bin"]);
    assert_eq!(s.sh("sha256sum < /root/blob.bin | cut -c1-64").trim().len(), 64);
    ok(&["files", "get", &s.0, "/root/blob.bin", back.to_str().unwrap()]);
    assert!(std::fs::read(&back).unwrap() == data, "file changed on the way");
}

#[test]
fn fork_children_continue_the_running_process_and_diverge_in_files() {
    let src = Sandbox::new();
    put_text(&src, "/root/counter.py", COUNTER);
    ok(&["spawn", &src.0, "--", "python3", "/root/counter.py"]);
    let before = ask_count(&src);
    let pid = counter_pid(&src);
    let out = ok(&["--json", "fork", &src.0, "-n", "3"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let kids: Vec<Sandbox> = v["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            assert_eq!(c["ok"], true, "child failed: {c}");
            Sandbox::adopt(c["id"].as_str().unwrap())
        })
        .collect();
    assert_eq!(kids.len(), 3);
    for (i, k) in kids.iter().enumerate() {
        assert_eq!(counter_pid(k), pid, "the counting process is not the source's");
        assert!(ask_count(k) >= before, "child {i} restarted its counter instead of continuing");
        k.sh(&format!("echo child-{i} > /root/mine"));
    }
    for (i, k) in kids.iter().enumerate() {
        assert_eq!(k.sh("cat /root/mine").trim(), format!("child-{i}"));
    }
    assert!(!src.sh_output("test -e /root/mine").status.success(), "a child's file leaked into the source");
    let ids: std::collections::BTreeSet<String> = kids.iter().map(|k| k.sh("cat /etc/machine-id")).collect();
    assert_eq!(ids.len(), 3, "children share a machine-id");
    let hosts: std::collections::BTreeSet<String> = kids.iter().map(|k| k.sh("hostname")).collect();
    assert_eq!(hosts.len(), 3, "children share a hostname");
    let after = ask_count(&src);
    assert!(after > before, "the source stopped counting");
}

#[test]
fn a_snapshot_restores_later_from_a_new_cli_process_with_state_intact() {
    let src = Sandbox::new();
    put_text(&src, "/root/counter.py", COUNTER);
    ok(&["spawn", &src.0, "--", "python3", "/root/counter.py"]);
    src.sh("echo kept > /root/state");
    let before = ask_count(&src);
    let name = format!("keep-{}", std::process::id());
    let snap = ok(&["snapshot", &src.0, "--name", &name]).trim().to_string();
    assert!(snap.starts_with("snap-"));
    drop(src);
    assert!(ok(&["snapshots"]).contains(&snap));
    let restored = Sandbox::adopt(&ok(&["restore", &name]));
    assert_eq!(restored.sh("cat /root/state").trim(), "kept");
    assert!(ask_count(&restored) >= before);
    let again = Sandbox::adopt(&ok(&["restore", &snap]));
    assert_eq!(again.sh("cat /root/state").trim(), "kept");
}

#[test]
fn timed_out_command_loses_its_whole_process_group() {
    let s = Sandbox::new();
    let out = run(&["exec", &s.0, "--timeout", "0.5", "-s", "--", "sleep 100 & sleep 100"]);
    assert_eq!(out.status.code(), Some(124), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("timed out"));
    eventually("the background sleep to die", || !s.sh_output("pgrep -x sleep").status.success());
    assert_eq!(s.sh("echo still here").trim(), "still here");
}

#[test]
fn output_above_the_cap_is_cut_and_reported() {
    let s = Sandbox::new();
    let out =
        run(&["exec", &s.0, "--output-cap", "100", "-s", "--", "head -c 100000 /dev/zero | tr '\\0' x"]);
    assert!(out.status.success());
    assert_eq!(out.stdout.len(), 100);
    assert!(String::from_utf8_lossy(&out.stderr).contains("output cap"));
}

#[test]
fn bad_ids_counts_and_hosts_get_clear_errors_and_lose_nothing() {
    let s = Sandbox::new();
    s.sh("echo precious > /root/p");
    assert!(fails(&["exec", "sbx-0000000000000000", "--", "true"]).contains("not found"));
    assert!(fails(&["exec", "not-an-id", "--", "true"]).contains("not a sandbox id"));
    assert!(fails(&["restore", "snap-0000000000000000"]).contains("not found"));
    assert!(fails(&["restore", "no-such-name"]).contains("not found"));
    assert!(fails(&["fork", &s.0, "-n", "0"]).contains("out of range"));
    assert!(fails(&["fork", &s.0, "-n", "100000"]).contains("out of range"));
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
    assert!(fails(&["exec", &s.0, "--", "/no/such/program"]).contains("cannot start"));
    assert_eq!(s.sh("cat /root/p").trim(), "precious");
}

#[test]
fn paused_sandboxes_refuse_exec_until_resumed() {
    let s = Sandbox::new();
    ok(&["pause", &s.0]);
    assert!(fails(&["exec", &s.0, "--", "true"]).contains("paused"));
    ok(&["resume", &s.0]);
    assert_eq!(s.sh("echo back").trim(), "back");
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

#[test]
fn json_output_is_machine_readable() {
    let s = Sandbox::new();
    let v: serde_json::Value = serde_json::from_str(&ok(&["--json", "ls"])).unwrap();
    assert!(v.as_array().unwrap().iter().any(|x| x["id"] == s.0.as_str() && x["alive"] == true));
    let out = run(&["--json", "exec", &s.0, "-s", "--", "echo hi; exit 7"]);
    assert_eq!(out.status.code(), Some(7));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v["stdout"].as_str(), v["status"]["code"].as_i64()), (Some("hi\n"), Some(7)));
    let out = run(&["--json", "exec", "sbx-0000000000000000", "--", "true"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["code"], "not_found");
}
