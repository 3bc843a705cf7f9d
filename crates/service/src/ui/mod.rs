//! The lineage console at `/ui`: a page of plain HTML, CSS and JavaScript built into the binary,
//! which signs in with the service token and then drives the `/v1` API with a session cookie
//! and the session's CSRF token, from its own origin only (see [`session`], [`origin`]).
//! Besides the page and its two assets it serves `/ui/api/session` (sign in, whether the
//! session is live, sign out) and `/ui/api/events`, a server-sent event stream of the sandbox
//! list and the lineage whenever they change. `docs/console.md` describes it.

pub mod origin;
mod page;
pub mod session;
pub mod terminal;

use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::extract::ApiJson;
use crate::ops::types::ListSandboxes;
use crate::state::AppState;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use std::convert::Infallible;
use std::time::Duration;

const INDEX: &str = include_str!("../../ui/index.html");
const SCRIPT: &str = include_str!("../../ui/app.js");
const STYLE: &str = include_str!("../../ui/app.css");

/// Where the console's pages may load from: only this origin, no inline script or style, no
/// framing, no plugins.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                       connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; \
                       frame-ancestors 'none'";

/// How often the event stream looks for changes.
const TICK: Duration = Duration::from_secs(1);

/// The console's routes.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/ui", get(|| asset(INDEX, "text/html; charset=utf-8")))
        .route("/ui/", get(|| asset(INDEX, "text/html; charset=utf-8")))
        .route("/ui/app.js", get(|| asset(SCRIPT, "text/javascript; charset=utf-8")))
        .route("/ui/app.css", get(|| asset(STYLE, "text/css; charset=utf-8")))
        .route("/ui/api/session", get(whoami).post(sign_in).delete(sign_out))
        .route("/ui/api/events", get(events))
        .merge(terminal::router())
}

async fn asset(body: &'static str, kind: &'static str) -> Response {
    page::served(body, kind, CSP, "DENY")
}

/// The sign-in body.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignIn {
    /// The service token.
    pub token: String,
}

/// What the page learns about its session.
#[derive(serde::Serialize)]
pub struct SessionInfo {
    /// False when the service runs without authentication (`--insecure-no-auth`); nothing to sign in to.
    pub auth: bool,
    /// The session's CSRF token, for the `X-CSRF-Token` header of every request. Handed out
    /// by sign-in only; `GET /ui/api/session` answers only a request that already carries it.
    pub csrf: String,
    /// The audit id of the token signed in with.
    pub who: String,
}

fn unauthorized(why: &str) -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        format!("{why}; sign in with the token from <data>/service/token"),
    )
}

/// The session of a request: its cookie, from the console's own origin, with the session's CSRF
/// token `presented` (401 without a live session, 403 otherwise). With authentication off every
/// request is the anonymous caller's.
fn session_of(
    st: &AppState,
    headers: &HeaderMap,
    presented: Option<&str>,
) -> ApiResult<(Option<String>, SessionInfo)> {
    let Some(tokens) = &st.tokens else {
        return Ok((None, SessionInfo { auth: false, csrf: String::new(), who: "anonymous".into() }));
    };
    if session::cookie(headers).is_none() {
        return Err(unauthorized("not signed in"));
    }
    let (id, live) = tokens.session_request(headers, presented)?;
    Ok((Some(id), SessionInfo { auth: true, csrf: live.csrf, who: live.caller.0 }))
}

/// The `X-CSRF-Token` header of a request.
fn csrf_header(headers: &HeaderMap) -> Option<&str> {
    headers.get(session::CSRF_HEADER).and_then(|v| v.to_str().ok())
}

/// Whether the page's session is live; the page proves it holds the CSRF token, so the answer
/// tells nothing new to a holder of the cookie alone.
async fn whoami(State(st): State<AppState>, headers: HeaderMap) -> ApiResult<Json<SessionInfo>> {
    Ok(Json(session_of(&st, &headers, csrf_header(&headers))?.1))
}

