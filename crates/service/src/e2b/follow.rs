//! envd's `process.Process` service: commands started with `Start` (their pid, stdin, output to
//! late readers, signals), `Connect`, `List`, `SendSignal`, input and `Update`, for processes
//! and terminals alike (a terminal itself is `terminals.rs`'s); directory watches are in
//! `watch.rs`.
//!
//! - A command is a background process of the agent (`spawn`), read through `attach`. As in
//!   envd, the process outlives its Start stream: a client that goes away (a background handle
//!   dropped, a lost connection) ends the stream at once, quiet process or not (its agent
//!   connection is shut, which frees the thread reading it: `crate::streams`), and the process
//!   runs on until it exits, is killed (`SendSignal`) or reaches the Start call's timeout
//!   (`Connect-Timeout-Ms`; none when absent or 0, as in envd). `Connect` reads it again by pid.
//!   Streams and terminals are bounded per sandbox, per token and in the service
//!   (`crate::streams::Kind`); past a bound the call ends with `resource_exhausted`.
//! - So that the Start stream misses none of its output, it attaches with `replay`: the agent
//!   sends what the command printed before the attach (up to its kept 1 MiB of each stream),
//!   then the rest, with nothing lost or repeated in between. Without `stdin` in the request
//!   the command's stdin is empty (end of file at once).

use super::connect::{self, Kind, RpcError, MAX_MESSAGE};
use super::envd::{
    api, deadline_of, detach_of, envelope, event, keepalive_of, message, place, read_body, resolve,
    selected_pid, stream_error, stream_kind, stream_response, unary, user_of, Ev, Target,
};
use super::pb::{self, process_event, process_input};
use super::terminals::{pty_size, Terminals};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::ops::types::RunCommand;
use crate::state::AppState;
use crate::streams::{self, Detach, Place};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Extension;
use branchbox_model::SandboxId;
use branchbox_protocol::{Command, OutStream};
use futures_util::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Reads an attached process into `tx` on a blocking thread (which holds `place`): output, then
/// its end. The stream holds the returned detacher: when it ends (its client gone, the service
/// stopping), the agent connection is shut, which ends the blocked read at once and cancels
/// the attach (not the process).
async fn pump_attach(
    mut conn: branchbox_model::AgentConn,
    pid: i32,
    replay: bool,
    tx: mpsc::Sender<Ev>,
    place: Place,
) -> Result<Detach, RpcError> {
    let detach = detach_of(&mut conn)?;
    let (attaching, in_place) = streams::Attaching::new();
    tokio::task::spawn_blocking(move || {
        let _place = place;
        let mut gone = false;
        let r = conn.attach_then(pid, replay, &mut || attaching.done(), &mut |which, chunk| {
            attaching.done();
            if gone {
                return;
            }
            let o = if which == OutStream::Stdout {
                process_event::Output::Stdout(chunk.to_vec())
            } else {
                process_event::Output::Stderr(chunk.to_vec())
            };
            gone = tx.blocking_send(Ev::Data(o)).is_err();
        });
        if !gone {
            let _ = tx.blocking_send(Ev::End(r.map_err(|e| api(ApiError::from(e)))));
        }
    });
    // The stream is answered once the agent reads the process for it: what the process
    // prints after `Connect`'s answer (to input sent then, say) is never lost.
    in_place.await;
    Ok(detach)
}

/// What a stream does when its command ends: record the step (sandboxes with history).
struct After {
    st: AppState,
    sandbox: SandboxId,
    cmd: Command,
}

/// What one Start or Connect stream serves: a process's events from `rx`, and what ends it.
struct Served {
    pid: u32,
    rx: mpsc::Receiver<Ev>,
    keepalive: Option<u64>,
    /// The stream's own timeout, ms.
    deadline: Option<u64>,
    after: Option<After>,
    /// Shuts the agent connection read for `rx` when the stream ends (none for a terminal,
    /// which lives on).
    detach: Option<Detach>,
}

