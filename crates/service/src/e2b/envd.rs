//! envd's data plane as E2B's SDKs address it when `E2B_SANDBOX_URL` is set: every request goes
//! to that one URL and names its sandbox in `E2b-Sandbox-Id` (and envd's port in
//! `E2b-Sandbox-Port`). Served: `process.Process` `Start` (server-streaming), `List` and
//! `SendSignal`; `filesystem.Filesystem` `Stat`, `ListDir`, `MakeDir`, `Move` and `Remove`;
//! `GET /files` (read), `POST /files` (write: `multipart/form-data` or a raw body) and
//! `GET /health`. Each maps onto the sandbox's agent through the engine, as the service's own
//! routes do. Other methods answer Connect's `unimplemented`.
//!
//! This file holds the data plane's authentication, `/health`, and what its calls share
//! (requests, answers, streams and their bounds); the calls are in `follow.rs` (processes),
//! `terminals.rs`, `files.rs` and `watch.rs`, and the routes in `mod.rs`.

use super::connect::{self, Codec, Kind, RpcError, MAX_MESSAGE};
use super::pb::{self, process_event, process_selector};
use crate::auth::Caller;
use crate::error::{ApiError, ErrorCodeTag};
use crate::extract::{account_name, sandbox_id};
use crate::ops::types::StateName;
use crate::state::AppState;
use crate::streams::{self, Detach, Place, Refused};
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use base64::Engine as _;
use branchbox_model::SandboxId;
use branchbox_protocol::ExitStatus;
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::future::Future;
use std::sync::{Mutex, MutexGuard};

/// The sandbox a data-plane request addresses, and who sent it.
#[derive(Debug, Clone)]
pub struct Target {
    /// From `E2b-Sandbox-Id`.
    pub sandbox: SandboxId,
}

/// An error answer every data-plane client understands: Connect's JSON error object (a string
/// `code` and a `message`) with the matching HTTP status. envd's HTTP clients read `message`.
pub(super) fn error_response(e: &RpcError) -> Response {
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = (status, axum::Json(e.json())).into_response();
    r.extensions_mut().insert(ErrorCodeTag(e.code));
    r
}

/// Data-plane authentication: the sandbox named by `E2b-Sandbox-Id`, opened by its access
/// token (`X-Access-Token`) or by an API key (`X-API-Key`). `Authorization` here is envd's
/// `Basic <user>:` naming the account to act as, not a credential.
pub async fn authenticate(State(st): State<AppState>, mut req: Request, next: Next) -> Response {
    let h = req.headers();
    let Some(raw) = super::header(h, "e2b-sandbox-id") else {
        return error_response(&RpcError::invalid(
            "name the sandbox in the E2b-Sandbox-Id header (E2B's SDKs do when E2B_SANDBOX_URL is set)",
        ));
    };
    let sandbox = match sandbox_id(raw) {
        Ok(s) => s,
        Err(e) => return error_response(&RpcError::invalid(e.message)),
    };
    let caller = match &st.tokens {
        None => Some(Caller("anonymous".into())),
        Some(t) => {
            let by_access = super::header(h, "x-access-token")
                .filter(|v| v.len() <= 512)
                .and_then(|v| t.check_sandbox_token(sandbox.as_str(), v));
            by_access
                .or_else(|| super::header(h, "x-api-key").filter(|v| v.len() <= 512).and_then(|v| t.check(v)))
        }
    };
    let Some(caller) = caller else {
        return error_response(&RpcError::new(
            "unauthenticated",
            "send the sandbox's envdAccessToken as X-Access-Token, or the service token as X-API-Key",
        ));
    };
    req.extensions_mut().insert(caller);
    req.extensions_mut().insert(Target { sandbox });
    next.run(req).await
}

