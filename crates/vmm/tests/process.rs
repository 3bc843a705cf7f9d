//! VMs in processes: the `branchbox-vmm` binary driven over its control socket, and the pool
//! of pre-started processes that forks into them (docs/microvm.md, "Where VMs live").

mod common;

use branchbox_vmm::process::protocol::{self, ErrorKind, Request, Response, VmState, PROTOCOL_VERSION};
use branchbox_vmm::process::{spawn, ClientError, VmmPool, VmmProcess};
use branchbox_vmm::synthetic::testguest::{Command, DATA_BASE};
use branchbox_vmm::VmConfig;
use std::io::{BufRead, Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

const PAGE: u64 = 4096;

fn program() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_branchbox-vmm"))
}

fn fill(base: u64, pages: u64, seed: u64) -> Command {
    Command::Fill { base, count: pages, stride: PAGE, seed }
}

fn check(base: u64, pages: u64, seed: u64) -> Command {
    Command::Check { base, count: pages, stride: PAGE, seed }
}

/// A process running the test guest, which has answered one ping.
fn booted(config: VmConfig) -> VmmProcess {
    let mut p = VmmProcess::start(program(), config).unwrap();
    p.boot_test_guest().unwrap();
    p.resume().unwrap();
    assert_eq!(p.call(Command::Ping).unwrap().seq, 1);
    p
}

fn kind(e: &ClientError) -> Option<ErrorKind> {
    e.remote().map(|r| r.kind)
}

/// The `Seccomp:` mode of `pid`'s thread named `name` (2 = filter).
fn thread_seccomp(pid: u32, name: &str) -> Option<String> {
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() == name {
            let status = std::fs::read_to_string(task.path().join("status")).ok()?;
            return status.lines().find_map(|l| l.strip_prefix("Seccomp:").map(|v| v.trim().to_string()));
        }
    }
    None
}

#[test]
fn ten_children_forked_into_pooled_processes_keep_their_own_state() {
    if common::kvm_or_skip().is_none() {
        return;
    }
    let config = VmConfig { mem_size: 16 << 20, ..common::small() };
    let shared = DATA_BASE;
    let own = DATA_BASE + (1 << 20);
    let mut parent = booted(config);
    assert!(parent.confined(), "the vCPU thread runs unconfined");
    assert_eq!(thread_seccomp(parent.pid(), "vcpu0").as_deref(), Some("2"));
    assert_eq!(parent.call(fill(shared, 16, 1)).unwrap().status, 0);
    // A paused guest runs nothing; snapshots need it paused.
    parent.pause().unwrap();
    assert_eq!(kind(&parent.call(Command::Ping).unwrap_err()), Some(ErrorKind::State));
    let dir = tempfile::tempdir().unwrap();
    parent.snapshot(dir.path()).unwrap();

    let pool = VmmPool::new(program(), config, 10);
    pool.wait_ready(Duration::from_secs(120)).unwrap();
    let fork = pool.fork(dir.path(), "vm", 10, true);
    assert_eq!((fork.from_pool, fork.started_on_clock), (10, 0));
    let mut children: Vec<VmmProcess> = fork.children.into_iter().map(Result::unwrap).collect();
    let mut pids: Vec<u32> = children.iter().map(VmmProcess::pid).collect();
    pids.push(parent.pid());
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(pids.len(), 11, "children share processes");

    for (i, child) in children.iter_mut().enumerate() {
        assert_eq!(child.call(fill(own, 16, 1000 + i as u64)).unwrap().status, 0);
    }
    parent.resume().unwrap();
    parent.call(fill(shared, 16, 2)).unwrap();
    parent.call(fill(own, 16, 3)).unwrap();
    for (i, child) in children.iter_mut().enumerate() {
        let mine = child.call(check(own, 16, 1000 + i as u64)).unwrap();
        assert_eq!(mine.status, 0, "child {i} lost its own writes: {mine:?}");
        let before = child.call(check(shared, 16, 1)).unwrap();
        assert_eq!(before.status, 0, "child {i} saw the parent's later writes");
        assert_eq!(before.seq, 5, "child {i}'s registers are not its own");
    }
    assert_eq!(parent.call(check(shared, 16, 2)).unwrap().status, 0);
    for child in children {
        assert!(child.shutdown().unwrap().is_some_and(|s| s.success()));
    }
}