/// Serves one process's events as a Start or Connect stream: the start event with `pid`, data
/// events, keepalives, then the end event, or the error that ends the stream. The stream ends
/// as soon as its client goes (the body dropped) or the service stops, whatever the process
/// is doing; its detacher goes with it.
fn serve(st: &AppState, kind: Kind, s: Served) -> Response {
    let Kind::Stream(codec) = kind else { unreachable!("streams only") };
    let Served { pid, mut rx, keepalive, deadline, after, detach } = s;
    let (tx, body) = mpsc::channel::<Bytes>(16);
    let stopping = st.streams.stopping();
    tokio::spawn(async move {
        let _detach = detach;
        tokio::pin!(stopping);
        let first = event(process_event::Event::Start(process_event::StartEvent { pid }));
        if tx.send(message(codec, &first)).await.is_err() {
            return;
        }
        let period = Duration::from_secs(keepalive.unwrap_or(3600));
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        let until = tokio::time::Instant::now() + Duration::from_millis(deadline.unwrap_or(u64::MAX / 4));
        let ended = loop {
            tokio::select! {
                ev = rx.recv() => match ev {
                    Some(Ev::Data(o)) => {
                        let m = event(process_event::Event::Data(process_event::DataEvent { output: Some(o) }));
                        if tx.send(message(codec, &m)).await.is_err() {
                            return;
                        }
                    }
                    Some(Ev::End(r)) => break r,
                    None => break Err(RpcError::new("aborted", "another client connected to this terminal")),
                },
                _ = tick.tick(), if keepalive.is_some() => {
                    let m = event(process_event::Event::Keepalive(process_event::KeepAlive {}));
                    if tx.send(message(codec, &m)).await.is_err() {
                        return;
                    }
                }
                _ = tokio::time::sleep_until(until), if deadline.is_some() => {
                    break Err(RpcError::new("deadline_exceeded", "the call's timeout passed; the process runs on (Connect to it again)"));
                }
                () = tx.closed() => return,
                () = &mut stopping => {
                    break Err(RpcError::new("unavailable", "the service is stopping; the process runs on (Connect to it again)"));
                }
            }
        };
        let ended = match (ended, after) {
            (Ok(status), Some(a)) => {
                let (s2, sandbox, cmd) = (status.clone(), a.sandbox.clone(), a.cmd);
                match a.st.blocking(move |engine, _| Ok(engine.after_exec(&sandbox, &cmd, &s2)?)).await {
                    Ok(_) => super::envd::end_of(&status),
                    Err(e) => Err(api(e)),
                }
            }
            (Ok(status), None) => super::envd::end_of(&status),
            (Err(e), _) => Err(e),
        };
        let last = match ended {
            Ok(end) => {
                let _ = tx.send(message(codec, &event(process_event::Event::End(end)))).await;
                connect::end_stream(None)
            }
            Err(e) => connect::end_stream(Some(&e)),
        };
        let _ = tx.send(Bytes::from(last)).await;
    });
    stream_response(kind, body)
}

async fn write_input(
    st: &AppState,
    id: &SandboxId,
    pid: i32,
    bytes: Vec<u8>,
    eof: bool,
) -> Result<(), RpcError> {
    let id = id.clone();
    st.blocking(move |engine, st| Ok(st.agent(engine, &id, Duration::ZERO)?.proc_input(pid, &bytes, eof)?))
        .await
        .map_err(api)
}

/// `process.Process/Start`.
pub async fn start(
    State(st): State<AppState>,
    State(terms): State<Arc<Terminals>>,
    Extension(t): Extension<Target>,
    caller: Option<Extension<Caller>>,
    h: HeaderMap,
    body: Body,
) -> Response {
    let kind = match stream_kind(&h, "Start") {
        Ok(k) => k,
        Err(r) => return *r,
    };
    let req = match async {
        let bytes = read_body(body).await?;
        connect::decode_request::<pb::StartRequest>(kind, &bytes)
    }
    .await
    {
        Ok(r) => r,
        Err(e) => return stream_error(kind, &e),
    };
    let r = if req.pty.is_some() {
        match place(&st, streams::Kind::Terminal, &t.sandbox, &caller) {
            Ok(p) => start_terminal(&st, &terms, &t.sandbox, &h, kind, req, p).await,
            Err(e) => Err(e),
        }
    } else {
        match place(&st, streams::Kind::Follow, &t.sandbox, &caller) {
            Ok(p) => start_process(&st, &t.sandbox, &h, kind, req, p).await,
            Err(e) => Err(e),
        }
    };
    r.unwrap_or_else(|e| stream_error(kind, &e))
}

