//! Commands: run to completion (collected, or streamed as server-sent events), background
//! processes (start, list, signal, wait).

use super::follow::{error_event, exit_event};
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{pid, sandbox_id, seconds, ApiJson};
use crate::ops::commands::{run_time, spec, with_defaults};
use crate::ops::types::*;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::{Extension, Json};
use base64::Engine as _;
use branchbox_protocol::{Command, OutStream};
use futures_util::Stream;
use std::convert::Infallible;
use std::time::Duration;

/// Runs a command to completion and returns its output.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/commands", tag = "commands",
    params(("id" = String, Path, description = "sandbox id")), request_body = RunCommand,
    responses((status = 200, body = CommandResult, description = "the command ended (any exit code)"),
              (status = "4XX", body = ErrorBody, description = "bad command, not found, paused (409)")))]
pub async fn run(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<RunCommand>,
) -> ApiResult<Json<CommandResult>> {
    let id = sandbox_id(&id)?;
    let out = st
        .blocking(move |engine, st| {
            let spec = with_defaults(engine, &id, spec(st, &id, &req)?)?;
            let mut conn = st.agent(engine, &id, run_time(&spec))?;
            let cmd = spec.cmd.clone();
            let out = conn.exec(spec, req.stdin.as_deref().map(str::as_bytes))?;
            drop(conn);
            let mut result = CommandResult::new(&out.stdout, &out.stderr, &out.status);
            result.checkpoint = engine.after_exec(&id, &cmd, &out.status)?.map(|s| s.id.to_string());
            Ok(result)
        })
        .await?;
    Ok(Json(out))
}

/// Runs a command and streams its output as server-sent events: `stdout` and `stderr` events
/// carry `{"data": <base64 bytes>}`, then one `exit` event carries `{exit_code, signal,
/// timed_out, truncated, oom_killed, duration_ms}` (or one `error` event carries `{"error": {...}}`).
/// A client that goes away ends the stream at once (the command runs on to its timeout); the
/// streams a sandbox holds open are bounded (`crate::streams`).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/commands/stream", tag = "commands",
    params(("id" = String, Path, description = "sandbox id")), request_body = RunCommand,
    responses((status = 200, content_type = "text/event-stream", body = StreamEvent, description = "stdout/stderr events, then exit"),
              (status = "4XX", body = ErrorBody, description = "bad command, not found, paused (409), too many streams open in the sandbox, with the token or in the service (429)")))]
pub async fn run_stream(
    State(st): State<AppState>,
    Path(id): Path<String>,
    caller: Option<Extension<Caller>>,
    ApiJson(req): ApiJson<RunCommand>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let id = sandbox_id(&id)?;
    let place = super::follow::place(&st, &id, &caller)?;
    // Connect before answering, so a missing or paused sandbox gets its status code rather
    // than an error event.
    let sandbox = id.clone();
    let (mut conn, spec) = st
        .blocking(move |engine, st| {
            let spec = with_defaults(engine, &id, spec(st, &id, &req)?)?;
            Ok((st.agent(engine, &id, run_time(&spec))?, (spec, req.stdin)))
        })
        .await?;
    let (spec, stdin) = spec;
    let cmd = spec.cmd.clone();
    // The stream shuts the agent connection when the client goes away (or the service stops),
    // which ends the wait for output instead of holding a thread until the command's timeout.
    let (tx, rx) = super::follow::follower(&st, &mut conn)?;
    let out = tx.clone();
    let worker = tokio::task::spawn_blocking(move || {
        let _place = place;
        let mut gone = false;
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut input = stdin.as_deref().map(str::as_bytes);
        conn.exec_streaming(spec, input.as_mut().map(|s| s as &mut dyn std::io::Read), &mut |which, chunk| {
            if gone {
                return;
            }
            let name = if which == OutStream::Stdout { "stdout" } else { "stderr" };
            let data = serde_json::json!({ "data": b64.encode(chunk) }).to_string();
            gone = out.blocking_send(Ok(Event::default().event(name).data(data))).is_err();
        })
    });
    tokio::spawn(async move {
        let last = match worker.await {
            Ok(Ok(status)) => {
                // Step-history mode: the checkpoint follows the command, before `exit`.
                let ended = status.clone();
                let step = st.blocking(move |engine, _| Ok(engine.after_exec(&sandbox, &cmd, &ended)?)).await;
                match step {
                    Ok(cp) => exit_event(&status, cp.map(|s| s.id.to_string())),
                    Err(e) => error_event(&e),
                }
            }
            Ok(Err(e)) => error_event(&ApiError::from(e)),
            Err(e) => error_event(&ApiError::internal(format!("a worker failed: {e}"))),
        };
        let _ = tx.send(Ok(last)).await;
    });
    Ok(Sse::new(rx).keep_alive(KeepAlive::default()))
}

