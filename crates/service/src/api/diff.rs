//! The files that differ between two snapshots, as `branchbox diff` lists them.

use super::extract::{snapshot_ref, ApiQuery};
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// Query of a diff.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DiffQuery {
    /// The older side (id or name); by default the snapshot's parent.
    pub against: Option<String>,
}

/// Paths that differ. Only listings are compared (type, size, mode, modification time): file
/// contents are not read, so no text diff is given.
#[derive(Debug, Serialize, ToSchema)]
pub struct DiffInfo {
    /// The older side.
    pub from: String,
    /// The newer side (the snapshot asked about).
    pub to: String,
    /// Paths only in `to`.
    pub added: Vec<String>,
    /// Paths in both whose type, size, mode or modification time differ.
    pub changed: Vec<String>,
    /// Paths only in `from`.
    pub removed: Vec<String>,
}

/// Lists the files added, changed and removed from `against` (or the snapshot's parent) to a
/// snapshot. The first diff of a gVisor snapshot starts it once, headless, to list its files.
#[utoipa::path(get, path = "/v1/snapshots/{snapshot}/diff", tag = "snapshots",
    params(("snapshot" = String, Path, description = "snapshot id or name"), DiffQuery),
    responses((status = 200, body = DiffInfo),
              (status = "4XX", body = ErrorBody, description = "bad reference, not found, deleted or no parent (409)")))]
pub async fn diff(
    State(st): State<AppState>,
    Path(snapshot): Path<String>,
    ApiQuery(q): ApiQuery<DiffQuery>,
) -> ApiResult<Json<DiffInfo>> {
    let to = snapshot_ref(&snapshot)?;
    let against = q.against.as_deref().map(snapshot_ref).transpose()?;
    let out = st
        .blocking(move |engine, _| {
            let from = match against {
                Some(a) => a,
                None => engine.find_snapshot(&to)?.parent.map(|p| p.to_string()).ok_or_else(|| {
                    ApiError::new(
                        StatusCode::CONFLICT,
                        "no_parent",
                        format!("snapshot {to} has no parent to compare with; pass ?against=ID (GET /v1/snapshots lists them)"),
                    )
                })?,
            };
            let d = branchbox_core::diff::diff(engine, &from, &to)?;
            Ok(DiffInfo {
                from: d.from.to_string(),
                to: d.to.to_string(),
                added: d.added,
                changed: d.changed,
                removed: d.removed,
            })
        })
        .await?;
    Ok(Json(out))
}
