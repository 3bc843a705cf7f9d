//! End-to-end: a process inside a real gVisor sandbox attacks the host through the agent's
//! pipes (`/proc/1/fd/1` and `/proc/1/fd/2` are the shim's pipes), and clients that stop
//! reading. The host must stay within its limits: calls end with the limit error, memory and
//! disk stay bounded, and abandoned work is cancelled.
//!
//! Run with `--test-threads=1`: the memory checks read this process's peak RSS.

mod common;

use branchbox_protocol::frame::{encode_header, write_raw};
use branchbox_protocol::{AgentClient, ClientError, Command, ExecSpec, Request};
use common::*;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

const MIB: u64 = 1024 * 1024;

/// Writes forged `stdout` frames to the agent's pipe. `probe FIRST LAST` sends one small frame
/// to each id (the one that reaches the caller says its id); `flood ID MIB` sends MIB MiB to
/// one id; `spray FIRST N MIB` sends MIB MiB spread over the N ids from FIRST. Each frame is one write of less than PIPE_BUF bytes, so it is atomic: killing the
/// writer (as a cancel does) never leaves half a frame in the pipe.
const FORGE: &str = r#"
import json, os, struct, sys
fd = os.open('/proc/1/fd/1', os.O_WRONLY)
def frame(i, body):
    h = json.dumps({"id": i, "reply": "stdout"}).encode()
    os.write(fd, struct.pack('>II', len(h), len(body)) + h + body)
if sys.argv[1] == 'probe':
    for i in range(int(sys.argv[2]), int(sys.argv[3])):
        frame(i, b'probe:%d\n' % i)
