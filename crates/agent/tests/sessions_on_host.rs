//! What runs on in a sandbox, with the agent run directly on the host over a socket pair, as the
//! shim and the microVM's vsock drive it: commands on a pseudo-terminal (`exec` with `pty`),
//! background processes' stdin and output (`proc_input`, `attach`), and directory watches.

use branchbox_protocol::{
    AgentClient, ClientError, Command, ErrorCode, ExecSpec, OutStream, PtyEvent, PtyOutput, PtySize,
    WatchKind,
};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The agent on one end of a socket pair (its stdin and stdout), a client on the other.
fn agent() -> (Agent, AgentClient<UnixStream>) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let theirs = OwnedFd::from(theirs);
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_branchbox-agent"))
        .stdin(Stdio::from(theirs.try_clone().unwrap()))
        .stdout(Stdio::from(theirs))
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start agent");
    let mut client = AgentClient::new(ours);
    client.hello().expect("hello");
    (Agent(child), client)
}

/// Reads the terminal until its output so far contains `want`; fails after 20 s.
fn read_until(out: &mut PtyOutput, seen: &mut String, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !seen.contains(want) {
        assert!(Instant::now() < deadline, "no {want:?} from the terminal; it printed {seen:?}");
        match out.recv().expect("terminal output") {
            PtyEvent::Output(b) => seen.push_str(&String::from_utf8_lossy(&b)),
            PtyEvent::Exited(s) => panic!("ended ({s:?}) before printing {want:?}; it printed {seen:?}"),
        }
    }
}

#[test]
fn a_command_on_a_terminal_sees_a_tty_of_the_asked_size_takes_keys_and_resizes() {
    let (_agent, client) = agent();
    let line = "test -t 0 && test -t 1 && echo is-a-tty; echo term=$TERM; stty size; \
                read answer; stty size; echo got:$answer; exit 3";
    let size = PtySize::new(80, 24).unwrap();
    let (mut input, mut out) =
        client.open_pty(ExecSpec::new(Command::Shell(line.into())), size).expect("open a terminal");
    let mut seen = String::new();
    read_until(&mut out, &mut seen, "24 80");
    assert!(seen.contains("is-a-tty"), "stdin and stdout are not a terminal: {seen:?}");
    assert!(seen.contains("term=xterm-256color"), "{seen:?}");
    input.resize(PtySize::new(100, 30).unwrap()).unwrap();
    input.write(b"hello\n").unwrap();
    read_until(&mut out, &mut seen, "got:hello");
    assert!(seen.contains("30 100"), "the new size did not reach the terminal: {seen:?}");
    // The terminal echoes what was typed, as any terminal does.
    assert!(seen.contains("hello\r\n"), "{seen:?}");
    let status = loop {
        match out.recv().expect("the end of the session") {
            PtyEvent::Output(_) => continue,
            PtyEvent::Exited(s) => break s,
        }
    };
    assert_eq!(status.code, Some(3));
    assert!(matches!(out.recv(), Err(ClientError::Closed)), "a frame after the end");
}

#[test]
fn a_resize_sent_right_after_the_exec_is_not_lost() {
    for _ in 0..5 {
        let (_agent, client) = agent();
        // The command asks for its size a moment after it starts: a program that asks at once
        // may see the first size (as on any terminal: the new one comes with SIGWINCH).
        let spec = ExecSpec::new(Command::Shell("sleep 0.3; stty size".into()));
        let (mut input, mut out) = client.open_pty(spec, PtySize::new(80, 24).unwrap()).unwrap();
        // Sent before the agent's worker can have opened the terminal: kept until it has.
        input.resize(PtySize::new(120, 40).unwrap()).unwrap();
        let mut seen = String::new();
        read_until(&mut out, &mut seen, "\n");
        assert!(seen.contains("40 120"), "the early resize was lost: {seen:?}");
    }
}