/// The account a request acts as: envd's `Authorization: Basic base64(<user>:)`, else `user`
/// (E2B's default account, which branchbox's images have).
pub fn user_of(h: &HeaderMap) -> Result<String, RpcError> {
    let Some(v) = h.get(header::AUTHORIZATION) else { return Ok("user".into()) };
    let bad =
        || RpcError::invalid("Authorization must be `Basic base64(<user>:)` naming the account to act as");
    let v = v.to_str().map_err(|_| bad())?;
    let enc = v.strip_prefix("Basic ").ok_or_else(bad)?;
    if enc.len() > 256 {
        return Err(bad());
    }
    let dec = base64::engine::general_purpose::STANDARD.decode(enc.trim()).map_err(|_| bad())?;
    let dec = String::from_utf8(dec).map_err(|_| bad())?;
    let name = dec.split(':').next().unwrap_or("");
    if name.is_empty() {
        return Ok("user".into());
    }
    account_name("user", name).map_err(|e| RpcError::invalid(e.message))
}

/// A path as envd takes it: absolute, or relative to the account's home.
pub fn resolve(path: &str, user: &str) -> Result<String, RpcError> {
    let full = if path.starts_with('/') {
        path.to_string()
    } else {
        let home = if user == "root" { "/root".to_string() } else { format!("/home/{user}") };
        if path.is_empty() || path == "." {
            home
        } else {
            format!("{home}/{}", path.strip_prefix("./").unwrap_or(path))
        }
    };
    branchbox_protocol::limits::check_guest_path(&full).map_err(|e| RpcError::invalid(e.to_string()))?;
    Ok(full)
}

pub(super) fn kind_of(h: &HeaderMap) -> Option<Kind> {
    h.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).and_then(Kind::from_content_type)
}

pub(super) async fn read_body(body: Body) -> Result<Bytes, RpcError> {
    axum::body::to_bytes(body, MAX_MESSAGE + 5).await.map_err(|_| {
        RpcError::new(
            "resource_exhausted",
            format!("the request is over {MAX_MESSAGE} bytes or could not be read"),
        )
    })
}

/// One unary call: decode by the content type, run, encode the answer in the same codec.
pub(super) async fn unary<Req, Resp, F, Fut>(h: &HeaderMap, body: Body, f: F) -> Response
where
    Req: prost::Message + Default + DeserializeOwned,
    Resp: prost::Message + Serialize,
    F: FnOnce(Req) -> Fut,
    Fut: Future<Output = Result<Resp, RpcError>>,
{
    let codec = match kind_of(h) {
        Some(Kind::Unary(c)) => c,
        _ => {
            let mut r = error_response(&RpcError::invalid(
                "a unary call takes Content-Type application/json or application/proto",
            ));
            *r.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
            return r;
        }
    };
    let result = async {
        let bytes = read_body(body).await?;
        let req: Req = connect::decode(codec, &bytes)?;
        f(req).await
    }
    .await;
    match result {
        Ok(resp) => {
            let ct = Kind::Unary(codec).content_type();
            ([(header::CONTENT_TYPE, ct)], connect::encode(codec, &resp)).into_response()
        }
        Err(e) => error_response(&e),
    }
}

pub(super) fn api(e: ApiError) -> RpcError {
    RpcError::from(e)
}

/// `GET /health`: 204 while the sandbox runs, as envd answers.
pub(super) async fn health(State(st): State<AppState>, Extension(t): Extension<Target>) -> Response {
    let id = t.sandbox.clone();
    let info = st.blocking(move |engine, st| crate::ops::sandboxes::info(engine, st, &id)).await;
    // As E2B's proxy answers for a sandbox that is gone ("... was not found", the words the SDKs
    // look for): `is_running` reads false, and a call that failed as its sandbox was killed
    // probes this and says the sandbox "was killed or reached its end of life".
    let gone = |id: &SandboxId| {
        error_response(&RpcError::new("unavailable", format!("sandbox {id} was not found"))).with_status(502)
    };
    match info {
        Ok(i) if i.state == StateName::Running => StatusCode::NO_CONTENT.into_response(),
        Ok(i) if i.state == StateName::Lost => gone(&t.sandbox),
        Ok(_) => error_response(&RpcError::new("unavailable", "the sandbox is not running")).with_status(502),
        Err(e) if e.status == StatusCode::NOT_FOUND => gone(&t.sandbox),
        Err(e) => error_response(&api(e)),
    }
}

trait WithStatus {
    fn with_status(self, s: u16) -> Response;
}

