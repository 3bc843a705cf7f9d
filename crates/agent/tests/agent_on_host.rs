//! The agent driven over its stdio pipes, as the gVisor shim drives it, but run directly on the
//! host so the protocol is checked in milliseconds. (The after-fork hook is not exercised here:
//! it would change the host's hostname and clock; the gVisor end-to-end tests cover it.)

use branchbox_protocol::frame::{read_frame, write_raw};
use branchbox_protocol::{
    AgentClient, ClientError, Command, ErrorCode, ExecSpec, Request, Response, Transport,
};
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::process::{Child, ChildStdin, ChildStdout, Stdio};

struct Pipes {
    input: ChildStdin,
    output: ChildStdout,
    timeout: Option<std::time::Duration>,
}

impl Read for Pipes {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if let Some(t) = self.timeout {
            use std::os::fd::AsRawFd;
            let mut fd = libc::pollfd { fd: self.output.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd for the duration of the call.
            if unsafe { libc::poll(&mut fd, 1, t.as_millis().min(i32::MAX as u128) as i32) } == 0 {
                return Err(std::io::ErrorKind::WouldBlock.into());
            }
        }
        self.output.read(buf)
    }
}

impl Transport for Pipes {
    fn set_read_timeout(&mut self, timeout: Option<std::time::Duration>) -> std::io::Result<()> {
        self.timeout = timeout;
        Ok(())
    }
}

impl Write for Pipes {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.input.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.input.flush()
    }
}

struct Agent {
    child: Child,
    client: AgentClient<Pipes>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn agent() -> Agent {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_branchbox-agent"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start agent");
    let pipes =
        Pipes { input: child.stdin.take().unwrap(), output: child.stdout.take().unwrap(), timeout: None };
    let mut client = AgentClient::new(pipes);
    client.hello().expect("hello");
    Agent { child, client }
}

fn sh(line: &str) -> ExecSpec {
    ExecSpec::new(Command::Shell(line.to_string()))
}

#[test]
fn exec_reports_output_and_exit_code() {
    let mut a = agent();
    let out = a.client.exec(sh("echo out; echo err >&2; exit 3"), None).unwrap();
    assert_eq!(out.stdout, b"out\n");
    assert_eq!(out.stderr, b"err\n");
    assert_eq!(out.status.code, Some(3));
    assert!(!out.status.timed_out && !out.status.truncated);
    let mut spec = ExecSpec::new(Command::Argv(vec!["printenv".into(), "GREETING".into()]));
    spec.env.insert("GREETING".into(), "hi there".into());
    spec.cwd = Some("/tmp".into());
    assert_eq!(a.client.exec(spec, None).unwrap().stdout, b"hi there\n");
}

#[test]
fn exec_feeds_stdin() {
    let mut a = agent();
    let input: Vec<u8> = (0..700_000u32).map(|i| (i % 251) as u8).collect();
    let out = a.client.exec(ExecSpec::new(Command::Argv(vec!["cat".into()])), Some(&input)).unwrap();
    assert_eq!(out.stdout.len(), input.len());
    assert!(out.stdout == input);
}

#[test]
fn missing_program_is_a_spawn_error_and_the_agent_keeps_serving() {
    let mut a = agent();
    let err = a.client.exec(ExecSpec::new(Command::Argv(vec!["/no/such/program".into()])), None).unwrap_err();
    assert!(matches!(err, ClientError::Agent { code: ErrorCode::SpawnFailed, .. }), "{err}");
    let err = a.client.exec(ExecSpec::new(Command::Argv(vec![])), None).unwrap_err();
    assert!(matches!(err, ClientError::Agent { code: ErrorCode::BadRequest, .. }), "{err}");
    a.client.ping().unwrap();
}

fn process_is_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn timeout_kills_the_whole_process_group() {
    let mut a = agent();
    let mut spec = sh("sleep 30 & echo $!; sleep 30");
    spec.timeout_ms = Some(300);
    let out = a.client.exec(spec, None).unwrap();
    assert!(out.status.timed_out);
    assert_eq!(out.status.signal, Some(libc_sigkill()));
    let pid: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("background pid");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !process_is_gone(pid) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(process_is_gone(pid), "grandchild {pid} survived the timeout");
}

