//! Snapshots and checkpoints: take, list, get, delete; roll a sandbox back to a checkpoint.

use crate::error::{ApiResult, ErrorBody};
use crate::extract::{sandbox_id, snapshot_ref, ApiJson, ApiQuery};
use crate::middleware::AuditNote;
use crate::ops::sandboxes::info;
use crate::ops::snapshots as ops;
use crate::ops::types::*;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use branchbox_model::SnapshotKind;

type Noted<T> = ApiResult<(StatusCode, Extension<AuditNote>, Json<T>)>;

/// Captures a running sandbox's full state (processes, memory, files); it keeps running.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/snapshots", tag = "snapshots",
    params(("id" = String, Path, description = "sandbox id")), request_body = TakeSnapshot,
    responses((status = 201, body = SnapshotInfo), (status = "4XX", body = ErrorBody, description = "bad name, not found, not running or name taken (409)")))]
pub async fn take(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<TakeSnapshot>,
) -> Noted<SnapshotInfo> {
    capture(st, &id, SnapshotKind::Snapshot, req.name).await
}

/// Takes a checkpoint of a running sandbox, for a later in-place rollback.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/checkpoints", tag = "snapshots",
    params(("id" = String, Path, description = "sandbox id")), request_body = TakeSnapshot,
    responses((status = 201, body = SnapshotInfo), (status = "4XX", body = ErrorBody, description = "bad name, not found, not running (409)")))]
pub async fn checkpoint(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<TakeSnapshot>,
) -> Noted<SnapshotInfo> {
    capture(st, &id, SnapshotKind::Checkpoint, req.name).await
}

/// Takes a snapshot of `kind` and answers it with its note for the audit log.
async fn capture(st: AppState, id: &str, kind: SnapshotKind, name: Option<String>) -> Noted<SnapshotInfo> {
    let (snap, n) = ops::capture(&st, sandbox_id(id)?, kind, name).await?;
    Ok((StatusCode::CREATED, Extension(n), Json(snap)))
}

/// The checkpoints taken of a sandbox, oldest first.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/checkpoints", tag = "snapshots",
    params(("id" = String, Path, description = "sandbox id")),
    responses((status = 200, body = Vec<SnapshotInfo>), (status = "4XX", body = ErrorBody, description = "bad id or not found")))]
pub async fn checkpoints(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Vec<SnapshotInfo>>> {
    let id = sandbox_id(&id)?;
    let out = st
        .blocking(move |engine, _| {
            engine.sandbox(&id)?;
            Ok(engine
                .snapshots()?
                .iter()
                .filter(|s| {
                    s.kind == SnapshotKind::Checkpoint
                        && s.source.as_ref() == Some(&id)
                        && s.deleted_ms.is_none()
                })
                .map(SnapshotInfo::from)
                .collect())
        })
        .await?;
    Ok(Json(out))
}

/// Returns a sandbox, in place and under the same id, to a checkpoint (or snapshot) taken of it.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/rollback", tag = "snapshots",
    params(("id" = String, Path, description = "sandbox id")), request_body = Rollback,
    responses((status = 200, body = SandboxInfo, description = "the sandbox after the rollback"),
              (status = "4XX", body = ErrorBody, description = "not found, or a snapshot of another sandbox (409)")))]
pub async fn rollback(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<Rollback>,
) -> Noted<SandboxInfo> {
    let id = sandbox_id(&id)?;
    let target = snapshot_ref(&req.checkpoint)?;
    let (out, snap) = st
        .blocking(move |engine, st| {
            let snap = st.exclusive(&id, || Ok(engine.rollback(&id, &target)?))?;
            Ok((info(engine, st, &id)?, snap.id.to_string()))
        })
        .await?;
    let n = AuditNote { sandbox: Some(out.id.clone()), snapshot: Some(snap), ..Default::default() };
    Ok((StatusCode::OK, Extension(n), Json(out)))
}

/// Every snapshot, oldest first.
#[utoipa::path(get, path = "/v1/snapshots", tag = "snapshots",
    responses((status = 200, body = Vec<SnapshotInfo>), (status = "4XX", body = ErrorBody, description = "unauthorized")))]
pub async fn list(State(st): State<AppState>) -> ApiResult<Json<Vec<SnapshotInfo>>> {
    Ok(Json(ops::list(&st).await?))
}

/// One snapshot, by id or name.
#[utoipa::path(get, path = "/v1/snapshots/{snapshot}", tag = "snapshots",
    params(("snapshot" = String, Path, description = "snapshot id or name")),
    responses((status = 200, body = SnapshotInfo), (status = "4XX", body = ErrorBody, description = "bad reference or not found")))]
pub async fn get(State(st): State<AppState>, Path(snapshot): Path<String>) -> ApiResult<Json<SnapshotInfo>> {
    let r = snapshot_ref(&snapshot)?;
    Ok(Json(st.blocking(move |engine, _| Ok(SnapshotInfo::from(&engine.find_snapshot(&r)?))).await?))
}

/// Deletes a snapshot's data; sandboxes started from it keep running.
#[utoipa::path(delete, path = "/v1/snapshots/{snapshot}", tag = "snapshots",
    params(("snapshot" = String, Path, description = "snapshot id or name"), DeleteSnapshot),
    responses((status = 204, description = "deleted"), (status = "4XX", body = ErrorBody, description = "not found, or has descendants (409)")))]
pub async fn delete(
    State(st): State<AppState>,
    Path(snapshot): Path<String>,
    ApiQuery(q): ApiQuery<DeleteSnapshot>,
) -> ApiResult<(StatusCode, Extension<AuditNote>)> {
    let n = ops::delete(&st, snapshot_ref(&snapshot)?, q.cascade.unwrap_or(false)).await?;
    Ok((StatusCode::NO_CONTENT, Extension(n)))
}