#[test]
fn a_terminal_of_an_impossible_size_is_refused_and_the_agent_keeps_serving() {
    for (cols, rows) in [(0, 24), (80, 0), (1001, 24), (80, 1001)] {
        assert!(PtySize::new(cols, rows).is_err(), "{cols}x{rows} accepted by the host");
        let (_agent, client) = agent();
        let bad = PtySize { cols, rows };
        let (_input, mut out) = client.open_pty(ExecSpec::new(Command::Shell("true".into())), bad).unwrap();
        let err = out.recv().unwrap_err();
        assert!(
            matches!(err, ClientError::Agent { code: ErrorCode::BadRequest, .. }),
            "{cols}x{rows}: {err}"
        );
    }
    let (_agent, mut client) = agent();
    client.ping().unwrap();
}

#[test]
fn a_missing_program_on_a_terminal_is_a_spawn_error() {
    let (_agent, client) = agent();
    let spec = ExecSpec::new(Command::Argv(vec!["/no/such/program".into()]));
    let (_input, mut out) = client.open_pty(spec, PtySize::new(80, 24).unwrap()).unwrap();
    let err = out.recv().unwrap_err();
    assert!(matches!(err, ClientError::Agent { code: ErrorCode::SpawnFailed, .. }), "{err}");
}

#[test]
fn a_background_process_reads_what_is_typed_into_it_until_its_stdin_is_closed() {
    let (_agent, mut client) = agent();
    let mut spec =
        ExecSpec::new(Command::Shell("while read l; do echo got:$l; echo err:$l >&2; done; echo bye".into()));
    spec.stdin = true;
    let pid = client.spawn(spec).unwrap();
    client.proc_input(pid, b"one\ntwo\n", false).unwrap();
    client.proc_input(pid, b"three\n", true).unwrap();
    let waited = client.wait(pid, Some(20_000)).unwrap().expect("it ends once its stdin is closed");
    assert_eq!(waited.status.code, Some(0));
    assert_eq!(String::from_utf8_lossy(&waited.stdout), "got:one\ngot:two\ngot:three\nbye\n");
    assert!(String::from_utf8_lossy(&waited.stderr).contains("err:three"));
    let e = client.proc_input(pid, b"late", false).unwrap_err();
    assert!(matches!(e, ClientError::Agent { code: ErrorCode::NotFound, .. }), "waited for: {e}");
}

#[test]
fn an_attached_reader_gets_the_output_from_then_on_and_the_exit() {
    let (_agent, mut client) = agent();
    let line =
        "echo before; sleep 1; for i in 1 2 3; do echo tick$i; echo warn$i >&2; sleep 0.2; done; exit 5";
    let pid = client.spawn(ExecSpec::new(Command::Shell(line.into()))).unwrap();
    let (mut out, mut err) = (String::new(), String::new());
    let status = client
        .attach(pid, false, &mut |which, b| match which {
            OutStream::Stdout => out.push_str(&String::from_utf8_lossy(b)),
            OutStream::Stderr => err.push_str(&String::from_utf8_lossy(b)),
        })
        .unwrap();
    assert_eq!(status.code, Some(5));
    assert!(out.ends_with("tick1\ntick2\ntick3\n"), "{out:?}");
    assert_eq!(err, "warn1\nwarn2\nwarn3\n");
    // The tails are still kept for wait, from the start.
    let waited = client.wait(pid, Some(5000)).unwrap().expect("ended");
    assert!(String::from_utf8_lossy(&waited.stdout).starts_with("before\ntick1"));
}

#[test]
fn what_a_process_prints_after_the_reader_is_in_place_reaches_it() {
    // The process prints only once the file exists, and the file is made when the agent says
    // the reader is in place: a reader that missed output printed after that point gets "".
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let (_agent, mut client) = agent();
    let line = format!(
        "for i in $(seq 1000); do [ -e {0} ] && {{ echo ok; exit 0; }}; sleep 0.01; done; exit 9",
        go.display()
    );
    let pid = client.spawn(ExecSpec::new(Command::Shell(line))).unwrap();
    let (mut told, mut out) = (0, String::new());
    let status = client
        .attach_then(
            pid,
            false,
            &mut || {
                told += 1;
                std::fs::write(&go, b"").unwrap();
            },
            &mut |_, b| out.push_str(&String::from_utf8_lossy(b)),
        )
        .unwrap();
    assert_eq!((status.code, out.as_str(), told), (Some(0), "ok\n", 1));
}