impl WithStatus for Response {
    fn with_status(mut self, s: u16) -> Response {
        *self.status_mut() = StatusCode::from_u16(s).unwrap_or(StatusCode::BAD_GATEWAY);
        self
    }
}

// ---- process ----

pub(super) fn event(e: process_event::Event) -> pb::StartResponse {
    pb::StartResponse { event: Some(pb::ProcessEvent { event: Some(e) }) }
}

/// The end event of a command, or the error that ends its stream (a timeout).
pub fn end_of(s: &branchbox_protocol::ExitStatus) -> Result<process_event::EndEvent, RpcError> {
    if s.timed_out {
        return Err(RpcError::new(
            "deadline_exceeded",
            "the command ran past its timeout and its process group was killed; pass a longer timeout (0: the service's maximum)",
        ));
    }
    let (exit_code, status) = match (s.code, s.signal) {
        (Some(c), _) => (c, format!("exit status {c}")),
        (None, Some(9)) => (-1, "signal: killed".to_string()),
        (None, Some(15)) => (-1, "signal: terminated".to_string()),
        (None, Some(n)) => (-1, format!("signal: {n}")),
        (None, None) => (-1, "unknown".to_string()),
    };
    let error = if s.oom_killed {
        Some("a process of the command was killed: the sandbox reached its memory limit".to_string())
    } else if s.truncated {
        Some("the output passed the service's limit; the rest was discarded".to_string())
    } else {
        None
    };
    Ok(process_event::EndEvent { exit_code, exited: s.code.is_some(), status, error })
}

/// A stream's body: enveloped messages, then the end-of-stream message.
pub(super) fn stream_response(kind: Kind, rx: tokio::sync::mpsc::Receiver<Bytes>) -> Response {
    let body =
        Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, std::io::Error>));
    ([(header::CONTENT_TYPE, kind.content_type())], body).into_response()
}

pub(super) fn stream_error(kind: Kind, e: &RpcError) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let _ = tx.try_send(Bytes::from(connect::end_stream(Some(e))));
    let mut r = stream_response(kind, rx);
    r.extensions_mut().insert(ErrorCodeTag(e.code));
    r
}

pub(super) fn message(codec: Codec, m: &pb::StartResponse) -> Bytes {
    Bytes::from(connect::envelope(0, &connect::encode(codec, m)))
}

pub(super) fn selected_pid(sel: Option<pb::ProcessSelector>) -> Result<i32, RpcError> {
    match sel.and_then(|s| s.selector) {
        Some(process_selector::Selector::Pid(p)) if p > 0 && p <= i32::MAX as u32 => Ok(p as i32),
        Some(process_selector::Selector::Pid(p)) => {
            Err(RpcError::invalid(format!("pid {p} is not a process id")))
        }
        Some(process_selector::Selector::Tag(_)) => {
            Err(RpcError::unimplemented("selecting processes by tag is not served; select by pid"))
        }
        None => Err(RpcError::invalid("select the process by pid")),
    }
}

// ---- streams ----

/// A lock, whatever a thread that panicked holding it left.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What follows a terminal or a command: output, then how it ended.
pub(super) enum Ev {
    /// Output.
    Data(process_event::Output),
    /// How it ended, or the error that ends its stream.
    End(Result<ExitStatus, RpcError>),
}

/// The call's keepalive period, seconds (`Keepalive-Ping-Interval`, 1 to 3600).
pub(super) fn keepalive_of(h: &HeaderMap) -> Option<u64> {
    h.get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|s| (1..=3600).contains(s))
}

/// The call's `Connect-Timeout-Ms`, when one is given and not 0.
pub(super) fn deadline_of(h: &HeaderMap) -> Result<Option<u64>, RpcError> {
    Ok(connect::timeout_ms(h.get("connect-timeout-ms").and_then(|v| v.to_str().ok()))?.filter(|ms| *ms > 0))
}

/// One enveloped message of a stream.
pub(super) fn envelope<M: prost::Message + serde::Serialize>(codec: Codec, m: &M) -> Bytes {
    Bytes::from(connect::envelope(0, &connect::encode(codec, m)))
}

