//! A terminal in a sandbox over a WebSocket: a login shell (or a given command) on a
//! pseudo-terminal of the sandbox's agent, typed into and read from by the client.
//!
//! Messages: binary from the client is typed into the terminal; text from the client is JSON
//! control, `{"type": "resize", "cols": N, "rows": N}`. Binary from the service is what the
//! terminal printed; text from the service is `{"type": "exit", "code", "signal"}` when the
//! command ends, or `{"type": "error", "code", "message"}`, each followed by a close.
//!
//! Terminals are bounded per sandbox, per token and in the service (`crate::streams`, shared
//! with envd's terminals); one ends when its socket closes or the service stops.

use super::places::upgrade;
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{account_name, sandbox_id, sandbox_path, ApiQuery};
use crate::state::AppState;
use crate::streams::{self, Place};
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Extension;
use branchbox_protocol::{ClientError, Command, ExecSpec, PtyEvent, PtyInput, PtyOutput, PtySize};
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use std::future::Future;
use tokio::sync::mpsc;
use utoipa::IntoParams;

/// Largest message a client may send (keys typed, or a control message).
pub const MAX_INPUT_MESSAGE: usize = 64 * 1024;

/// Longest command line of a terminal.
const MAX_CMD: usize = 16 * 1024;
/// What runs when the client names no command: the image's bash as a login shell, else sh.
const LOGIN_SHELL: &str = "if [ -x /bin/bash ]; then exec /bin/bash -l; fi; exec /bin/sh -l";

/// How to open a terminal.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PtyQuery {
    /// Columns, 1 to 1000 (80 when absent).
    pub cols: Option<u16>,
    /// Rows, 1 to 1000 (24 when absent).
    pub rows: Option<u16>,
    /// A shell line to run instead of a login shell.
    pub cmd: Option<String>,
    /// The image's account to run as (root when absent).
    pub user: Option<String>,
    /// Working directory (absolute); the account's home, or `/`, when absent.
    pub cwd: Option<String>,
    /// The console session's CSRF token: a browser cannot add headers to a WebSocket
    /// handshake, so a request signed in by the session cookie names it here instead of in
    /// `X-CSRF-Token`. Bearer clients leave it out.
    pub csrf: Option<String>,
}

/// A control message from the client.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum Control {
    Resize { cols: u16, rows: u16 },
}

fn spec_of(q: &PtyQuery) -> ApiResult<(ExecSpec, PtySize)> {
    let size = PtySize::new(q.cols.unwrap_or(80), q.rows.unwrap_or(24))
        .map_err(|e| ApiError::bad_request("invalid_size", e))?;
    let cmd = match q.cmd.as_deref() {
        None => LOGIN_SHELL.to_string(),
        Some(line) if line.trim().is_empty() || line.len() > MAX_CMD || line.contains('\0') => {
            return Err(ApiError::invalid(format!(
                "cmd must be a non-empty shell line of at most {MAX_CMD} bytes without NUL (leave it out for a login shell)"
            )))
        }
        Some(line) => line.to_string(),
    };
    let mut spec = ExecSpec::new(Command::Shell(cmd));
    spec.cwd = q.cwd.as_deref().map(sandbox_path).transpose()?;
    spec.user = q.user.as_deref().map(|u| account_name("user", u)).transpose()?;
    Ok((spec, size))
}

/// Opens a terminal in a running sandbox: a WebSocket whose binary messages are typed into a
/// login shell (or `cmd`) on a pseudo-terminal and whose binary messages back are what it
/// prints; text messages carry resizes, the exit and errors (see `docs/service.md`). The
/// command ends when the socket closes.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/pty", tag = "commands",
    params(("id" = String, Path, description = "sandbox id"), PtyQuery),
    responses((status = 101, description = "switching to the WebSocket protocol"),
              (status = "4XX", body = ErrorBody, description = "not a WebSocket handshake (426), bad size or command, missing CSRF token (403), not found, paused (409), too many terminals open in the sandbox, with the token or in the service (429)")))]
pub async fn open(
    State(st): State<AppState>,
    Path(id): Path<String>,
    caller: Option<Extension<Caller>>,
    ApiQuery(q): ApiQuery<PtyQuery>,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    let id = sandbox_id(&id)?;
    let (spec, size) = spec_of(&q)?;
    if let Some(tokens) = &st.tokens {
        tokens.check_csrf_param(&headers, q.csrf.as_deref())?;
    }
    let ws = upgrade(ws, "a terminal")?;
    // An upgraded socket no longer counts against the connection cap, and each terminal holds
    // two threads and a process in its sandbox.
    let token = caller.as_ref().map_or("anonymous", |c| c.0 .0.as_str());
    let place = st.streams.take(streams::Kind::Terminal, &id, token)?;
    let stopping = st.streams.stopping();
    // Start the terminal before answering, so a missing or paused sandbox gets its status code.
    let (input, output) = st
        .blocking(move |engine, _| {
            let spec = crate::ops::commands::with_defaults(engine, &id, spec)?;
            Ok(engine.connect(&id)?.open_pty(spec, size)?)
        })
        .await?;
    Ok(ws
        .max_message_size(MAX_INPUT_MESSAGE)
        .max_frame_size(MAX_INPUT_MESSAGE)
        .on_upgrade(move |socket| session(socket, input, output, place, stopping)))
}

/// What the typing thread is handed.
enum Typed {
    Keys(Vec<u8>),
    Resize(PtySize),
}

fn text(v: serde_json::Value) -> Message {
    Message::Text(v.to_string().into())
}

fn error_message(code: &str, message: &str) -> Message {
    text(serde_json::json!({ "type": "error", "code": code, "message": message }))
}

