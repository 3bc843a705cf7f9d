//! The host-side client against a hostile fake agent on a socketpair: whatever the other end
//! sends, every call ends within its limits, with an error that says which limit.

use branchbox_protocol::frame::{encode_header, read_frame, write_raw};
use branchbox_protocol::limits::{MAX_WALK_LINE, PROC_TAIL};
use branchbox_protocol::{AgentClient, ClientError, Command, ExecSpec, Frame, Limits, Request, Response};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// A client whose agent reads one request and hands it to `behave`.
fn fake(behave: impl FnOnce(&mut UnixStream, Frame<Request>) + Send + 'static) -> AgentClient<UnixStream> {
    let (host, mut agent) = UnixStream::pair().unwrap();
    std::thread::spawn(move || {
        if let Ok(Some(req)) = read_frame::<Request, _>(&mut agent) {
            behave(&mut agent, req);
        }
    });
    AgentClient::new(host)
}

/// Sends `msg` with `body` for request `id` until the host hangs up (or `n` times).
fn flood(s: &mut UnixStream, id: u64, msg: &Response, body: &[u8], n: usize) {
    for _ in 0..n {
        if write_raw(s, &encode_header(id, msg), body).is_err() {
            return;
        }
    }
}

fn reply(s: &mut UnixStream, id: u64, msg: &Response) {
    let _ = write_raw(s, &encode_header(id, msg), b"");
}

fn limit_of(e: &ClientError) -> (&'static str, u64) {
    match e {
        ClientError::LimitExceeded { what, limit } => (*what, *limit),
        other => panic!("expected a limit error, got {other:?}"),
    }
}

const MIB: usize = 1024 * 1024;

#[test]
fn forged_output_past_the_commands_cap_ends_the_call() {
    let mut c = fake(|s, req| flood(s, req.id, &Response::Stdout, &vec![b'x'; MIB], usize::MAX));
    let mut spec = ExecSpec::new(Command::Shell("true".into()));
    spec.output_cap = Some(3 * MIB as u64);
    let mut seen = 0usize;
    let err = c.exec_streaming(spec, None, &mut |_, chunk| seen += chunk.len()).unwrap_err();
    assert_eq!(limit_of(&err), ("the command's output", 3 * MIB as u64));
    assert!(seen <= 3 * MIB, "{seen} bytes reached the caller");
    assert!(err.to_string().contains("3145728"), "{err}");
}

#[test]
fn a_spec_without_a_cap_gets_the_clients_and_the_agent_is_told_it() {
    let (tx, rx) = std::sync::mpsc::channel();
    let mut c = fake(move |s, req| {
        if let Request::Exec(spec) = &req.msg {
            let _ = tx.send(spec.output_cap);
        }
        flood(s, req.id, &Response::Stderr, &[b'e'; 1000], usize::MAX)
    });
    c.set_limits(Limits { output_bytes: 10_000, ..Limits::default() });
    let err = c.exec(ExecSpec::new(Command::Shell("true".into())), None).unwrap_err();
    assert_eq!(limit_of(&err).1, 10_000);
    assert_eq!(rx.recv().unwrap(), Some(10_000));
}

#[test]
fn wait_accepts_no_more_than_the_documented_tails() {
    let mut c = fake(|s, req| {
        flood(s, req.id, &Response::Stdout, &vec![0; PROC_TAIL / 2], 2);
        flood(s, req.id, &Response::Stderr, &vec![0; PROC_TAIL / 2], 3);
    });
    let err = c.wait(4, Some(1000)).unwrap_err();
    assert_eq!(limit_of(&err), ("a background process's stderr tail", PROC_TAIL as u64));
}

#[test]
fn a_file_read_stops_at_the_callers_maximum() {
    let mut c = fake(|s, req| flood(s, req.id, &Response::Data, &vec![0; MIB], usize::MAX));
    let err = c.read_file_bytes("/dev/zero", 5 * MIB as u64).unwrap_err();
    assert_eq!(limit_of(&err), ("the file's data", 5 * MIB as u64));

    let mut c = fake(|s, req| {
        flood(s, req.id, &Response::Data, b"abc", 1);
        reply(s, req.id, &Response::FileEnd { size: 2 });
    });
    let err = c.read_file_bytes("/f", 10).unwrap_err();
    assert!(matches!(err, ClientError::Unexpected(_)), "{err}");
}

#[test]
fn a_walk_is_bounded_in_entries_bytes_and_line_length() {
    let entries = br#"{"name":"/a","kind":"file","size":1,"mode":420,"mtime_ns":0}
"#
    .repeat(1000);
    let mut c = fake(move |s, req| flood(s, req.id, &Response::Data, &entries, usize::MAX));
    c.set_limits(Limits { walk_entries: 5000, ..Limits::default() });
    let err = c.walk("/", &[]).unwrap_err();
    assert_eq!(limit_of(&err), ("the number of walk entries", 5000));

    let mut c = fake(|s, req| flood(s, req.id, &Response::Data, &vec![b'{'; 4096], usize::MAX));
    let err = c.walk("/", &[]).unwrap_err();
    assert_eq!(limit_of(&err), ("one walk entry", MAX_WALK_LINE as u64));

    let line = br#"{"name":"/b","kind":"file","size":1,"mode":420,"mtime_ns":0}
"#
    .repeat(1000);
    let mut c = fake(move |s, req| flood(s, req.id, &Response::Data, &line, usize::MAX));
    c.set_limits(Limits { walk_bytes: MIB as u64, ..Limits::default() });
    let err = c.walk("/", &[]).unwrap_err();
    assert_eq!(limit_of(&err), ("the walk's entries", MIB as u64));
}

#[test]
fn an_agent_that_stops_answering_times_out() {
    let mut c = fake(|_s, _| std::thread::sleep(Duration::from_secs(30)));
    c.set_limits(Limits { timeout: Some(Duration::from_millis(300)), ..Limits::default() });
    let err = c.ping().unwrap_err();
    assert!(matches!(err, ClientError::Timeout { .. }), "{err}");
}

#[test]
fn frames_for_other_requests_do_not_keep_a_call_alive() {
    let mut c = fake(|s, req| flood(s, req.id + 1000, &Response::Stdout, &[0; 64], usize::MAX));
    c.set_limits(Limits { timeout: Some(Duration::from_millis(300)), ..Limits::default() });
    let err = c.read_file_bytes("/f", 10).unwrap_err();
    assert!(matches!(err, ClientError::Timeout { .. }), "{err}");
}

#[test]
fn a_streamed_answer_to_a_plain_call_is_refused() {
    let mut c = fake(|s, req| flood(s, req.id, &Response::Data, &[0; 64], usize::MAX));
    let err = c.ping().unwrap_err();
    assert!(matches!(err, ClientError::Unexpected(_)), "{err}");
}

#[test]
fn an_over_long_argv_is_refused_before_sending_with_what_is_allowed() {
    let (tx, rx) = std::sync::mpsc::channel();
    let mut c = fake(move |_, req| {
        let _ = tx.send(req.id);
    });
    let argv: Vec<String> = (0..100_000).map(|i| format!("argument-{i}")).collect();
    let err = c.exec(ExecSpec::new(Command::Argv(argv)), None).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ClientError::RequestTooLarge { .. }), "{text}");
    assert!(text.contains("argv") && text.contains("65472") && text.contains("stdin or a file"), "{text}");
    drop(c);
    assert!(rx.recv().is_err(), "the request was sent anyway");
}