fn libc_sigkill() -> i32 {
    9
}

#[test]
fn output_above_the_cap_is_cut_and_flagged() {
    let mut a = agent();
    let mut spec = sh("head -c 200000 /dev/zero");
    spec.output_cap = Some(1000);
    let out = a.client.exec(spec, None).unwrap();
    assert_eq!(out.stdout.len(), 1000);
    assert!(out.status.truncated);
    assert_eq!(out.status.code, Some(0));
}

#[test]
fn binary_file_round_trips_byte_exact() {
    let mut a = agent();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blob.bin");
    let p = path.to_str().unwrap();
    let data: Vec<u8> = (0..1024 * 1024u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let n = a.client.write_file(p, &mut data.as_slice(), Some(0o600), false, false).unwrap();
    assert_eq!(n, data.len() as u64);
    assert!(a.client.read_file_bytes(p, u64::MAX).unwrap() == data);
    let st = a.client.stat(p).unwrap();
    assert_eq!((st.size, st.mode), (data.len() as u64, 0o600));
}

#[test]
fn file_operations_work_and_fail_clearly() {
    let mut a = agent();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_string();
    a.client.mkdir(&format!("{d}/x/y"), true).unwrap();
    a.client.write_file(&format!("{d}/x/y/f"), &mut &b"abc"[..], None, false, false).unwrap();
    a.client.write_file(&format!("{d}/x/y/f"), &mut &b"def"[..], None, true, false).unwrap();
    a.client.write_file(&format!("{d}/new/deep/g"), &mut &b"g"[..], None, false, true).unwrap();
    assert_eq!(a.client.read_file_bytes(&format!("{d}/x/y/f"), 6).unwrap(), b"abcdef");
    a.client.rename(&format!("{d}/x/y/f"), &format!("{d}/x/f2")).unwrap();
    let names: Vec<String> =
        a.client.list_dir(&format!("{d}/x")).unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, vec!["f2".to_string(), "y".to_string()]);
    let err = a.client.remove(&format!("{d}/x"), false).unwrap_err();
    assert!(matches!(err, ClientError::Agent { code: ErrorCode::Io, .. }), "{err}");
    a.client.remove(&format!("{d}/x"), true).unwrap();
    let err = a.client.stat(&format!("{d}/x")).unwrap_err();
    assert!(matches!(err, ClientError::Agent { code: ErrorCode::NotFound, .. }), "{err}");
    let err = a.client.read_file_bytes("relative/path", 1).unwrap_err();
    assert!(matches!(err, ClientError::Agent { code: ErrorCode::BadRequest, .. }), "{err}");
    let err = a.client.write_file("/no/such/dir/file", &mut &b"x"[..], None, false, false).unwrap_err();
    assert!(matches!(err, ClientError::Agent { code: ErrorCode::NotFound, .. }), "{err}");
    a.client.ping().unwrap();
}

#[test]
fn background_processes_can_be_listed_signalled_and_waited_for() {
    let mut a = agent();
    let pid = a.client.spawn(sh("echo started; exec sleep 30")).unwrap();
    let quick = a.client.spawn(sh("echo quick")).unwrap();
    let procs = a.client.list_procs().unwrap();
    assert!(procs.iter().any(|p| p.pid == pid));
    assert!(a.client.wait(pid, Some(50)).unwrap().is_none(), "sleep 30 finished early");
    let q = a.client.wait(quick, None).unwrap().unwrap();
    assert_eq!((q.stdout.as_slice(), q.status.code), (&b"quick\n"[..], Some(0)));
    a.client.signal(pid, 15, false).unwrap();
    let done = a.client.wait(pid, Some(5000)).unwrap().expect("exited after SIGTERM");
    assert_eq!(done.status.signal, Some(15));
    assert_eq!(done.stdout, b"started\n");
    let err = a.client.wait(pid, None).unwrap_err();
    assert!(matches!(err, ClientError::Agent { code: ErrorCode::NotFound, .. }), "{err}");
}

