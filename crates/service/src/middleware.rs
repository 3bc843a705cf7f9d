//! The middleware the surfaces' routes pass through, below all of them: authentication by
//! bearer token (or the console's session), the audit log of state-changing requests and what a
//! handler tells it ([`AuditNote`]), the time limit of control requests, and the request
//! metrics. `serve.rs` and each surface's router put them in place.

use crate::auth::Caller;
use crate::db::AuditEntry;
use crate::error::{ApiError, ErrorCodeTag};
use crate::state::AppState;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::time::Instant;

/// What a state-changing handler tells the audit log beyond the route and status.
#[derive(Debug, Clone, Default)]
pub struct AuditNote {
    /// The sandbox acted on or created.
    pub sandbox: Option<String>,
    /// The snapshot created, used or deleted.
    pub snapshot: Option<String>,
    /// The parent (source sandbox of a fork, snapshot a sandbox came from).
    pub parent: Option<String>,
    /// Anything else worth keeping.
    pub detail: Option<String>,
}

/// Authentication: the request's token (or session) names its caller, or it is refused.
pub async fn authenticate(State(st): State<AppState>, mut req: Request, next: Next) -> Response {
    let caller = match &st.tokens {
        None => Caller("anonymous".into()),
        Some(tokens) => match tokens.authenticate_request(req.method(), req.uri(), req.headers()) {
            Ok(c) => c,
            Err(e) => return e.into_response(),
        },
    };
    req.extensions_mut().insert(caller);
    next.run(req).await
}

/// The time limit of control requests (504 past `--request-timeout`).
pub async fn time_limit(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let limit = st.cfg.request_timeout;
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(r) => r,
        Err(_) => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "timeout",
            format!(
                "the operation did not finish within {} s; it may still complete, so check the sandbox or \
                 snapshot before retrying",
                limit.as_secs()
            ),
        )
        .into_response(),
    }
}

fn route_of(req: &Request) -> String {
    req.extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into())
}

/// Request metrics (and `Connection: close` on a refusal that left a body unread).
pub async fn count(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let (method, route, t) = (req.method().to_string(), route_of(&req), Instant::now());
    let has_body = req.headers().contains_key(header::TRANSFER_ENCODING)
        || req.headers().get(header::CONTENT_LENGTH).is_some_and(|v| v != "0");
    let mut r = next.run(req).await;
    st.metrics.request(&method, &route, r.status().as_u16(), t.elapsed());
    // A request refused before its body was read leaves unread bytes on the connection; closing
    // it (and saying so) keeps a client from sending its next request into them.
    if has_body && r.status().as_u16() >= 400 {
        r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

/// The `{id}` or `{snapshot}` segment of a path, when the route has one.
fn path_object(path: &str, collection: &str) -> Option<String> {
    path.strip_prefix(collection)?.split('/').next().filter(|s| !s.is_empty()).map(str::to_string)
}

/// The audit layer: records every state-changing request after it is answered.
pub async fn audit(State(st): State<AppState>, req: Request, next: Next) -> Response {
    // Reads are not recorded; opening a terminal (a GET, as every WebSocket handshake is) is.
    if matches!(*req.method(), Method::GET | Method::HEAD) && route_of(&req) != "/v1/sandboxes/{id}/pty" {
        return next.run(req).await;
    }
    let who = req.extensions().get::<Caller>().map(|c| c.0.clone()).unwrap_or_default();
    let action = format!("{} {}", req.method(), route_of(&req));
    let path = req.uri().path().to_string();
    let r = next.run(req).await;
    let note = r.extensions().get::<AuditNote>().cloned().unwrap_or_default();
    let entry = AuditEntry {
        seq: 0,
        at_ms: 0,
        who,
        action,
        status: r.status().as_u16(),
        code: r.extensions().get::<ErrorCodeTag>().map(|c| c.0.to_string()),
        sandbox: note
            .sandbox
            .or_else(|| path_object(&path, "/v1/sandboxes/"))
            .or_else(|| path_object(&path, "/e2b/sandboxes/"))
            .or_else(|| path_object(&path, "/e2b/v2/sandboxes/")),
        snapshot: note.snapshot.or_else(|| path_object(&path, "/v1/snapshots/")),
        parent: note.parent,
        detail: note.detail,
    };
    let st2 = st.clone();
    let written =
        tokio::task::spawn_blocking(move || st2.db().audit(branchbox_model::now_ms(), &entry)).await;
    if !matches!(written, Ok(Ok(()))) {
        tracing::error!("could not write an audit record: {written:?}");
    }
    r
}

#[cfg(test)]
mod tests {
    use super::path_object;

    #[test]
    fn audit_finds_the_object_in_the_path() {
        assert_eq!(path_object("/v1/sandboxes/sbx-1/fork", "/v1/sandboxes/").as_deref(), Some("sbx-1"));
        assert_eq!(path_object("/v1/sandboxes", "/v1/sandboxes/"), None);
        assert_eq!(path_object("/v1/snapshots/warm", "/v1/snapshots/").as_deref(), Some("warm"));
    }
}