/// The spec of a Start request (the account, cwd, environment, timeout).
async fn spec_of(
    st: &AppState,
    id: &SandboxId,
    h: &HeaderMap,
    p: pb::ProcessConfig,
) -> Result<branchbox_protocol::ExecSpec, RpcError> {
    if p.cmd.is_empty() {
        return Err(RpcError::invalid("process.cmd must name the program to run"));
    }
    let user = user_of(h)?;
    let cwd = p.cwd.as_deref().filter(|c| !c.is_empty()).map(|c| resolve(c, &user)).transpose()?;
    let max_ms = st.cfg.max_exec_timeout_s.saturating_mul(1000);
    let limit = deadline_of(h)?.map(|ms| ms.min(max_ms));
    let mut argv = vec![p.cmd];
    argv.extend(p.args);
    let run = RunCommand {
        cmd: None,
        argv: Some(argv),
        envs: Some(p.envs.into_iter().collect()),
        cwd,
        timeout: None,
        stdin: None,
        user: Some(user),
    };
    let id = id.clone();
    let mut spec = st
        .blocking(move |engine, st| {
            crate::ops::commands::with_defaults(engine, &id, crate::ops::commands::spec(st, &id, &run)?)
        })
        .await
        .map_err(api)?;
    // As in envd: the call's timeout bounds the process; none when absent or 0.
    spec.timeout_ms = limit;
    Ok(spec)
}

async fn start_process(
    st: &AppState,
    id: &SandboxId,
    h: &HeaderMap,
    kind: Kind,
    req: pb::StartRequest,
    place: Place,
) -> Result<Response, RpcError> {
    let want_stdin = req.stdin == Some(true);
    let keepalive = keepalive_of(h);
    let mut spec = spec_of(st, id, h, req.process.unwrap_or_default()).await?;
    let recorded = spec.cmd.clone();
    spec.stdin = want_stdin;
    let sid = id.clone();
    let (pid, conn) = st
        .blocking(move |engine, st| {
            let pid = st.agent(engine, &sid, Duration::ZERO)?.spawn(spec)?;
            Ok((pid, engine.connect(&sid)?))
        })
        .await
        .map_err(api)?;
    let (tx, rx) = mpsc::channel::<Ev>(64);
    let detach = pump_attach(conn, pid, true, tx, place).await?;
    let after = After { st: st.clone(), sandbox: id.clone(), cmd: recorded };
    let served =
        Served { pid: pid as u32, rx, keepalive, deadline: None, after: Some(after), detach: Some(detach) };
    Ok(serve(st, kind, served))
}

async fn start_terminal(
    st: &AppState,
    terms: &Arc<Terminals>,
    id: &SandboxId,
    h: &HeaderMap,
    kind: Kind,
    req: pb::StartRequest,
    place: Place,
) -> Result<Response, RpcError> {
    let size = pty_size(req.pty.and_then(|p| p.size).unwrap_or(pb::PtySize { cols: 80, rows: 24 }))?;
    let keepalive = keepalive_of(h);
    let config = req.process.clone().unwrap_or_default();
    let spec = spec_of(st, id, h, req.process.unwrap_or_default()).await?;
    let (pid, rx) = terms.open(st, id, spec, size, config, place).await?;
    Ok(serve(st, kind, Served { pid, rx, keepalive, deadline: None, after: None, detach: None }))
}

/// `process.Process/Connect`: a command's output from now on (or a terminal's), then its end.
pub async fn connect_to(
    State(st): State<AppState>,
    State(terms): State<Arc<Terminals>>,
    Extension(t): Extension<Target>,
    caller: Option<Extension<Caller>>,
    h: HeaderMap,
    body: Body,
) -> Response {
    let kind = match stream_kind(&h, "Connect") {
        Ok(k) => k,
        Err(r) => return *r,
    };
    let r = async {
        let bytes = read_body(body).await?;
        let req: pb::SelectRequest = connect::decode_request(kind, &bytes)?;
        let pid = selected_pid(req.process)?;
        let deadline = deadline_of(&h)?;
        let keepalive = keepalive_of(&h);
        if let Some(term) = terms.get(&t.sandbox, pid) {
            // The previous reader's stream ends; this one reads from now on.
            let rx = term.follow();
            let served = Served { pid: pid as u32, rx, keepalive, deadline, after: None, detach: None };
            return Ok(serve(&st, kind, served));
        }
        let place = place(&st, streams::Kind::Follow, &t.sandbox, &caller)?;
        let id = t.sandbox.clone();
        let conn = st
            .blocking(move |engine, st| {
                let running = st.agent(engine, &id, Duration::ZERO)?.list_procs()?;
                if !running.iter().any(|p| p.pid == pid && p.exit.is_none()) {
                    return Err(ApiError::not_found(format!("no running process with pid {pid}")));
                }
                Ok(engine.connect(&id)?)
            })
            .await
            .map_err(api)?;
        let (tx, rx) = mpsc::channel::<Ev>(64);
        let detach = pump_attach(conn, pid, false, tx, place).await?;
        let served = Served { pid: pid as u32, rx, keepalive, deadline, after: None, detach: Some(detach) };
        Ok(serve(&st, kind, served))
    }
    .await;
    r.unwrap_or_else(|e: RpcError| stream_error(kind, &e))
}

