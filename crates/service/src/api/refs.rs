//! Refs: movable names for snapshots (`branchbox ref`), listed, pointed and removed.

use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{snapshot_ref, ApiJson};
use crate::middleware::AuditNote;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A ref and the snapshot it names.
#[derive(Debug, Serialize, ToSchema)]
pub struct RefInfo {
    /// The ref's name.
    pub name: String,
    /// The snapshot it points at.
    pub snapshot: String,
}

/// Where to point a ref.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PointRef {
    /// A snapshot's id or name.
    pub snapshot: String,
}

/// Every ref, by name.
#[utoipa::path(get, path = "/v1/refs", tag = "refs",
    responses((status = 200, body = Vec<RefInfo>), (status = "4XX", body = ErrorBody, description = "not signed in")))]
pub async fn list(State(st): State<AppState>) -> ApiResult<Json<Vec<RefInfo>>> {
    let refs = st.blocking(|engine, _| Ok(engine.refs()?)).await?;
    Ok(Json(refs.into_iter().map(|(name, snapshot)| RefInfo { name, snapshot }).collect()))
}

/// Points a ref at a snapshot, making it or moving it.
#[utoipa::path(put, path = "/v1/refs/{name}", tag = "refs",
    params(("name" = String, Path, description = "ref name")), request_body = PointRef,
    responses((status = 200, body = RefInfo),
              (status = "4XX", body = ErrorBody, description = "bad name (422), no such snapshot (404), deleted snapshot (409)")))]
pub async fn point(
    State(st): State<AppState>,
    Path(name): Path<String>,
    ApiJson(req): ApiJson<PointRef>,
) -> ApiResult<(Extension<AuditNote>, Json<RefInfo>)> {
    let target = snapshot_ref(&req.snapshot)?;
    let ref_name = name.clone();
    let snap = st.blocking(move |engine, _| Ok(engine.set_ref(&ref_name, &target)?)).await?;
    let note = AuditNote {
        snapshot: Some(snap.id.to_string()),
        detail: Some(format!("ref {name}")),
        ..Default::default()
    };
    Ok((Extension(note), Json(RefInfo { name, snapshot: snap.id.to_string() })))
}

/// Removes a ref (the snapshot stays).
#[utoipa::path(delete, path = "/v1/refs/{name}", tag = "refs",
    params(("name" = String, Path, description = "ref name")),
    responses((status = 204, description = "removed"), (status = "4XX", body = ErrorBody, description = "no such ref (404)")))]
pub async fn remove(State(st): State<AppState>, Path(name): Path<String>) -> ApiResult<StatusCode> {
    if name.is_empty() || name.len() > 255 || name.contains('\0') {
        return Err(ApiError::bad_request("invalid_id", "a ref name is 1 to 255 bytes without NUL"));
    }
    st.blocking(move |engine, _| Ok(engine.delete_ref(&name)?)).await?;
    Ok(StatusCode::NO_CONTENT)
}
