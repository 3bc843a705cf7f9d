//! Snapshots: take one of a sandbox (or a checkpoint), list them, delete one. The native API
//! and E2B's control plane both call these.

use super::types::SnapshotInfo;
use crate::error::ApiResult;
use crate::middleware::AuditNote;
use crate::state::AppState;
use branchbox_core::SnapshotOptions;
use branchbox_model::{SandboxId, SnapshotKind};

fn noted(sandbox: &str, snap: &SnapshotInfo) -> AuditNote {
    AuditNote {
        sandbox: Some(sandbox.to_string()),
        snapshot: Some(snap.id.clone()),
        parent: snap.parent.clone(),
        ..Default::default()
    }
}

/// Takes a snapshot of `kind` (named `name`) of a running sandbox under its lock; it keeps
/// running.
pub async fn capture(
    st: &AppState,
    id: SandboxId,
    kind: SnapshotKind,
    name: Option<String>,
) -> ApiResult<(SnapshotInfo, AuditNote)> {
    let src = id.clone();
    let snap = st
        .blocking(move |engine, st| {
            let opts = SnapshotOptions { kind, name: name.as_deref(), ttl: None };
            st.exclusive(&id, || Ok(SnapshotInfo::from(&engine.snapshot(&id, &opts)?)))
        })
        .await?;
    let n = noted(src.as_str(), &snap);
    Ok((snap, n))
}

/// Every snapshot, oldest first.
pub async fn list(st: &AppState) -> ApiResult<Vec<SnapshotInfo>> {
    st.blocking(|engine, _| Ok(engine.snapshots()?.iter().map(SnapshotInfo::from).collect())).await
}

/// Deletes a snapshot's data (with its descendants when `cascade`); sandboxes started from it
/// keep running. `snapshot` is an id or a name, already checked.
pub async fn delete(st: &AppState, snapshot: String, cascade: bool) -> ApiResult<AuditNote> {
    let deleted = st.blocking(move |engine, _| Ok(engine.delete_snapshot(&snapshot, cascade)?)).await?;
    let ids: Vec<String> = deleted.iter().map(ToString::to_string).collect();
    Ok(AuditNote { detail: Some(format!("deleted: {}", ids.join(","))), ..Default::default() })
}
