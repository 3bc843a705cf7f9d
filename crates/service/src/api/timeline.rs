//! A sandbox's timeline: the snapshots taken of it in time order, each checkpoint of
//! step-history mode with the command it followed.

use crate::error::{ApiResult, ErrorBody};
use crate::extract::sandbox_id;
use crate::ops::types::SnapshotInfo;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

/// The command a step-history checkpoint followed.
#[derive(Debug, Serialize, ToSchema)]
pub struct StepInfo {
    /// The shell line, or the argv joined with spaces (words quoted where needed); at most
    /// 1024 bytes, a longer one cut and ending with `…`.
    pub command: String,
    /// Its exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// How long it ran, ms.
    pub duration_ms: u64,
    /// When it ended, ms since the epoch.
    pub ended_ms: i64,
}

/// One point of the timeline.
#[derive(Debug, Serialize, ToSchema)]
pub struct TimelineEntry {
    /// A snapshot taken of the sandbox: a checkpoint, snapshot or fork point (a deleted one
    /// says `deleted`).
    pub snapshot: SnapshotInfo,
    /// The command it followed, when step-history mode took it; `null` otherwise.
    pub step: Option<StepInfo>,
}

/// A sandbox's timeline.
#[derive(Debug, Serialize, ToSchema)]
pub struct Timeline {
    /// The sandbox.
    pub sandbox: String,
    /// Step-history mode is on: each command ends with a checkpoint here.
    pub history: bool,
    /// The snapshot its current state descends from (after a rollback, the one rolled back to).
    pub current: Option<String>,
    /// Oldest first.
    pub entries: Vec<TimelineEntry>,
}

/// The snapshots taken of a sandbox, oldest first; each checkpoint that step-history mode took
/// carries its step (the command, its exit code, when it ended). Turn the mode on with
/// `POST /v1/sandboxes/{id}/history`; roll back to an entry with `POST .../rollback`.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/timeline", tag = "sandboxes",
    params(("id" = String, Path, description = "sandbox id")),
    responses((status = 200, body = Timeline), (status = "4XX", body = ErrorBody, description = "bad id, not found")))]
pub async fn timeline(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<Timeline>> {
    let id = sandbox_id(&id)?;
    let out = st
        .blocking(move |engine, _| {
            let sandbox = engine.sandbox(&id)?;
            let entries = engine
                .timeline(&id)?
                .into_iter()
                .map(|e| TimelineEntry {
                    snapshot: (&e.snapshot).into(),
                    step: e.step.map(|s| StepInfo {
                        command: s.command,
                        exit_code: s.exit_code,
                        signal: s.signal,
                        duration_ms: s.duration_ms,
                        ended_ms: s.ended_ms,
                    }),
                })
                .collect();
            Ok(Timeline {
                sandbox: id.to_string(),
                history: sandbox.history,
                current: sandbox.parent_snapshot.map(|p| p.to_string()),
                entries,
            })
        })
        .await?;
    Ok(Json(out))
}
