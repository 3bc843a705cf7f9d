//! Commands on a pseudo-terminal (`exec` with `pty`), with the agent run directly on the host
//! over a socket pair, as the shim and the microVM's vsock drive it.

use branchbox_protocol::{
    AgentClient, ClientError, Command, ErrorCode, ExecSpec, PtyEvent, PtyOutput, PtySize,
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