/// Sends one `ProcessInput` to process `pid` of the sandbox.
async fn send(
    st: &AppState,
    terms: &Terminals,
    id: &SandboxId,
    pid: i32,
    input: Option<pb::ProcessInput>,
) -> Result<(), RpcError> {
    let bytes = match input.and_then(|i| i.input) {
        Some(process_input::Input::Stdin(b)) | Some(process_input::Input::Pty(b)) => b,
        None => return Err(RpcError::invalid("input must carry stdin or pty bytes")),
    };
    match terms.get(id, pid) {
        Some(term) => term.type_into(bytes).await,
        None => write_input(st, id, pid, bytes, false).await,
    }
}

/// `process.Process/SendInput`.
pub async fn send_input(
    State(st): State<AppState>,
    State(terms): State<Arc<Terminals>>,
    Extension(t): Extension<Target>,
    h: HeaderMap,
    body: Body,
) -> Response {
    unary(&h, body, |req: pb::SendInputRequest| async move {
        send(&st, &terms, &t.sandbox, selected_pid(req.process)?, req.input).await?;
        Ok(pb::Empty {})
    })
    .await
}

/// `process.Process/CloseStdin`.
pub async fn close_stdin(
    State(st): State<AppState>,
    State(terms): State<Arc<Terminals>>,
    Extension(t): Extension<Target>,
    h: HeaderMap,
    body: Body,
) -> Response {
    unary(&h, body, |req: pb::SelectRequest| async move {
        let pid = selected_pid(req.process)?;
        if terms.get(&t.sandbox, pid).is_some() {
            return Err(RpcError::new(
                "failed_precondition",
                "a terminal has no stdin to close; type Ctrl-D (\\x04) into it, or kill it",
            ));
        }
        write_input(&st, &t.sandbox, pid, Vec::new(), true).await?;
        Ok(pb::Empty {})
    })
    .await
}

/// `process.Process/Update`: a terminal's new size.
pub async fn update(
    State(terms): State<Arc<Terminals>>,
    Extension(t): Extension<Target>,
    h: HeaderMap,
    body: Body,
) -> Response {
    unary(&h, body, |req: pb::UpdateRequest| async move {
        let pid = selected_pid(req.process)?;
        let size = pty_size(req.pty.and_then(|p| p.size).ok_or_else(|| RpcError::invalid("give pty.size"))?)?;
        let term = terms.get(&t.sandbox, pid).ok_or_else(|| {
            RpcError::new("not_found", format!("no terminal with pid {pid}; only terminals can be resized"))
        })?;
        term.resize(size).await?;
        Ok(pb::Empty {})
    })
    .await
}