/// Starts a background process. With `stdin` (text, possibly empty) its stdin stays open: the
/// text is written first, and more goes to `POST .../processes/{pid}/stdin`.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes", tag = "commands",
    params(("id" = String, Path, description = "sandbox id")), request_body = RunCommand,
    responses((status = 201, body = ProcessStarted), (status = "4XX", body = ErrorBody, description = "bad command, not found, paused (409)")))]
pub async fn start_process(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<RunCommand>,
) -> ApiResult<(StatusCode, Json<ProcessStarted>)> {
    let id = sandbox_id(&id)?;
    let pid = st
        .blocking(move |engine, st| {
            let mut spec = with_defaults(engine, &id, spec(st, &id, &req)?)?;
            // A background process lives until killed; the command timeout applies only when asked.
            if req.timeout.is_none() {
                spec.timeout_ms = None;
            }
            // With `stdin` (even empty) its stdin stays open for .../{pid}/stdin, this text first.
            spec.stdin = req.stdin.is_some();
            let mut conn = st.agent(engine, &id, Duration::ZERO)?;
            let pid = conn.spawn(spec)?;
            if let Some(text) = req.stdin.as_deref().filter(|t| !t.is_empty()) {
                conn.proc_input(pid, text.as_bytes(), false)?;
            }
            Ok(pid)
        })
        .await?;
    Ok((StatusCode::CREATED, Json(ProcessStarted { pid })))
}

/// Lists background processes.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes", tag = "commands",
    params(("id" = String, Path, description = "sandbox id")),
    responses((status = 200, body = Vec<ProcessInfo>), (status = "4XX", body = ErrorBody, description = "not found, paused (409)")))]
pub async fn list_processes(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Vec<ProcessInfo>>> {
    let id = sandbox_id(&id)?;
    let procs =
        st.blocking(move |engine, st| Ok(st.agent(engine, &id, Duration::ZERO)?.list_procs()?)).await?;
    Ok(Json(
        procs
            .into_iter()
            .map(|p| ProcessInfo {
                pid: p.pid,
                argv: match p.cmd {
                    Command::Argv(a) => a,
                    Command::Shell(s) => vec!["/bin/sh".into(), "-c".into(), s],
                },
                running: p.exit.is_none(),
                exit_code: p.exit.as_ref().and_then(|e| e.code),
                signal: p.exit.as_ref().and_then(|e| e.signal),
            })
            .collect(),
    ))
}

/// Sends a signal to a background process (or its process group).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/signal", tag = "commands",
    params(("id" = String, Path, description = "sandbox id"), ("pid" = String, Path, description = "process id")),
    request_body = SendSignal,
    responses((status = 204, description = "sent"), (status = "4XX", body = ErrorBody, description = "bad signal, no such process")))]
pub async fn signal(
    State(st): State<AppState>,
    Path((id, p)): Path<(String, String)>,
    ApiJson(req): ApiJson<SendSignal>,
) -> ApiResult<StatusCode> {
    let id = sandbox_id(&id)?;
    let p = pid(&p)?;
    if !(1..=64).contains(&req.signal) {
        return Err(ApiError::invalid(format!("signal {} is out of range (1-64)", req.signal)));
    }
    st.blocking(move |engine, st| {
        Ok(st.agent(engine, &id, Duration::ZERO)?.signal(p, req.signal, req.group)?)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Waits for a background process to exit and returns its result (and forgets it).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/wait", tag = "commands",
    params(("id" = String, Path, description = "sandbox id"), ("pid" = String, Path, description = "process id")),
    request_body = WaitProcess,
    responses((status = 200, body = WaitResult), (status = "4XX", body = ErrorBody, description = "bad timeout, no such process")))]
pub async fn wait(
    State(st): State<AppState>,
    Path((id, p)): Path<(String, String)>,
    ApiJson(req): ApiJson<WaitProcess>,
) -> ApiResult<Json<WaitResult>> {
    let id = sandbox_id(&id)?;
    let p = pid(&p)?;
    let t = seconds(
        "timeout",
        req.timeout.unwrap_or(st.cfg.default_exec_timeout_s as f64),
        st.cfg.max_exec_timeout_s,
    )?;
    let out = st
        .blocking(move |engine, st| {
            let r = st.agent(engine, &id, t)?.wait(p, Some(t.as_millis().max(1) as u64))?;
            Ok(match r {
                None => WaitResult { running: true, result: None },
                Some(o) => WaitResult {
                    running: false,
                    result: Some(CommandResult::new(&o.stdout, &o.stderr, &o.status)),
                },
            })
        })
        .await?;
    Ok(Json(out))
}
