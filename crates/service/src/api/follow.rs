//! Following what runs on in a sandbox: typing into a background process's stdin, streaming
//! its output as it comes, and watching a directory for changes (server-sent events). A
//! stream ends as soon as its client goes or the service stops, and streams are bounded per
//! sandbox, per token and in the service (`crate::streams`).

use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{sandbox_id, sandbox_path, ApiJson, ApiQuery};
use crate::state::AppState;
use crate::streams::{self, Detach, Place};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::Extension;
use base64::Engine as _;
use branchbox_model::AgentConn;
use branchbox_protocol::{ExitStatus, FileKind, OutStream};
use futures_util::Stream;
use serde::Deserialize;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tokio::sync::mpsc;
use utoipa::{IntoParams, ToSchema};

/// Bytes for a background process's stdin.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessInput {
    /// Text to write (UTF-8); give this or `data_base64`, or neither with `eof`.
    pub data: Option<String>,
    /// Bytes to write, base64.
    pub data_base64: Option<String>,
    /// Close the process's stdin after writing (it then sees end of file).
    #[serde(default)]
    pub eof: bool,
}

/// From where to follow a process's output.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct OutputQuery {
    /// First send the output it kept so far (its last 1 MiB of stdout, then of stderr), with
    /// nothing lost or repeated between that and what follows.
    #[serde(default)]
    pub replay: bool,
}

/// Which directory to watch.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WatchQuery {
    /// Absolute path of a directory.
    pub path: String,
    /// Watch its subdirectories too (those made later included).
    #[serde(default)]
    pub recursive: bool,
}

/// Where a follower's events go.
pub(super) type Events = mpsc::Sender<Result<Event, Infallible>>;

/// How a streamed command ended (the `exit` event).
#[derive(serde::Serialize)]
struct ExitEvent {
    exit_code: Option<i32>,
    signal: Option<i32>,
    timed_out: bool,
    truncated: bool,
    oom_killed: bool,
    duration_ms: u64,
    checkpoint: Option<String>,
}

/// The `exit` event of a command followed to its end, with the checkpoint step-history mode took.
pub(super) fn exit_event(s: &ExitStatus, checkpoint: Option<String>) -> Event {
    let e = ExitEvent {
        exit_code: s.code,
        signal: s.signal,
        timed_out: s.timed_out,
        truncated: s.truncated,
        oom_killed: s.oom_killed,
        duration_ms: s.duration_ms,
        checkpoint,
    };
    Event::default().event("exit").data(serde_json::to_string(&e).unwrap_or_default())
}

/// The `error` event that ends a stream.
pub(super) fn error_event(e: &ApiError) -> Event {
    Event::default().event("error").data(serde_json::to_string(&e.body()).unwrap_or_default())
}

/// Writes to the stdin of a background process that was started with `stdin` (its stdin then
/// stays open until `eof`).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/stdin", tag = "commands",
    params(("id" = String, Path, description = "sandbox id"), ("pid" = String, Path, description = "process id")),
    request_body = ProcessInput,
    responses((status = 204, description = "written"),
              (status = "4XX", body = ErrorBody, description = "bad input, no such process (404), started without stdin or stdin closed (422), paused (409)")))]
pub async fn input(
    State(st): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
    ApiJson(req): ApiJson<ProcessInput>,
) -> ApiResult<StatusCode> {
    let (id, pid) = (sandbox_id(&id)?, crate::extract::pid(&pid)?);
    let bytes = match (req.data, req.data_base64) {
        (Some(_), Some(_)) => return Err(ApiError::invalid("give data or data_base64, not both")),
        (Some(text), None) => text.into_bytes(),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64.as_bytes())
            .map_err(|e| ApiError::invalid(format!("data_base64 is not base64: {e}")))?,
        (None, None) if req.eof => Vec::new(),
        (None, None) => return Err(ApiError::invalid("give data, data_base64 or eof")),
    };
    let eof = req.eof;
    st.blocking(move |engine, st| Ok(st.agent(engine, &id, Duration::ZERO)?.proc_input(pid, &bytes, eof)?))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// What a follower hands the client: the events its worker sends, until the worker ends (and
/// drops its sender) or the service stops. Dropped when the client goes (or ended by the
/// stop), it shuts the agent connection, which ends the worker's blocking read at once; the
/// connection has no stall limit (a quiet process or directory is no stalled agent).
pub(super) struct Follow {
    rx: mpsc::Receiver<Result<Event, Infallible>>,
    stopping: Pin<Box<dyn Future<Output = ()> + Send>>,
    detach: Option<Detach>,
}

impl Stream for Follow {
    type Item = Result<Event, Infallible>;

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        if self.stopping.as_mut().poll(cx).is_ready() {
            self.detach = None;
            return std::task::Poll::Ready(None);
        }
        self.rx.poll_recv(cx)
    }
}

/// A place for one more stream in sandbox `id`, counted against the caller's token.
pub(super) fn place(
    st: &AppState,
    id: &branchbox_model::SandboxId,
    caller: &Option<Extension<Caller>>,
) -> ApiResult<Place> {
    let token = caller.as_ref().map_or("anonymous", |c| c.0 .0.as_str());
    Ok(st.streams.take(streams::Kind::Follow, id, token)?)
}