/// `process.Process/StreamInput`: a client stream of input for one process (a start event
/// naming it, then data events), answered once the client ends it.
pub async fn stream_input(
    State(st): State<AppState>,
    State(terms): State<Arc<Terminals>>,
    Extension(t): Extension<Target>,
    h: HeaderMap,
    body: Body,
) -> Response {
    let kind = match stream_kind(&h, "StreamInput") {
        Ok(k) => k,
        Err(r) => return *r,
    };
    let Kind::Stream(codec) = kind else { unreachable!("matched") };
    let r = async {
        let deadline = deadline_of(&h)?;
        let work = async {
            let mut chunks = body.into_data_stream();
            let mut buf: Vec<u8> = Vec::new();
            let mut pid = None;
            loop {
                while buf.len() >= 5 {
                    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
                    if len > MAX_MESSAGE {
                        return Err(RpcError::new(
                            "resource_exhausted",
                            format!("a message is over {MAX_MESSAGE} bytes"),
                        ));
                    }
                    if buf[0] & connect::FLAG_COMPRESSED != 0 {
                        return Err(RpcError::unimplemented("compressed messages are not served"));
                    }
                    if buf.len() < 5 + len {
                        break;
                    }
                    let msg: Vec<u8> = buf.drain(..5 + len).skip(5).collect();
                    let req: pb::StreamInputRequest = connect::decode(codec, &msg)?;
                    match (req.event, pid) {
                        (Some(pb::stream_input::Event::Start(s)), None) => {
                            pid = Some(selected_pid(s.process)?)
                        }
                        (Some(pb::stream_input::Event::Start(_)), Some(_)) => {
                            return Err(RpcError::invalid("one start event per stream"))
                        }
                        (Some(pb::stream_input::Event::Data(d)), Some(p)) => {
                            send(&st, &terms, &t.sandbox, p, d.input).await?
                        }
                        (Some(pb::stream_input::Event::Data(_)), None) => {
                            return Err(RpcError::invalid(
                                "the stream must start with a start event naming the process",
                            ))
                        }
                        (Some(pb::stream_input::Event::Keepalive(_)), _) | (None, _) => {}
                    }
                }
                match chunks.next().await {
                    Some(Ok(c)) => buf.extend_from_slice(&c),
                    Some(Err(e)) => {
                        return Err(RpcError::invalid(format!("the request could not be read: {e}")))
                    }
                    None if buf.is_empty() => return Ok(()),
                    None => return Err(RpcError::invalid("the request ends inside a message")),
                }
            }
        };
        match deadline {
            Some(ms) => tokio::time::timeout(Duration::from_millis(ms), work)
                .await
                .map_err(|_| RpcError::new("deadline_exceeded", "the stream's timeout passed"))?,
            None => work.await,
        }
    }
    .await;
    let (tx, rx) = mpsc::channel::<Bytes>(2);
    match r {
        Ok(()) => {
            let _ = tx.try_send(envelope(codec, &pb::Empty {}));
            let _ = tx.try_send(Bytes::from(connect::end_stream(None)));
            stream_response(kind, rx)
        }
        Err(e) => stream_error(kind, &e),
    }
}

/// `process.Process/List`: the sandbox's running processes and open terminals.
pub async fn list(
    State(st): State<AppState>,
    State(terms): State<Arc<Terminals>>,
    Extension(t): Extension<Target>,
    h: HeaderMap,
    body: Body,
) -> Response {
    unary(&h, body, |_: pb::ListRequest| async move {
        let id = t.sandbox.clone();
        let procs = st
            .blocking(move |engine, st| Ok(st.agent(engine, &id, Duration::ZERO)?.list_procs()?))
            .await
            .map_err(api)?;
        let processes = procs
            .into_iter()
            .filter(|p| p.exit.is_none() && p.pid > 0)
            .map(|p| {
                let (cmd, args) = match p.cmd {
                    Command::Argv(mut a) if !a.is_empty() => {
                        let first = a.remove(0);
                        (first, a)
                    }
                    Command::Argv(_) => (String::new(), Vec::new()),
                    Command::Shell(s) => ("/bin/sh".to_string(), vec!["-c".to_string(), s]),
                };
                pb::ProcessInfo {
                    config: Some(pb::ProcessConfig { cmd, args, ..Default::default() }),
                    pid: p.pid as u32,
                    tag: None,
                }
            })
            .chain(terms.list(&t.sandbox))
            .collect();
        Ok(pb::ListResponse { processes })
    })
    .await
}

/// `process.Process/SendSignal`: SIGKILL or SIGTERM to a process (its group), or the end of a
/// terminal.
pub async fn send_signal(
    State(st): State<AppState>,
    State(terms): State<Arc<Terminals>>,
    Extension(t): Extension<Target>,
    h: HeaderMap,
    body: Body,
) -> Response {
    unary(&h, body, |req: pb::SendSignalRequest| async move {
        let pid = selected_pid(req.process)?;
        let sig = match req.signal {
            pb::SIGNAL_SIGKILL | pb::SIGNAL_SIGTERM => req.signal,
            other => {
                return Err(RpcError::invalid(format!(
                    "signal {other} is not SIGNAL_SIGKILL or SIGNAL_SIGTERM"
                )))
            }
        };
        if terms.kill(&t.sandbox, pid) {
            return Ok(pb::Empty {});
        }
        let id = t.sandbox;
        st.blocking(move |engine, st| {
            let mut conn = st.agent(engine, &id, Duration::ZERO)?;
            // A process that has ended is no longer there to signal (envd forgets it).
            if !conn.list_procs()?.iter().any(|p| p.pid == pid && p.exit.is_none()) {
                return Err(ApiError::not_found(format!("no running process with pid {pid}")));
            }
            Ok(conn.signal(pid, sig, true)?)
        })
        .await
        .map_err(api)?;
        Ok(pb::Empty {})
    })
    .await
}