#[test]
fn malformed_and_foreign_version_requests_get_errors_not_silence() {
    let mut a = agent();
    write_raw(a.client.stream_mut(), br#"{"id":9,"op":"launch_missiles"}"#, b"").unwrap();
    let f = read_frame::<Response, _>(a.client.stream_mut()).unwrap().unwrap();
    assert_eq!(f.id, 9);
    assert!(matches!(f.msg, Response::Error { code: ErrorCode::BadRequest, .. }));
    let r = a.client.call(branchbox_protocol::Request::Hello { version: 999 }, Vec::new()).unwrap_err();
    assert!(matches!(r, ClientError::Agent { code: ErrorCode::UnsupportedVersion, .. }), "{r}");
    assert!(a.client.info().unwrap().pid > 0);
}

#[test]
fn walk_lists_a_tree_with_full_paths_and_skips_excluded_directories() {
    let mut a = agent();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_string();
    for p in ["a/b/c", "skip/deep"] {
        std::fs::create_dir_all(dir.path().join(p)).unwrap();
    }
    std::fs::write(dir.path().join("a/b/c/f"), b"12345").unwrap();
    std::fs::write(dir.path().join("skip/deep/g"), b"x").unwrap();
    std::os::unix::fs::symlink("/etc", dir.path().join("link")).unwrap();
    let mut entries = a.client.walk(&d, &[format!("{d}/skip")]).unwrap();
    entries.sort_by(|x, y| x.name.cmp(&y.name));
    let names: Vec<String> = entries.iter().map(|e| e.name.trim_start_matches(&d).to_string()).collect();
    assert_eq!(names, vec!["/a", "/a/b", "/a/b/c", "/a/b/c/f", "/link"]);
    assert_eq!(entries[3].size, 5);
    assert_eq!(entries[4].kind, branchbox_protocol::FileKind::Symlink);
}

/// Reads frames until request `id` ends; returns the data bytes seen and the terminal answer.
fn drain(a: &mut Agent, id: u64) -> (u64, Response) {
    let mut bytes = 0;
    loop {
        let f = read_frame::<Response, _>(a.client.stream_mut()).unwrap().expect("the agent hung up");
        if f.id != id {
            continue;
        }
        if f.msg.is_terminal() {
            return (bytes, f.msg);
        }
        bytes += f.body.len() as u64;
    }
}

fn send(a: &mut Agent, id: u64, req: &Request) {
    write_raw(a.client.stream_mut(), &branchbox_protocol::frame::encode_header(id, req), b"").unwrap();
}

fn is_cancelled(r: &Response) -> bool {
    matches!(r, Response::Error { message, .. } if message.contains("cancelled"))
}

#[test]
fn fifos_and_devices_are_refused_not_read_forever() {
    let mut a = agent();
    let mut limits = a.client.limits();
    limits.timeout = Some(std::time::Duration::from_secs(10));
    a.client.set_limits(limits);
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo on a path we own.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for path in [fifo.to_str().unwrap(), "/dev/zero"] {
        let err = a.client.read_file_bytes(path, 1 << 20).unwrap_err();
        match &err {
            ClientError::Agent { code: ErrorCode::BadRequest, message } => {
                assert!(message.contains("not a regular file"), "{message}")
            }
            other => panic!("reading {path}: expected a refusal, got {other}"),
        }
    }
    a.client.ping().unwrap();
}

#[test]
fn a_file_over_the_callers_maximum_is_refused_up_front() {
    let mut a = agent();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("f");
    std::fs::write(&p, vec![7u8; 5000]).unwrap();
    let err = a.client.read_file_bytes(p.to_str().unwrap(), 4999).unwrap_err();
    assert!(
        matches!(&err, ClientError::Agent { code: ErrorCode::BadRequest, message } if message.contains("4999")),
        "{err}"
    );
    assert_eq!(a.client.read_file_bytes(p.to_str().unwrap(), 5000).unwrap().len(), 5000);
}

#[test]
fn pseudo_files_that_say_they_are_empty_are_read_to_their_end_within_the_maximum() {
    let mut a = agent();
    // /proc/self/status reports 0 bytes; what comes back is the agent's own status.
    let path = "/proc/self/status";
    assert_eq!(std::fs::metadata(path).unwrap().len(), 0);
    let text = String::from_utf8(a.client.read_file_bytes(path, 1 << 20).unwrap()).unwrap();
    assert!(text.starts_with("Name:") && text.contains("\nPid:"), "{text}");
    let err = a.client.read_file_bytes(path, 16).unwrap_err();
    assert!(
        matches!(&err, ClientError::Agent { code: ErrorCode::BadRequest, message } if message.contains("more than 16 bytes")),
        "{err}"
    );
    a.client.ping().unwrap();
}

#[test]
fn a_cancelled_read_stops_streaming() {
    let mut a = agent();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("huge");
    let size = 64u64 << 30;
    std::fs::File::create(&p).unwrap().set_len(size).unwrap();
    send(&mut a, 50, &Request::ReadFile { path: p.to_str().unwrap().to_string(), max: None, user: None });
    let first = read_frame::<Response, _>(a.client.stream_mut()).unwrap().unwrap();
    assert_eq!((first.id, first.msg), (50, Response::Data));
    send(&mut a, 50, &Request::Cancel);
    let (bytes, end) = drain(&mut a, 50);
    assert!(is_cancelled(&end), "{end:?}");
    assert!(bytes < size / 2, "{bytes} bytes were sent after the cancel");
    a.client.ping().unwrap();
}

#[test]
fn a_cancelled_command_loses_its_whole_process_group() {
    let mut a = agent();
    let spec = sh("sleep 60 & echo $!; yes");
    send(&mut a, 60, &Request::Exec(spec));
    let mut out = Vec::new();
    while !out.contains(&b'\n') {
        let f = read_frame::<Response, _>(a.client.stream_mut()).unwrap().unwrap();
        out.extend_from_slice(&f.body);
    }
    let line = out.split(|b| *b == b'\n').next().unwrap().to_vec();
    let pid: i32 = String::from_utf8_lossy(&line).trim().parse().expect("background pid");
    send(&mut a, 60, &Request::Cancel);
    let (_, end) = drain(&mut a, 60);
    assert!(is_cancelled(&end), "{end:?}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !process_is_gone(pid) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(process_is_gone(pid), "background {pid} of a cancelled command survived");
}

#[test]
fn a_failed_write_names_the_path_given_not_the_temporary_file() {
    let mut a = agent();
    let dir = tempfile::tempdir().unwrap();
    let target = format!("{}/missing/f.txt", dir.path().display());
    let err = a.client.write_file(&target, &mut &b"x"[..], None, false, false).unwrap_err();
    let text = err.to_string();
    assert!(text.contains(&target) && !text.contains("branchbox-"), "{text}");
}

#[test]
fn commands_and_files_take_an_account_of_the_passwd_file() {
    // Dropping to another account needs root, which the agent has in a sandbox.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root");
        return;
    }
    let mut a = agent();
    // Debian's `nobody`: 65534, home /nonexistent (missing, so the cwd is given).
    let mut spec = sh("id -u; id -g; echo $HOME $USER $LOGNAME; pwd");
    spec.user = Some("nobody".into());
    spec.cwd = Some("/".into());
    let out = a.client.exec(spec, None).unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "65534\n65534\n/nonexistent nobody nobody\n/\n");
    let mut spec = sh("true");
    spec.user = Some("no-such-account".into());
    let err = a.client.exec(spec, None).unwrap_err();
    assert!(matches!(err, ClientError::Agent { code: ErrorCode::NotFound, .. }), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_string();
    // The account writes only where it may: a directory open to all.
    std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let owner = |p: &str| std::fs::symlink_metadata(p).unwrap().uid();
    a.client
        .write_file_as(&format!("{d}/made/f"), &mut &b"x"[..], None, false, true, Some("nobody"))
        .unwrap();
    assert_eq!((owner(&format!("{d}/made")), owner(&format!("{d}/made/f"))), (65534, 65534));
    assert_eq!(owner(&d), 0, "a directory that existed keeps its owner");
    a.client.mkdir_as(&format!("{d}/m/n"), true, Some("nobody")).unwrap();
    assert_eq!((owner(&format!("{d}/m")), owner(&format!("{d}/m/n"))), (65534, 65534));
    // Without an owner, root's as before.
    a.client.write_file(&format!("{d}/rootfile"), &mut &b"r"[..], None, false, false).unwrap();
    assert_eq!(owner(&format!("{d}/rootfile")), 0);
}