/// The detacher of an agent connection (see `crate::streams`).
pub(super) fn detach_of(conn: &mut branchbox_model::AgentConn) -> Result<Detach, RpcError> {
    Detach::of(conn).map_err(api)
}

/// The token a data-plane call came with, which its streams count against.
pub(super) fn token_of(caller: &Option<Extension<Caller>>) -> &str {
    caller.as_ref().map_or("anonymous", |c| c.0 .0.as_str())
}

/// envd's answer past a stream bound.
pub(super) fn exhausted(r: Refused) -> RpcError {
    RpcError::new("resource_exhausted", r.to_string())
}

/// A place for a stream of `kind` in the call's sandbox, or envd's `resource_exhausted`.
pub(super) fn place(
    st: &AppState,
    kind: streams::Kind,
    id: &SandboxId,
    caller: &Option<Extension<Caller>>,
) -> Result<Place, RpcError> {
    st.streams.take(kind, id, token_of(caller)).map_err(exhausted)
}

/// The stream content type a streaming call must come with, or the answer refusing it.
pub(super) fn stream_kind(h: &HeaderMap, what: &str) -> Result<Kind, Box<Response>> {
    match kind_of(h) {
        Some(k @ Kind::Stream(_)) => Ok(k),
        _ => {
            let e = RpcError::invalid(format!(
                "{what} streams: send Content-Type application/connect+json or application/connect+proto"
            ));
            let mut r = error_response(&e);
            *r.status_mut() = axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE;
            Err(Box::new(r))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn the_user_comes_from_basic_auth_and_defaults_to_user() {
        let mut h = HeaderMap::new();
        assert_eq!(user_of(&h).unwrap(), "user");
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic cm9vdDo=")); // root:
        assert_eq!(user_of(&h).unwrap(), "root");
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic Ojo=")); // "::"
        assert_eq!(user_of(&h).unwrap(), "user");
        for bad in ["Bearer x", "Basic !!!", "Basic Oy1yZjo="] {
            h.insert(header::AUTHORIZATION, HeaderValue::from_str(bad).unwrap());
            assert_eq!(user_of(&h).unwrap_err().code, "invalid_argument", "{bad}");
        }
    }

    #[test]
    fn relative_paths_are_under_the_users_home() {
        assert_eq!(resolve("a.txt", "user").unwrap(), "/home/user/a.txt");
        assert_eq!(resolve("./a", "root").unwrap(), "/root/a");
        assert_eq!(resolve("", "user").unwrap(), "/home/user");
        assert_eq!(resolve("/etc/x", "user").unwrap(), "/etc/x");
        assert_eq!(resolve("/a\0b", "user").unwrap_err().code, "invalid_argument");
    }

    #[test]
    fn exits_map_to_end_events_and_timeouts_to_deadline_errors() {
        let mut s = branchbox_protocol::ExitStatus {
            code: Some(3),
            signal: None,
            timed_out: false,
            truncated: false,
            duration_ms: 1,
            oom_killed: false,
        };
        let e = end_of(&s).unwrap();
        assert_eq!((e.exit_code, e.exited, e.status.as_str(), e.error), (3, true, "exit status 3", None));
        s.code = None;
        s.signal = Some(9);
        let e = end_of(&s).unwrap();
        assert_eq!((e.exit_code, e.exited, e.status.as_str()), (-1, false, "signal: killed"));
        s.timed_out = true;
        assert_eq!(end_of(&s).unwrap_err().code, "deadline_exceeded");
    }

    #[test]
    fn selectors_need_a_positive_pid() {
        let sel = |s| Some(pb::ProcessSelector { selector: s });
        assert_eq!(selected_pid(sel(Some(process_selector::Selector::Pid(7)))).unwrap(), 7);
        assert!(selected_pid(sel(Some(process_selector::Selector::Pid(0)))).is_err());
        assert!(selected_pid(sel(Some(process_selector::Selector::Pid(u32::MAX)))).is_err());
        assert_eq!(
            selected_pid(sel(Some(process_selector::Selector::Tag("t".into())))).unwrap_err().code,
            "unimplemented"
        );
        assert!(selected_pid(None).is_err());
    }
}