#[test]
fn a_fork_larger_than_the_pool_starts_the_rest_on_the_clock_and_says_so() {
    if common::kvm_or_skip().is_none() {
        return;
    }
    let config = common::small();
    let mut parent = booted(config);
    parent.pause().unwrap();
    let dir = tempfile::tempdir().unwrap();
    parent.snapshot(dir.path()).unwrap();
    let pool = VmmPool::new(program(), config, 2);
    pool.wait_ready(Duration::from_secs(60)).unwrap();
    let fork = pool.fork(dir.path(), "vm", 5, false);
    assert_eq!((fork.from_pool, fork.started_on_clock), (2, 3));
    for child in fork.children {
        let mut child = child.unwrap();
        assert_eq!(child.status().unwrap().state, VmState::Paused);
        child.resume().unwrap();
        assert_eq!(child.call(Command::Ping).unwrap().seq, 2);
    }
    // The pool refills behind the fork.
    pool.wait_ready(Duration::from_secs(60)).unwrap();
    // A snapshot of another shape is refused by each child, which stays usable.
    let other = VmmPool::new(program(), VmConfig { mem_size: 4 << 20, ..config }, 0);
    let fork = other.fork(dir.path(), "vm", 1, false);
    let err = fork.children.into_iter().next().unwrap().err().unwrap();
    assert_eq!(kind(&err), Some(ErrorKind::Shape), "{err}");
    assert!(err.to_string().contains("restore it in a process (pool) of that shape"), "{err}");
}

#[test]
fn checkpoint_and_rollback_in_a_process() {
    if common::kvm_or_skip().is_none() {
        return;
    }
    let mut p = booted(common::small());
    let a = DATA_BASE;
    assert_eq!(p.call(fill(a, 8, 1)).unwrap().status, 0);
    p.pause().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The first checkpoint writes the base, the second a delta in a background writer.
    p.checkpoint(dir.path(), "c0").unwrap();
    p.resume().unwrap();
    assert_eq!(p.call(fill(a, 8, 2)).unwrap().seq, 3);
    p.pause().unwrap();
    p.checkpoint(dir.path(), "c1").unwrap();
    p.resume().unwrap();
    p.call(fill(a, 8, 3)).unwrap();
    assert_eq!(p.call(check(a, 8, 3)).unwrap().status, 0);
    p.pause().unwrap();
    p.rollback(dir.path(), "c1").unwrap();
    p.resume().unwrap();
    let back = p.call(check(a, 8, 2)).unwrap();
    assert_eq!((back.status, back.seq), (0, 4), "rollback to c1 did not restore memory and registers");
    p.pause().unwrap();
    p.rollback(dir.path(), "c0").unwrap();
    p.resume().unwrap();
    let back = p.call(check(a, 8, 1)).unwrap();
    assert_eq!((back.status, back.seq), (0, 3));
    // Relative paths are refused: the VMM's working directory is not the engine's.
    p.pause().unwrap();
    let err = p.rollback(Path::new("relative/dir"), "c0").unwrap_err();
    assert_eq!(kind(&err), Some(ErrorKind::Argument), "{err}");
}

#[test]
fn a_sigkilled_vmm_and_a_crashed_guest_are_reported_as_such() {
    if common::kvm_or_skip().is_none() {
        return;
    }
    let mut p = booted(common::small());
    // SAFETY: signals a process this test started.
    assert_eq!(unsafe { libc::kill(p.pid() as i32, libc::SIGKILL) }, 0);
    let err = p.status().unwrap_err();
    assert!(matches!(&err, ClientError::Exited { how, .. } if how.contains("SIGKILL")), "{err}");

    // A write above the guest's 4 GiB of page tables faults; with no IDT the guest
    // triple-faults.
    let mut p = booted(common::small());
    let err = p.call(fill(1 << 33, 1, 0)).unwrap_err();
    assert_eq!(kind(&err), Some(ErrorKind::Guest), "{err}");
    match p.status().unwrap().state {
        VmState::GuestExited { reason } => assert!(!reason.is_empty()),
        other => panic!("a crashed guest reported as {other:?}"),
    }
    assert_eq!(kind(&p.resume().unwrap_err()), Some(ErrorKind::State));
    assert!(p.shutdown().unwrap().is_some_and(|s| s.success()));
}

fn raw_reply(stream: &mut std::os::unix::net::UnixStream) -> Option<Response> {
    protocol::read_frame(stream).unwrap().map(|p| protocol::decode(&p).unwrap())
}

fn error_kind(r: Option<Response>) -> Option<ErrorKind> {
    match r {
        Some(Response::Error(e)) => Some(e.kind),
        _ => None,
    }
}

