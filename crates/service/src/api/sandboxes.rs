//! Sandboxes over HTTP: create (from an image, a template or a snapshot), list, get, kill,
//! pause, connect, timeout, step history, fork. The handlers parse the request and answer;
//! what they do is `crate::ops::sandboxes`'s.

use crate::auth::Caller;
use crate::error::{ApiResult, ErrorBody};
use crate::extract::{sandbox_id, ApiJson, ApiQuery};
use crate::middleware::AuditNote;
use crate::ops::sandboxes as ops;
use crate::ops::types::*;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};

type Noted<T> = ApiResult<(StatusCode, Extension<AuditNote>, Json<T>)>;

/// The answer of a call that changed something, with what the audit log is told.
fn noted<T>(status: StatusCode, (out, n): (T, AuditNote)) -> (StatusCode, Extension<AuditNote>, Json<T>) {
    (status, Extension(n), Json(out))
}

/// Creates a sandbox from the default template, or from a snapshot.
#[utoipa::path(post, path = "/v1/sandboxes", tag = "sandboxes", request_body = CreateSandbox,
    responses((status = 201, body = SandboxInfo, description = "created and running"),
              (status = "4XX", body = ErrorBody, description = "bad request, unknown snapshot, conflict"),
              (status = 503, body = ErrorBody, description = "at capacity or backend unavailable")))]
pub async fn create(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiJson(req): ApiJson<CreateSandbox>,
) -> Noted<SandboxInfo> {
    Ok(noted(StatusCode::CREATED, ops::create(&st, caller, req).await?))
}

/// Lists sandboxes, optionally only those with given metadata or state.
#[utoipa::path(get, path = "/v1/sandboxes", tag = "sandboxes",
    params(ListSandboxes, ("local" = Option<bool>, Query,
        description = "With fleet peers: only this node's sandboxes (else every node's; `crate::fleet::listing` reads it)")),
    responses((status = 200, body = Vec<SandboxInfo>, headers(("x-branchbox-peers-unanswered" = String,
                  description = "With fleet peers: the peers whose sandboxes the listing lacks, `NAME (REASON), ...`"))),
              (status = "4XX", body = ErrorBody, description = "bad query")))]
pub async fn list(
    State(st): State<AppState>,
    ApiQuery(q): ApiQuery<ListSandboxes>,
) -> ApiResult<Json<Vec<SandboxInfo>>> {
    Ok(Json(ops::list(&st, q).await?))
}

/// One sandbox.
#[utoipa::path(get, path = "/v1/sandboxes/{id}", tag = "sandboxes", params(("id" = String, Path, description = "sandbox id")),
    responses((status = 200, body = SandboxInfo), (status = "4XX", body = ErrorBody, description = "bad id or not found")))]
pub async fn get(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<SandboxInfo>> {
    Ok(Json(ops::get(&st, sandbox_id(&id)?).await?))
}

/// Destroys a sandbox and everything it had.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}", tag = "sandboxes", params(("id" = String, Path, description = "sandbox id")),
    responses((status = 204, description = "destroyed"), (status = "4XX", body = ErrorBody, description = "bad id or not found")))]
pub async fn kill(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult<StatusCode> {
    ops::kill(&st, sandbox_id(&id)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Pauses a running sandbox; its timeout stops until `connect` resumes it.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/pause", tag = "sandboxes", params(("id" = String, Path, description = "sandbox id")),
    responses((status = 200, body = SandboxInfo), (status = "4XX", body = ErrorBody, description = "not found, or not running (409)")))]
pub async fn pause(State(st): State<AppState>, Path(id): Path<String>) -> Noted<SandboxInfo> {
    Ok(noted(StatusCode::OK, ops::pause(&st, sandbox_id(&id)?).await?))
}

/// Connects to a sandbox: resumes it when paused and restarts its timeout.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/connect", tag = "sandboxes", params(("id" = String, Path, description = "sandbox id")),
    request_body = ConnectSandbox,
    responses((status = 200, body = SandboxInfo), (status = "4XX", body = ErrorBody, description = "not found, or lost (409)")))]
pub async fn connect(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<ConnectSandbox>,
) -> Noted<SandboxInfo> {
    Ok(noted(StatusCode::OK, ops::connect(&st, sandbox_id(&id)?, req).await?))
}

/// Sets a sandbox's timeout, counted from now; 0 ends it now (its timeout action runs within a
/// second).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/timeout", tag = "sandboxes", params(("id" = String, Path, description = "sandbox id")),
    request_body = SetTimeout,
    responses((status = 200, body = SandboxInfo), (status = "4XX", body = ErrorBody, description = "bad timeout or not found")))]
pub async fn set_timeout(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<SetTimeout>,
) -> Noted<SandboxInfo> {
    Ok(noted(StatusCode::OK, ops::set_timeout(&st, sandbox_id(&id)?, req).await?))
}

/// Turns step-history mode on or off: with it on, every command ends with a checkpoint, so
/// each command's outcome is a branch point.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/history", tag = "sandboxes", params(("id" = String, Path, description = "sandbox id")),
    request_body = SetHistory,
    responses((status = 200, body = SandboxInfo), (status = "4XX", body = ErrorBody, description = "not found")))]
pub async fn set_history(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<SetHistory>,
) -> Noted<SandboxInfo> {
    Ok(noted(StatusCode::OK, ops::set_history(&st, sandbox_id(&id)?, req).await?))
}

/// Forks a running sandbox into `count` children continuing from its current state; the
/// source keeps running. Each child succeeds or fails on its own.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/fork", tag = "sandboxes", params(("id" = String, Path, description = "sandbox id")),
    request_body = ForkSandbox,
    responses((status = 200, body = ForkResult, description = "the fork point and one result per child"),
              (status = "4XX", body = ErrorBody, description = "bad count, not found, not running (409)"),
              (status = 503, body = ErrorBody, description = "at capacity")))]
pub async fn fork(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<ForkSandbox>,
) -> Noted<ForkResult> {
    Ok(noted(StatusCode::OK, ops::fork(&st, caller, sandbox_id(&id)?, req).await?))
}
