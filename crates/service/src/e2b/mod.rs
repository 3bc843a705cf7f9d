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
//!
//! `routes.rs` assembles both planes with the adapter's own state ([`E2bState`]: terminals,
//! polling watchers, uploads); `rest.rs` is the control plane; `envd.rs` the data plane's
//! authentication and what its calls share, which are in `follow.rs` (processes),
//! `terminals.rs`, `files.rs`, `watch.rs` and `uploads.rs`; `templates.rs` serves E2B's template
//! builder on branchbox's template engine (with `template_build.rs` and `template_files.rs`).
//! Every file here may use this one; this one uses none of them. Operations are `crate::ops`'s,
//! never the native API's handlers.

pub mod envd;
pub mod files;
pub mod follow;
pub mod metrics;
pub mod network;
pub mod rest;
mod routes;
mod template_build;
mod template_files;
mod template_logs;
mod templates;
pub mod terminals;
pub mod uploads;
pub mod watch;

pub use branchbox_e2b_wire::{connect, pb};
pub use routes::{router, E2bState};

use crate::error::ApiError;
use axum::http::HeaderMap;

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

/// A request header's value, trimmed; `None` when absent, empty or not text.
fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty())
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
    use axum::http::StatusCode;

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