/// A channel for a worker reading `conn`, and the stream the client is answered with.
pub(super) fn follower(st: &AppState, conn: &mut AgentConn) -> ApiResult<(Events, Follow)> {
    let (tx, rx) = mpsc::channel::<Result<Event, Infallible>>(64);
    let detach = Detach::of(conn)?;
    Ok((tx, Follow { rx, stopping: st.streams.stopping(), detach: Some(detach) }))
}

/// Streams a background process's output from now on (with `replay`, what it kept first) as
/// server-sent events, as `commands/stream` does; the answer comes once the agent reads the
/// process for the stream, so nothing it prints after the answer is missed: `stdout`/`stderr` with `{"data": base64}`, then `exit` (at once
/// when it has ended), or `error`. Its output so far is in `wait`'s tails.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{pid}/output", tag = "commands",
    params(("id" = String, Path, description = "sandbox id"), ("pid" = String, Path, description = "process id"), OutputQuery),
    responses((status = 200, content_type = "text/event-stream", body = crate::ops::types::StreamEvent, description = "stdout/stderr events, then exit"),
              (status = "4XX", body = ErrorBody, description = "no such process (404), paused (409), too many streams open in the sandbox, with the token or in the service (429)")))]
pub async fn output(
    State(st): State<AppState>,
    Path((id, pid)): Path<(String, String)>,
    caller: Option<Extension<Caller>>,
    ApiQuery(q): ApiQuery<OutputQuery>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let (id, pid) = (sandbox_id(&id)?, crate::extract::pid(&pid)?);
    let place = place(&st, &id, &caller)?;
    let replay = q.replay;
    let mut conn = st
        .blocking(move |engine, st| {
            if !st.agent(engine, &id, Duration::ZERO)?.list_procs()?.iter().any(|p| p.pid == pid) {
                return Err(ApiError::not_found(format!(
                    "no background process with pid {pid}; GET /v1/sandboxes/{id}/processes lists them"
                )));
            }
            Ok(engine.connect(&id)?)
        })
        .await?;
    let (tx, rx) = follower(&st, &mut conn)?;
    let (attaching, in_place) = streams::Attaching::new();
    tokio::task::spawn_blocking(move || {
        let _place = place;
        let b64 = base64::engine::general_purpose::STANDARD;
        let r = conn.attach_then(pid, replay, &mut || attaching.done(), &mut |which, chunk| {
            attaching.done();
            let name = if which == OutStream::Stdout { "stdout" } else { "stderr" };
            let data = serde_json::json!({ "data": b64.encode(chunk) }).to_string();
            let _ = tx.blocking_send(Ok(Event::default().event(name).data(data)));
        });
        let last = match r {
            Ok(status) => exit_event(&status, None),
            Err(e) => error_event(&ApiError::from(e)),
        };
        let _ = tx.blocking_send(Ok(last));
    });
    // Answer once the agent reads for us: what the process prints after the client has its
    // answer (the input it then sends, say) is never lost.
    in_place.await;
    Ok(Sse::new(rx).keep_alive(KeepAlive::default()))
}

/// Watches a directory: `ready` once the watch is in place (every change after it is
/// reported), then one `change` event per change under it, `{"type": "create" | "write" |
/// "remove" | "rename" | "chmod", "name": <absolute path>}`, until the client goes; `end` with
/// `{"events": N}` when the directory itself is removed or moved; `error` on failure.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/watch", tag = "files",
    params(("id" = String, Path, description = "sandbox id"), WatchQuery),
    responses((status = 200, content_type = "text/event-stream", description = "change events"),
              (status = "4XX", body = ErrorBody, description = "bad path, not a directory (422), not found (404), paused (409), too many streams open in the sandbox, with the token or in the service (429)")))]
pub async fn watch(
    State(st): State<AppState>,
    Path(id): Path<String>,
    caller: Option<Extension<Caller>>,
    ApiQuery(q): ApiQuery<WatchQuery>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let id = sandbox_id(&id)?;
    let path = sandbox_path(&q.path)?;
    let place = place(&st, &id, &caller)?;
    let recursive = q.recursive;
    let dir = path.clone();
    let mut conn = st
        .blocking(move |engine, st| {
            if st.agent(engine, &id, Duration::ZERO)?.stat(&dir)?.kind != FileKind::Dir {
                return Err(ApiError::invalid(format!("{dir} is not a directory; watch a directory")));
            }
            Ok(engine.connect(&id)?)
        })
        .await?;
    let (tx, rx) = follower(&st, &mut conn)?;
    tokio::task::spawn_blocking(move || {
        let _place = place;
        let r = conn.watch(&path, recursive, &mut |e| {
            let event = match e {
                None => Event::default().event("ready").data("{}"),
                Some(e) => {
                    Event::default().event("change").data(serde_json::to_string(&e).unwrap_or_default())
                }
            };
            tx.blocking_send(Ok(event)).is_ok()
        });
        let last = match r {
            Ok(n) => Event::default().event("end").data(serde_json::json!({ "events": n }).to_string()),
            Err(e) => error_event(&ApiError::from(e)),
        };
        let _ = tx.blocking_send(Ok(last));
    });
    Ok(Sse::new(rx).keep_alive(KeepAlive::default()))
}