#[test]
fn bad_frames_are_refused_and_a_closed_socket_ends_the_process() {
    if common::kvm_or_skip().is_none() {
        return;
    }
    let mut s = spawn(program(), common::small()).unwrap();
    // Anything before the handshake is refused.
    s.stream.write_all(&protocol::encode(&Request::Status).unwrap()).unwrap();
    assert_eq!(error_kind(raw_reply(&mut s.stream)), Some(ErrorKind::NoHello));
    s.stream
        .write_all(&protocol::encode(&Request::Hello { version: PROTOCOL_VERSION + 1 }).unwrap())
        .unwrap();
    assert_eq!(error_kind(raw_reply(&mut s.stream)), Some(ErrorKind::Version));
    s.stream.write_all(&protocol::encode(&Request::Hello { version: PROTOCOL_VERSION }).unwrap()).unwrap();
    assert!(matches!(raw_reply(&mut s.stream), Some(Response::Hello { .. })));
    // A frame that is not a request, then an unknown field: refused, the connection goes on.
    for junk in [&b"\xff\xfenot json"[..], br#"{"pause":{"now":true}}"#, br#"{"hello":{"version":1}} {}"#] {
        let mut frame = (junk.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(junk);
        s.stream.write_all(&frame).unwrap();
        assert_eq!(error_kind(raw_reply(&mut s.stream)), Some(ErrorKind::Protocol));
    }
    s.stream.write_all(&protocol::encode(&Request::Status).unwrap()).unwrap();
    assert!(matches!(raw_reply(&mut s.stream), Some(Response::Status(_))));
    // A length over the limit: refused with a reason, then the process closes and exits.
    s.stream.write_all(&u32::MAX.to_le_bytes()).unwrap();
    assert_eq!(error_kind(raw_reply(&mut s.stream)), Some(ErrorKind::Protocol));
    let mut rest = Vec::new();
    s.stream.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    assert!(s.child.wait().unwrap().success());

    // An engine that just closes the socket leaves no process behind.
    let mut s = spawn(program(), common::small()).unwrap();
    s.stream.write_all(&protocol::encode(&Request::Hello { version: PROTOCOL_VERSION }).unwrap()).unwrap();
    assert!(matches!(raw_reply(&mut s.stream), Some(Response::Hello { .. })));
    drop(s.stream);
    assert!(s.child.wait().unwrap().success());
}

const CHILD_ENV: &str = "BRANCHBOX_PROCESS_TEST_ENGINE";

/// Whether `pid` is gone (or a zombie nobody has reaped yet: it runs nothing).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn killing_the_engine_leaves_no_vmm_processes() {
    if common::kvm_or_skip().is_none() {
        return;
    }
    if std::env::var_os(CHILD_ENV).is_some() {
        // The engine: two idle pooled processes, and one whose guest is busy in a command
        // that would run for minutes (its control thread does not read the socket then).
        let pool = VmmPool::new(program(), common::small(), 2);
        pool.wait_ready(Duration::from_secs(60)).unwrap();
        let mut busy = booted(common::small());
        let count = Command::Count { base: DATA_BASE, iterations: 1 << 42, mask: 0xff, seed: 1 };
        busy.send(&Request::Call { command: count }).unwrap();
        let idle = pool.fork(Path::new("/nonexistent"), "vm", 0, false);
        assert!(idle.children.is_empty());
        let mut pids: Vec<u32> = vec![busy.pid()];
        let taken = [pool.get().unwrap(), pool.get().unwrap()];
        pids.extend(taken.iter().map(VmmProcess::pid));
        let line: Vec<String> = pids.iter().map(u32::to_string).collect();
        println!("PIDS {}", line.join(" "));
        std::io::stdout().flush().unwrap();
        std::thread::sleep(Duration::from_secs(600));
        return;
    }
    let mut engine = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "killing_the_engine_leaves_no_vmm_processes", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(engine.stdout.take().unwrap());
    let mut pids = Vec::new();
    let mut line = String::new();
    while out.read_line(&mut line).unwrap() > 0 {
        // libtest prints "test NAME ... " before the test's own output, on the same line.
        if let Some((_, rest)) = line.trim().split_once("PIDS ") {
            pids = rest.split(' ').map(|p| p.parse::<u32>().unwrap()).collect();
            break;
        }
        line.clear();
    }
    assert_eq!(pids.len(), 3, "the engine did not report its VMM processes");
    for &pid in &pids {
        assert!(!gone(pid), "VMM {pid} ended before the engine was killed");
    }
    engine.kill().unwrap();
    engine.wait().unwrap();
    // Bounded wait for the kernel to deliver the deaths (not a timing assertion).
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline && !pids.iter().all(|&p| gone(p)) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<u32> = pids.iter().copied().filter(|&p| !gone(p)).collect();
    assert!(left.is_empty(), "VMM processes {left:?} outlived their engine");
}
