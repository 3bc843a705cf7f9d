//! Garbage collection through the service: a report of what `gc` would free (GET), and the
//! collection itself (POST), which reconciles first (see `branchbox_core::gc`).

use crate::error::{ApiResult, ErrorBody};
use crate::middleware::AuditNote;
use crate::state::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use branchbox_core::gc::{self, GcReport};
use serde::Serialize;
use utoipa::ToSchema;

/// What gc found, and freed unless it was a report only.
#[derive(Debug, Serialize, ToSchema)]
pub struct GcResult {
    /// Only a report: nothing was changed.
    pub dry_run: bool,
    /// Bytes freed (or that would be freed).
    pub freed_bytes: u64,
    /// Snapshots past their TTL.
    pub expired_snapshots: Vec<String>,
    /// Expired snapshots kept because others descend from them.
    pub kept_with_descendants: Vec<String>,
    /// Unnamed fork points that no sandbox, ref or live snapshot reaches.
    pub unreachable_fork_points: Vec<String>,
    /// Snapshot directories without a complete record (interrupted snapshots).
    pub orphan_snapshot_dirs: Vec<String>,
    /// Sandboxes whose runtime was gone.
    pub lost_sandboxes: Vec<String>,
    /// Sandbox directories without a record.
    pub orphan_sandbox_dirs: Vec<String>,
    /// Images nothing uses (only for an image cache of this data directory's own).
    pub unused_images: Vec<String>,
    /// Cached Linux root disks made from images nothing uses (same rule as images).
    pub unused_disks: Vec<String>,
    /// Sandbox networks on this host whose sandbox directory is gone (any data directory).
    pub orphan_networks: Vec<String>,
    /// Unrecorded complete children of an interrupted fork, now recorded (reconciliation).
    pub adopted: Vec<String>,
    /// Unrecorded sandboxes whose processes were stopped (reconciliation).
    pub reaped: Vec<String>,
}

fn strings<T: ToString>(v: &[T]) -> Vec<String> {
    v.iter().map(ToString::to_string).collect()
}

impl From<&GcReport> for GcResult {
    fn from(r: &GcReport) -> GcResult {
        let (adopted, reaped) = match &r.reconciled {
            Some(rec) => (strings(&rec.adopted), rec.reaped.clone()),
            None => (Vec::new(), Vec::new()),
        };
        GcResult {
            dry_run: r.dry_run,
            freed_bytes: r.freed_bytes,
            expired_snapshots: strings(&r.expired_snapshots),
            kept_with_descendants: strings(&r.kept_with_descendants),
            unreachable_fork_points: strings(&r.unreachable_fork_points),
            orphan_snapshot_dirs: r.orphan_snapshot_dirs.clone(),
            lost_sandboxes: strings(&r.lost_sandboxes),
            orphan_sandbox_dirs: r.orphan_sandbox_dirs.clone(),
            unused_images: r.unused_images.clone(),
            unused_disks: r.unused_disks.clone(),
            orphan_networks: r.orphan_networks.clone(),
            adopted,
            reaped,
        }
    }
}

async fn collect(st: AppState, dry_run: bool) -> ApiResult<GcResult> {
    st.blocking(move |engine, st| {
        let r = gc::collect(engine, dry_run)?;
        for id in &r.lost_sandboxes {
            if !dry_run {
                st.forget(id);
            }
        }
        Ok(GcResult::from(&r))
    })
    .await
}

/// What gc would free now; changes nothing.
#[utoipa::path(get, path = "/v1/gc", tag = "service",
    responses((status = 200, body = GcResult), (status = "4XX", body = ErrorBody, description = "unauthorized")))]
pub async fn report(State(st): State<AppState>) -> ApiResult<Json<GcResult>> {
    Ok(Json(collect(st, true).await?))
}

/// Reconciles sandboxes with their records, then frees what nothing can reach: expired
/// snapshots, unreachable fork points, interrupted snapshots, lost sandboxes, unused images.
/// Waits for operations in progress and holds off new ones while it runs.
#[utoipa::path(post, path = "/v1/gc", tag = "service",
    responses((status = 200, body = GcResult), (status = "4XX", body = ErrorBody, description = "unauthorized")))]
pub async fn run(
    State(st): State<AppState>,
) -> ApiResult<(StatusCode, Extension<AuditNote>, Json<GcResult>)> {
    let r = collect(st, false).await?;
    let note = AuditNote {
        detail: Some(format!(
            "freed {} bytes; {} fork point(s), {} expired, {} lost, {} adopted, {} reaped",
            r.freed_bytes,
            r.unreachable_fork_points.len(),
            r.expired_snapshots.len(),
            r.lost_sandboxes.len(),
            r.adopted.len(),
            r.reaped.len()
        )),
        ..Default::default()
    };
    Ok((StatusCode::OK, Extension(note), Json(r)))
}
