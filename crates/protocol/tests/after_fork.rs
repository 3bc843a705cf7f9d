//! `AgentClient::after_fork`: what reaches the agent (a fresh identity with its entropy as the
//! body) and what comes back (the hook's report, or an error for any other answer).

use branchbox_protocol::frame::{encode_header, read_frame, write_raw};
use branchbox_protocol::{
    AfterFork, AgentClient, ClientError, Frame, HookReport, Request, Response, StepOutcome,
    AFTER_FORK_ENTROPY,
};
use std::os::unix::net::UnixStream;
use std::sync::mpsc;

/// A client whose agent reads one request, reports it on `seen` and answers `answer`.
fn fake(answer: Response, seen: mpsc::Sender<(Option<AfterFork>, usize)>) -> AgentClient<UnixStream> {
    let (host, mut agent) = UnixStream::pair().unwrap();
    std::thread::spawn(move || {
        if let Ok(Some(Frame { id, msg: Request::Thaw { after_fork }, body })) =
            read_frame::<Request, _>(&mut agent)
        {
            let _ = seen.send((after_fork, body.len()));
            let _ = write_raw(&mut agent, &encode_header(id, &answer), b"");
        }
    });
    AgentClient::new(host)
}

fn report() -> HookReport {
    HookReport {
        entropy: StepOutcome::Applied,
        clock: StepOutcome::Applied,
        hostname: StepOutcome::Unsupported("no UTS namespace".into()),
        machine_id: StepOutcome::Applied,
        duration_us: 3,
    }
}

#[test]
fn the_agent_gets_a_fresh_identity_and_its_report_comes_back() {
    let (tx, rx) = mpsc::channel();
    let mut c = fake(Response::Thawed { hook: Some(report()) }, tx);
    assert_eq!(c.after_fork("sbx-1", "bb-00000001").unwrap(), report());
    let (sent, body) = rx.recv().unwrap();
    let sent = sent.expect("thaw carries the identity");
    assert_eq!((sent.sandbox_id.as_str(), sent.hostname.as_str()), ("sbx-1", "bb-00000001"));
    assert_eq!(body, AFTER_FORK_ENTROPY, "the entropy is the frame's body");
}

#[test]
fn a_thaw_without_a_report_is_an_unexpected_answer() {
    let (tx, _rx) = mpsc::channel();
    let mut c = fake(Response::Thawed { hook: None }, tx);
    let err = c.after_fork("sbx-1", "bb-00000001").unwrap_err();
    assert!(matches!(&err, ClientError::Unexpected(a) if a.contains("Thawed")), "{err:?}");
}
