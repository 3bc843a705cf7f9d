//! Wire compatibility with E2B's own SDKs (`e2b` on PyPI and npm), which talk to any server
//! that answers E2B's REST API (the control plane, `E2B_API_URL`) and the in-sandbox daemon's
//! API (envd: Connect-RPC `process` and `filesystem` services and HTTP `/files`, the data
//! plane, `E2B_SANDBOX_URL`). branchboxd serves the subset the SDKs' sandbox, command and file
//! calls use, under `/e2b` (control plane) and `/e2b/envd` (data plane), on its own listener:
//!
//! ```text
//! E2B_API_URL=http://127.0.0.1:7420/e2b  E2B_SANDBOX_URL=http://127.0.0.1:7420/e2b/envd  E2B_API_KEY=<token>
//! ```
//!
//! The control plane takes the service token as E2B's API key (`X-API-Key`). The data plane
//! names its sandbox in `E2b-Sandbox-Id` and authenticates with the sandbox's access token
//! (`X-Access-Token`, E2B's `envdAccessToken`, derived from the key that created or connected
//! it: see [`crate::auth::Tokens::sandbox_token`]) or the API key itself. `docs/e2b.md`
//! lists what is served and what is not.

pub mod envd;
pub mod files;
pub mod follow;
pub mod rest;
pub mod uploads;
pub mod watch;

pub use branchbox_e2b_wire::{connect, pb};

use crate::api::AuditNote;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;

/// The envd version branchboxd reports. The SDKs gate features on it: 0.4.0 and later let the
/// server pick the default user (`user`); 0.5.2 and later may close a command's stdin
/// (`CloseStdin`, served); below 0.5.7 they upload files as `multipart/form-data`, which is
/// what is served, and below 0.6.3 they ask for no entry info in watch events.
pub const ENVD_VERSION: &str = "0.5.2";

/// The path prefix of the control plane.
pub const PREFIX: &str = "/e2b";

/// Requests under this prefix are exempt from the guard's JSON-only rule on POST bodies.
pub const GUARDED_ELSEWHERE: &str = "/e2b/";

/// The key a control-plane request presented (to derive sandbox access tokens from).
#[derive(Debug, Clone)]
pub struct PresentedKey(pub Option<String>);

pub use crate::error::E2bError;

fn unauthorized(why: &str) -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        format!("{why}; send the token from <data>/service/token as E2B_API_KEY (the X-API-Key header)"),
    )
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty())
}

/// Control-plane authentication: `X-API-Key: <token>` (or `Authorization: Bearer <token>`).
async fn api_key(State(st): State<AppState>, mut req: Request, next: Next) -> Response {
    let key = header(req.headers(), "x-api-key").map(str::to_string);
    let caller = match (&st.tokens, &key) {
        (None, _) => Caller("anonymous".into()),
        (Some(t), Some(k)) => match (k.len() <= 512).then(|| t.check(k)).flatten() {
            Some(c) => c,
            None => return E2bError(unauthorized("the API key is not valid")).into_response(),
        },
        (Some(t), None) => match t.authenticate(req.headers()) {
            Ok(c) => c,
            Err(_) => return E2bError(unauthorized("no API key")).into_response(),
        },
    };
    let presented = key.or_else(|| {
        header(req.headers(), "authorization")
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(|t| t.trim().to_string())
    });
    req.extensions_mut().insert(caller);
    req.extensions_mut().insert(PresentedKey(st.tokens.as_ref().and(presented)));
    next.run(req).await
}

/// The routes under [`PREFIX`], with their authentication and the audit log. As on `/v1`, the
/// audit layer runs inside authentication, so each record names the caller's token.
pub fn router(st: AppState) -> Router<AppState> {
    let audit = from_fn_with_state(st.clone(), crate::api::audit);
    let control = rest::router()
        .layer(axum::middleware::from_fn(note_sandbox))
        .layer(audit.clone())
        .layer(from_fn_with_state(st.clone(), api_key));
    let data = envd::router()
        .layer(axum::middleware::from_fn(note_sandbox))
        .layer(audit)
        .layer(from_fn_with_state(st, envd::authenticate));
    Router::new().nest(PREFIX, control.merge(Router::new().nest("/envd", data)))
}

/// Names the sandbox a request acted on for its audit record, where its handler did not: the
/// data plane's `E2b-Sandbox-Id`, or the control plane's `/sandboxes/{id}` (the path as seen
/// here, under the prefix).
async fn note_sandbox(req: Request, next: Next) -> Response {
    let named = match req.extensions().get::<envd::Target>() {
        Some(t) => Some(t.sandbox.to_string()),
        None => {
            let p = req.uri().path();
            let rest = p.strip_prefix("/v2/sandboxes/").or_else(|| p.strip_prefix("/sandboxes/"));
            rest.and_then(|r| r.split('/').next())
                .filter(|id| branchbox_model::SandboxId::parse(id).is_ok())
                .map(str::to_string)
        }
    };
    let mut r = next.run(req).await;
    if let Some(id) = named {
        let mut note = r.extensions().get::<AuditNote>().cloned().unwrap_or_default();
        note.sandbox.get_or_insert(id);
        r.extensions_mut().insert(note);
    }
    r
}

/// A service error as a Connect error: the code the protocol has for its status.
impl From<ApiError> for connect::RpcError {
    fn from(e: ApiError) -> connect::RpcError {
        let code = match (e.status.as_u16(), e.code) {
            (_, "already_exists") => "already_exists",
            (_, "timeout") => "deadline_exceeded",
            (400 | 422, _) => "invalid_argument",
            (401, _) => "unauthenticated",
            (403, _) => "permission_denied",
            (404, _) => "not_found",
            (409, _) => "failed_precondition",
            (413, _) => "resource_exhausted",
            (502 | 503, _) => "unavailable",
            (504, _) => "deadline_exceeded",
            _ => "internal",
        };
        connect::RpcError::new(code, e.message)
    }
}

#[cfg(test)]
mod wire_tests {
    use super::*;

    #[test]
    fn service_errors_map_to_connect_codes_and_statuses() {
        let cases = [
            (ApiError::invalid("x"), "invalid_argument", 400),
            (ApiError::not_found("x"), "not_found", 404),
            (ApiError::new(StatusCode::CONFLICT, "already_exists", "x"), "already_exists", 409),
            (ApiError::new(StatusCode::CONFLICT, "conflict", "paused"), "failed_precondition", 400),
            (ApiError::new(StatusCode::BAD_GATEWAY, "agent_unavailable", "x"), "unavailable", 503),
            (ApiError::too_large("x"), "resource_exhausted", 429),
            (ApiError::internal("x"), "internal", 500),
        ];
        for (api, code, status) in cases {
            let r = connect::RpcError::from(api);
            assert_eq!((r.code, r.http_status()), (code, status));
        }
    }
}
