//! envd's data plane as E2B's SDKs address it when `E2B_SANDBOX_URL` is set: every request goes
//! to that one URL and names its sandbox in `E2b-Sandbox-Id` (and envd's port in
//! `E2b-Sandbox-Port`). Served: `process.Process` `Start` (server-streaming), `List` and
//! `SendSignal`; `filesystem.Filesystem` `Stat`, `ListDir`, `MakeDir`, `Move` and `Remove`;
//! `GET /files` (read), `POST /files` (write: `multipart/form-data` or a raw body) and
//! `GET /health`. Each maps onto the sandbox's agent through the engine, as the service's own
//! routes do. Other methods answer Connect's `unimplemented`.

use super::connect::{self, Codec, Kind, RpcError, MAX_MESSAGE};
use super::pb::{self, process_event, process_selector};
use crate::api::extract::{account_name, sandbox_id};
use crate::api::types::StateName;
use crate::auth::Caller;
use crate::error::{ApiError, ErrorCodeTag};
use crate::state::AppState;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use base64::Engine as _;
use branchbox_model::SandboxId;
use branchbox_protocol::Command;
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::future::Future;
use std::time::Duration;

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

/// The data plane's routes (relative to `/e2b/envd`).
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/health", get(health))
        .route("/files", get(super::files::read_file).post(super::files::write_file))
        .route("/process.Process/Start", post(super::follow::start))
        .route("/process.Process/List", post(list))
        .route("/process.Process/SendSignal", post(send_signal))
        .route("/process.Process/Connect", post(super::follow::connect_to))
        .route("/process.Process/SendInput", post(super::follow::send_input))
        .route("/process.Process/StreamInput", post(super::follow::stream_input))
        .route("/process.Process/CloseStdin", post(super::follow::close_stdin))
        .route("/process.Process/Update", post(super::follow::update))
        .route("/filesystem.Filesystem/Stat", post(super::files::stat))
        .route("/filesystem.Filesystem/ListDir", post(super::files::list_dir))
        .route("/filesystem.Filesystem/MakeDir", post(super::files::make_dir))
        .route("/filesystem.Filesystem/Move", post(super::files::move_path))
        .route("/filesystem.Filesystem/Remove", post(super::files::remove))
        .route("/filesystem.Filesystem/WatchDir", post(super::watch::watch_dir))
        .route("/filesystem.Filesystem/CreateWatcher", post(super::watch::create_watcher))
        .route("/filesystem.Filesystem/GetWatcherEvents", post(super::watch::get_watcher_events))
        .route("/filesystem.Filesystem/RemoveWatcher", post(super::watch::remove_watcher))
        .fallback(|| async { error_response(&RpcError::unimplemented("no such envd method or route")) })
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

async fn health(State(st): State<AppState>, Extension(t): Extension<Target>) -> Response {
    let id = t.sandbox.clone();
    let info = st.blocking(move |engine, st| crate::api::sandboxes::info(engine, st, &id)).await;
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

async fn list(
    State(st): State<AppState>,
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
            .chain(super::follow::terminals(&st, &t.sandbox))
            .collect();
        Ok(pb::ListResponse { processes })
    })
    .await
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

async fn send_signal(
    State(st): State<AppState>,
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
        if super::follow::kill_terminal(&st, &t.sandbox, pid) {
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

// ---- filesystem ----

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