/// Checks the token exactly as the API does and starts a session; the answer is the only
/// place the session's CSRF token is given out.
async fn sign_in(
    State(st): State<AppState>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<SignIn>,
) -> ApiResult<Response> {
    let Some(tokens) = &st.tokens else {
        return Ok(
            Json(SessionInfo { auth: false, csrf: String::new(), who: "anonymous".into() }).into_response()
        );
    };
    origin::require_same(&headers)?;
    let name = session::cookie_name(&headers)
        .ok_or_else(|| ApiError::bad_request("bad_host", "the request's Host header does not parse"))?;
    let Caller(who) = tokens.check(&req.token).ok_or_else(|| unauthorized("the token is not valid"))?;
    let issued = tokens.sessions.start(Caller(who.clone()));
    let mut r = Json(SessionInfo { auth: true, csrf: issued.csrf, who }).into_response();
    let cookie = HeaderValue::from_str(&session::set_cookie(&name, &issued.id))
        .map_err(|e| ApiError::internal(format!("cannot build the session cookie: {e}")))?;
    r.headers_mut().insert(header::SET_COOKIE, cookie);
    Ok(r)
}

/// Ends the session; the CSRF token is needed like for any request, so another page cannot sign
/// the user out.
async fn sign_out(State(st): State<AppState>, headers: HeaderMap) -> ApiResult<Response> {
    let (id, _) = session_of(&st, &headers, csrf_header(&headers))?;
    let mut r = StatusCode::NO_CONTENT.into_response();
    if let (Some(tokens), Some(id)) = (&st.tokens, id) {
        tokens.sessions.end(&id);
        if let Some(name) = session::cookie_name(&headers) {
            r.headers_mut().insert(
                header::SET_COOKIE,
                HeaderValue::from_str(&session::clear_cookie(&name))
                    .map_err(|e| ApiError::internal(format!("cannot build the session cookie: {e}")))?,
            );
        }
    }
    Ok(r)
}

/// The sandbox list and the lineage as JSON, as `GET /v1/sandboxes` and `GET /v1/lineage`
/// answer them.
async fn views(st: &AppState) -> ApiResult<(String, String)> {
    let boxes = crate::ops::sandboxes::list(st, ListSandboxes::default()).await?;
    let lineage = crate::ops::lineage::lineage(st, None).await?;
    Ok((text(&boxes), text(&lineage)))
}

/// JSON text of plain data (whose serialization cannot fail; a failure would read as `null`).
fn text<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

/// Completes when the service is asked to stop (SIGTERM or SIGINT, as `branchboxd` stops on);
/// never when those signals cannot be watched.
async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}

/// Server-sent events: `sandboxes` (the list) and `lineage`, each sent at once and again
/// whenever it changes (checked every second), until the client goes, its session ends or the
/// service stops. `EventSource` cannot send headers, so the CSRF token comes as `?csrf=`.
async fn events(State(st): State<AppState>, uri: Uri, headers: HeaderMap) -> ApiResult<impl IntoResponse> {
    let (id, _) = session_of(&st, &headers, session::csrf_param(&uri))?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event, Infallible>>(4);
    tokio::spawn(async move {
        let stopping = stop_signal();
        tokio::pin!(stopping);
        let (mut last_boxes, mut last_lineage) = (String::new(), String::new());
        loop {
            let signed_in = match (&st.tokens, &id) {
                (Some(t), Some(id)) => t.sessions.get(id).is_some(),
                _ => true,
            };
            if !signed_in || tx.is_closed() {
                break;
            }
            match views(&st).await {
                Ok((boxes, lineage)) => {
                    for (name, now, last) in
                        [("sandboxes", boxes, &mut last_boxes), ("lineage", lineage, &mut last_lineage)]
                    {
                        if now != *last {
                            if tx.send(Ok(Event::default().event(name).data(now.clone()))).await.is_err() {
                                return;
                            }
                            *last = now;
                        }
                    }
                }
                Err(e) => {
                    let data = serde_json::to_string(&e.body()).unwrap_or_default();
                    if tx.send(Ok(Event::default().event("failure").data(data))).await.is_err() {
                        return;
                    }
                }
            }
            tokio::select! {
                () = tokio::time::sleep(TICK) => {}
                // The stream would otherwise hold the service's shutdown for its whole drain time.
                () = &mut stopping => break,
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    Ok(([(header::CACHE_CONTROL, "no-store")], Sse::new(stream).keep_alive(KeepAlive::default())))
}

#[cfg(test)]
mod tests;
