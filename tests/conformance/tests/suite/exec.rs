//! Commands: exit codes, output streams, environment, working directory, standard input,
//! timeouts, the output cap, and pause.

use branchbox_conformance::{eventually, Ctx, Shell};
use std::io::Write;
use std::process::Stdio;

pub fn exit_codes_and_output_come_back_separately(c: &Ctx) {
    let s = c.create(&[]);
    let out = c.run(&["exec", &s.id, "-s", "--", "echo out; echo err >&2; exit 7"]);
    assert_eq!(out.status.code(), Some(7), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout, b"out\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("err"), "stderr lost");
    // A command killed by a signal exits as a shell reports it: 128 + the signal.
    assert_eq!(c.run(&["exec", &s.id, "-s", "--", "kill -9 $$"]).status.code(), Some(137));
    let py = s.sh("python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2], sum(range(10)))'");
    assert_eq!(py.trim(), "3.11 45");
    let out = c.run(&["--json", "exec", &s.id, "-s", "--", "echo hi; echo oops >&2; exit 3"]);
    assert_eq!(out.status.code(), Some(3));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("exec --json");
    assert_eq!(v["stdout"], "hi\n", "{v}");
    assert_eq!(v["stderr"], "oops\n", "{v}");
    assert_eq!(v["status"]["code"], 3, "{v}");
    assert!(c.fails(&["exec", &s.id, "--", "/no/such/program"]).contains("cannot start"));
}

pub fn environment_working_directory_and_stdin_reach_the_command(c: &Ctx) {
    let s = c.create(&[]);
    let out = c.ok(&[
        "exec",
        &s.id,
        "-e",
        "GREETING=hello world",
        "-e",
        "EMPTY=",
        "--cwd",
        "/tmp",
        "-s",
        "--",
        "printf '%s|%s|%s|' \"$GREETING\" \"${EMPTY-unset}\" \"$(pwd)\"; cat",
    ]);
    assert_eq!(out, "hello world||/tmp|", "environment or working directory lost");
    let mut child = c
        .bb()
        .args(["exec", &s.id, "-i", "--", "sha256sum"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn branchbox");
    child.stdin.take().expect("stdin").write_all(b"abc").expect("write stdin");
    let out = child.wait_with_output().expect("exec -i");
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .starts_with("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
        "standard input did not arrive whole: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = c.fails(&["exec", &s.id, "--cwd", "/no/such/dir", "--", "true"]);
    assert!(err.contains("cannot start"), "{err}");
}

pub fn a_timeout_kills_the_whole_process_group(c: &Ctx) {
    let s = c.create(&[]);
    let out = c.run(&["exec", &s.id, "--timeout", "0.5", "-s", "--", "sleep 100 & sleep 100"]);
    assert_eq!(out.status.code(), Some(124), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("timed out"));
    eventually("the background sleep to die", || !s.sh_output("pgrep -x sleep").status.success());
    assert_eq!(s.sh("echo still here").trim(), "still here");
}

pub fn output_above_the_cap_is_cut_and_reported(c: &Ctx) {
    let s = c.create(&[]);
    let line = "head -c 100000 /dev/zero | tr '\\0' x";
    let out = c.run(&["exec", &s.id, "--output-cap", "100", "-s", "--", line]);
    assert!(out.status.success());
    assert_eq!(out.stdout, vec![b'x'; 100]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("output cap"));
}

pub fn a_paused_sandbox_refuses_exec_until_resumed(c: &Ctx) {
    let s = c.create(&[]);
    s.sh("echo kept > /root/state");
    c.ok(&["pause", &s.id]);
    assert!(c.fails(&["exec", &s.id, "--", "true"]).contains("paused"));
    c.ok(&["resume", &s.id]);
    assert_eq!(s.sh("cat /root/state").trim(), "kept");
}