elif sys.argv[1] == 'spray':
    first, n, mib = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    body = b'x' * 4000
    for k in range(mib * 1024 * 1024 // 4000):
        frame(first + k % n, body)
else:
    body = b'x' * 4000
    for _ in range(int(sys.argv[3]) * 1024 * 1024 // 4000):
        frame(int(sys.argv[2]), body)
"#;

fn socket(s: &Sandbox) -> PathBuf {
    s.1.join("sandboxes").join(&s.0).join("agent.sock")
}

fn client(s: &Sandbox) -> AgentClient<UnixStream> {
    AgentClient::new(UnixStream::connect(socket(s)).expect("connect to the shim"))
}

fn argv(args: &[&str]) -> ExecSpec {
    ExecSpec::new(Command::Argv(args.iter().map(|a| a.to_string()).collect()))
}

/// A `VmHWM`/`VmRSS` line of /proc/PID/status, in bytes.
fn status_bytes(pid: &str, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let line = text.lines().find(|l| l.starts_with(field)).expect("field");
    line.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()).expect("kB") * 1024
}

#[test]
fn forged_output_frames_end_the_call_at_the_cap_with_memory_bounded() {
    let s = Sandbox::new();
    put_text(&s, "/root/forge.py", FORGE);
    let mut c = client(&s);
    // The shim numbers requests itself: find out which number the next one gets.
    let probe = c.exec(argv(&["python3", "/root/forge.py", "probe", "1", "2000"]), None).unwrap();
    let text = String::from_utf8_lossy(&probe.stdout).into_owned();
    let seen: u64 = text.trim().strip_prefix("probe:").and_then(|n| n.parse().ok()).expect("probe id");
    let next = (seen + 1).to_string();

    // Reset the peak RSS, then let the sandbox send 96 MiB against a 4 MiB cap.
    std::fs::write("/proc/self/clear_refs", "5").expect("reset VmHWM");
    let before = status_bytes("self", "VmRSS:");
    let mut spec = argv(&["python3", "/root/forge.py", "flood", &next, "96"]);
    spec.output_cap = Some(4 * MIB);
    let err = c.exec(spec, None).unwrap_err();
    let grew = status_bytes("self", "VmHWM:").saturating_sub(before);
    match &err {
        ClientError::LimitExceeded { limit, .. } => assert_eq!(*limit, 4 * MIB),
        other => panic!("expected the output limit, got {other}"),
    }
    assert!(grew < 32 * MIB, "the host's memory grew by {grew} bytes for a 4 MiB cap");
    drop(c);
    assert_eq!(s.sh("echo still here").trim(), "still here");
}

#[test]
fn a_client_that_stops_reading_is_slowed_then_cut_off_and_its_command_cancelled() {
    let s = Sandbox::new();
    let shim = std::fs::read_to_string(s.1.join("sandboxes").join(&s.0).join("shim.pid")).unwrap();
    let shim = shim.trim();
    let mut stuck = UnixStream::connect(socket(&s)).unwrap();
    let mut spec = argv(&["yes", "branchbox"]);
    spec.output_cap = Some(u64::MAX);
    write_raw(&mut stuck, &encode_header(1, &Request::Exec(spec)), b"").unwrap();
    // Not reading for a few seconds used to take the shim past a gigabyte.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let peak = status_bytes(shim, "VmHWM:");
    assert!(peak < 64 * MIB, "the shim holds {peak} bytes for a client that does not read");
    // Another client is served once the shim gives up on the stuck one.
    assert_eq!(s.sh("echo served").trim(), "served");
    eventually("the stuck client's command to be cancelled", || {
        !s.sh_output("pgrep -x yes").status.success()
    });
    drop(stuck);
}

#[test]
fn a_client_that_hangs_up_has_its_command_cancelled() {
    let s = Sandbox::new();
    let mut c = UnixStream::connect(socket(&s)).unwrap();
    write_raw(&mut c, &encode_header(1, &Request::Exec(argv(&["sleep", "600"]))), b"").unwrap();
    eventually("the command to start", || s.sh_output("pgrep -x sleep").status.success());
    drop(c);
    eventually("the command to be cancelled", || !s.sh_output("pgrep -x sleep").status.success());
}

#[test]
fn a_flood_of_the_containers_stderr_stays_within_the_capped_log() {
    let s = Sandbox::new();
    s.sh("yes 'written to the agent stderr' | head -c 20000000 > /proc/1/fd/2");
    let dir = s.1.join("sandboxes").join(&s.0);
    let now = std::fs::metadata(dir.join("shim.log")).map(|m| m.len()).unwrap_or(0);
    let older = std::fs::metadata(dir.join("shim.log.1")).map(|m| m.len()).unwrap_or(0);
    assert!(now <= MIB && older <= MIB, "shim.log has {now} bytes and shim.log.1 {older}");
    assert!(older > 0, "the flood never reached the log");
    assert_eq!(s.sh("echo still here").trim(), "still here");
}

#[test]
fn an_over_long_argv_fails_saying_what_fits() {
    let s = Sandbox::new();
    let long = "a".repeat(10_000);
    let mut args = vec!["exec", s.0.as_str(), "--", "echo"];
    args.extend(std::iter::repeat_n(long.as_str(), 10));
    let err = String::from_utf8_lossy(&run(&args).stderr).into_owned();
    assert!(err.contains("over the limit of 65472 bytes") && err.contains("stdin or a file"), "{err}");
}

#[test]
fn a_sandbox_that_forges_past_a_host_limit_is_flagged() {
    let s = Sandbox::new();
    put_text(&s, "/root/forge.py", FORGE);
    let probe = ok(&["exec", &s.0, "--", "python3", "/root/forge.py", "probe", "1", "5000"]);
    let seen: u64 = probe.trim().strip_prefix("probe:").and_then(|n| n.parse().ok()).expect("probe id");
    let listed = |id: &str| -> serde_json::Value {
        let all: serde_json::Value = serde_json::from_str(&ok(&["ls", "--json"])).expect("ls --json");
        all.as_array().and_then(|a| a.iter().find(|v| v["id"] == id).cloned()).expect("listed")
    };
    assert!(listed(&s.0).get("flagged").is_none(), "flagged before anything happened");
    // The next command's request gets one of the next few numbers; each gets 2 MiB forged
    // against a 1 MiB cap.
    let first = (seen + 1).to_string();
    let out = run(&[
        "exec",
        &s.0,
        "--output-cap",
        "1048576",
        "--",
        "python3",
        "/root/forge.py",
        "spray",
        &first,
        "4",
        "8",
    ]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success() && err.contains("went over the host's limit"), "{err}");
    let flagged = listed(&s.0)["flagged"].as_str().map(str::to_string).expect("the sandbox is flagged");
    assert!(flagged.contains("the command's output"), "{flagged}");
    assert!(ok(&["ls"]).contains("[flagged:"), "ls does not show the flag");
    assert_eq!(s.sh("echo still here").trim(), "still here");
}