#[test]
fn an_attach_with_replay_right_after_spawn_sees_all_of_a_short_commands_output_once() {
    let (_agent, mut client) = agent();
    for _ in 0..5 {
        let pid = client
            .spawn(ExecSpec::new(Command::Shell("echo first; echo oops >&2; echo second".into())))
            .unwrap();
        let (mut out, mut err) = (String::new(), String::new());
        let status = client
            .attach(pid, true, &mut |which, b| match which {
                OutStream::Stdout => out.push_str(&String::from_utf8_lossy(b)),
                OutStream::Stderr => err.push_str(&String::from_utf8_lossy(b)),
            })
            .unwrap();
        assert_eq!((status.code, out.as_str(), err.as_str()), (Some(0), "first\nsecond\n", "oops\n"));
    }
}

#[test]
fn stdin_is_refused_to_a_process_started_without_it_and_attach_to_an_ended_one_answers_at_once() {
    let (_agent, mut client) = agent();
    let pid = client.spawn(ExecSpec::new(Command::Shell("exit 4".into()))).unwrap();
    let e = client.proc_input(pid, b"x", false).unwrap_err();
    assert!(matches!(e, ClientError::Agent { code: ErrorCode::BadRequest, .. }), "{e}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        let s = client.attach(pid, false, &mut |_, _| {}).unwrap();
        if s.code.is_some() || Instant::now() > deadline {
            break s;
        }
    };
    assert_eq!(status.code, Some(4));
    let e = client.attach(999_999, false, &mut |_, _| {}).unwrap_err();
    assert!(matches!(e, ClientError::Agent { code: ErrorCode::NotFound, .. }), "{e}");
}

#[test]
fn a_watch_reports_creates_writes_renames_and_removes_below_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let (_agent, mut client) = agent();
    let (_agent2, mut actor) = agent();
    let r = root.display().to_string();
    // The actor changes the tree once the watch is up: a short sleep lets the watch start
    // first; a change made before it would simply be missed and the test would fail, not pass.
    let line = format!(
        "sleep 1; mkdir -p {r}/sub/deep/er; touch {r}/sub/deep/er/made-at-once; sleep 0.5; echo hi > {r}/sub/a.txt; \
         mv {r}/sub/a.txt {r}/sub/b.txt; chmod 600 {r}/sub/b.txt; rm {r}/sub/b.txt"
    );
    actor.spawn(ExecSpec::new(Command::Shell(line))).unwrap();
    let mut seen = Vec::new();
    let mut ready = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    let want = format!("{r}/sub/b.txt");
    client
        .watch(&r, true, &mut |e| {
            let Some(e) = e else {
                ready += 1;
                return true;
            };
            assert_eq!(ready, 1, "an event before the watch said it was in place");
            seen.push((e.kind, e.name.clone()));
            let done = e.kind == WatchKind::Remove && e.name == want;
            !done && Instant::now() < deadline
        })
        .unwrap();
    let has = |k: WatchKind, name: &str| seen.iter().any(|(kk, n)| *kk == k && n == &format!("{r}/{name}"));
    assert!(has(WatchKind::Create, "sub"), "{seen:?}");
    assert!(
        has(WatchKind::Create, "sub/a.txt"),
        "a file in a directory made after the watch began: {seen:?}"
    );
    // A tree made faster than its watches could be added is reported as created.
    assert!(has(WatchKind::Create, "sub/deep/er/made-at-once"), "{seen:?}");
    assert!(has(WatchKind::Write, "sub/a.txt"), "{seen:?}");
    assert!(has(WatchKind::Rename, "sub/a.txt") && has(WatchKind::Create, "sub/b.txt"), "{seen:?}");
    assert!(has(WatchKind::Chmod, "sub/b.txt"), "{seen:?}");
    assert!(has(WatchKind::Remove, "sub/b.txt"), "{seen:?}");
    assert_eq!(ready, 1);
    let e = client.watch("/no/such/dir", false, &mut |_| true).unwrap_err();
    assert!(matches!(e, ClientError::Agent { code: ErrorCode::NotFound, .. }), "{e}");
}