/// Joins the socket to the terminal until either ends or the service stops. The agent
/// connection is blocking, so one thread reads the terminal (holding the terminal's `place`
/// until the command is gone) and another types into it; closing the socket drops the typing
/// thread's channel, which closes the agent connection, which ends the command.
async fn session(
    socket: WebSocket,
    input: PtyInput,
    output: PtyOutput,
    place: Place,
    stopping: impl Future<Output = ()>,
) {
    let (mut sink, mut stream) = socket.split();
    let (out_tx, mut out_rx) = mpsc::channel::<(Message, bool)>(16);
    let (in_tx, in_rx) = mpsc::channel::<Typed>(16);
    std::thread::spawn(move || {
        read_terminal(output, out_tx);
        drop(place);
    });
    std::thread::spawn(move || type_into(input, in_rx));
    tokio::pin!(stopping);
    loop {
        tokio::select! {
            () = &mut stopping => {
                let _ = sink.send(Message::Close(Some(CloseFrame { code: 1001, reason: "the service is stopping".into() }))).await;
                break;
            }
            out = out_rx.recv() => {
                let Some((msg, last)) = out else { break };
                if sink.send(msg).await.is_err() {
                    break;
                }
                if last {
                    let _ = sink.send(Message::Close(Some(CloseFrame { code: 1000, reason: "".into() }))).await;
                    break;
                }
            }
            msg = stream.next() => {
                let typed = match msg {
                    Some(Ok(Message::Binary(b))) => Typed::Keys(b.to_vec()),
                    Some(Ok(Message::Text(t))) => match serde_json::from_str::<Control>(&t) {
                        Ok(Control::Resize { cols, rows }) => match PtySize::new(cols, rows) {
                            Ok(size) => Typed::Resize(size),
                            Err(e) => {
                                let _ = sink.send(error_message("invalid_size", &e)).await;
                                continue;
                            }
                        },
                        Err(e) => {
                            let why = format!("a text message must be {{\"type\": \"resize\", \"cols\": N, \"rows\": N}} ({e}); send keys as binary messages");
                            let _ = sink.send(error_message("bad_message", &why)).await;
                            continue;
                        }
                    },
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                    Some(Ok(_)) => continue,
                };
                if in_tx.send(typed).await.is_err() {
                    break;
                }
            }
        }
    }
}

fn read_terminal(mut output: PtyOutput, out: mpsc::Sender<(Message, bool)>) {
    loop {
        let (msg, last) = match output.recv() {
            Ok(PtyEvent::Output(bytes)) => (Message::Binary(bytes.into()), false),
            Ok(PtyEvent::Exited(s)) => {
                (text(serde_json::json!({ "type": "exit", "code": s.code, "signal": s.signal })), true)
            }
            Err(ClientError::Agent { code, message }) => {
                let code = serde_json::to_value(code).ok().and_then(|v| v.as_str().map(str::to_string));
                (error_message(code.as_deref().unwrap_or("agent"), &message), true)
            }
            Err(e) => (error_message("sandbox", &format!("the terminal ended: {e}")), true),
        };
        if out.blocking_send((msg, last)).is_err() || last {
            return;
        }
    }
}

fn type_into(mut input: PtyInput, mut typed: mpsc::Receiver<Typed>) {
    while let Some(t) = typed.blocking_recv() {
        let sent = match t {
            Typed::Keys(k) => input.write(&k),
            Typed::Resize(size) => input.resize(size),
        };
        if sent.is_err() {
            break;
        }
    }
    input.close();
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    fn q(cols: Option<u16>, rows: Option<u16>, cmd: Option<&str>, cwd: Option<&str>) -> PtyQuery {
        PtyQuery {
            cols,
            rows,
            cmd: cmd.map(str::to_string),
            cwd: cwd.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn a_terminal_is_a_login_shell_of_80_by_24_unless_asked_otherwise() {
        let (spec, size) = spec_of(&q(None, None, None, None)).unwrap();
        assert_eq!((size.cols, size.rows), (80, 24));
        assert_eq!(spec.cmd, Command::Shell(LOGIN_SHELL.into()));
        let (spec, size) = spec_of(&q(Some(1000), Some(1), Some("top"), Some("/tmp"))).unwrap();
        assert_eq!((size.cols, size.rows, spec.cwd.as_deref()), (1000, 1, Some("/tmp")));
        assert_eq!(spec.cmd, Command::Shell("top".into()));
    }

    #[test]
    fn impossible_sizes_commands_and_paths_are_refused_before_anything_starts() {
        let long = "x".repeat(MAX_CMD + 1);
        for bad in [
            q(Some(0), None, None, None),
            q(None, Some(1001), None, None),
            q(None, None, Some(" "), None),
            q(None, None, Some("a\0b"), None),
            q(None, None, Some(&long), None),
            q(None, None, None, Some("relative")),
        ] {
            let e = spec_of(&bad).unwrap_err();
            let status = e.status;
            assert!(
                status == StatusCode::BAD_REQUEST || status == StatusCode::UNPROCESSABLE_ENTITY,
                "{bad:?}: {status}"
            );
        }
    }

    #[test]
    fn only_the_resize_message_is_a_control_message() {
        let ok: Control = serde_json::from_str(r#"{"type":"resize","cols":100,"rows":30}"#).unwrap();
        assert!(matches!(ok, Control::Resize { cols: 100, rows: 30 }));
        for bad in [
            r#"{"type":"resize","cols":-1,"rows":30}"#,
            r#"{"type":"kill"}"#,
            r#"{"type":"resize","cols":1,"rows":1,"x":1}"#,
            "ls\n",
        ] {
            assert!(serde_json::from_str::<Control>(bad).is_err(), "{bad}");
        }
    }
}
