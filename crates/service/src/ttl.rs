//! Sandbox timeouts, enforced by a background task, and reconciliation, run at start and then
//! every [`RECONCILE_EVERY`]: the engine matches runtime to its records (adopting complete
//! children of a fork a crash interrupted, reaping the rest, marking lost what is gone), and
//! the service matches its own records to the engine's, so a restart loses nothing and leaves
//! nothing running unseen.

use crate::db::{AuditEntry, OnTimeout, SandboxMeta};
use crate::error::{engine_status, ApiResult};
use crate::state::AppState;
use branchbox_core::engine::ReconcileReport;
use branchbox_core::Engine;
use branchbox_model::{now_ms, Error, SandboxId, SandboxState};
use std::collections::BTreeSet;

/// How long a failed timeout action waits before it is tried again, ms.
const RETRY_MS: i64 = 30_000;
/// How often the engine's runtime is reconciled with its records while the service runs.
pub const RECONCILE_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

fn record(
    st: &AppState,
    action: &str,
    status: u16,
    code: Option<&str>,
    sandbox: Option<&str>,
    detail: Option<String>,
) {
    let e = AuditEntry {
        seq: 0,
        at_ms: 0,
        who: "service".into(),
        action: action.into(),
        status,
        code: code.map(Into::into),
        sandbox: sandbox.map(Into::into),
        snapshot: None,
        parent: None,
        detail,
    };
    if let Err(err) = st.db().audit(now_ms(), &e) {
        tracing::error!("could not write an audit record: {err}");
    }
}

/// Acts on every sandbox whose timeout fired by `now`; returns what was done, per sandbox.
pub fn tick(engine: &Engine, st: &AppState, now: i64) -> ApiResult<Vec<(String, &'static str)>> {
    let due = st.db().due(now)?;
    let mut done = Vec::new();
    for (id, action) in due {
        let Ok(sid) = SandboxId::parse(&id) else {
            st.db().remove(&id)?;
            continue;
        };
        let r = st
            .exclusive(&sid, || {
                Ok(match action {
                    OnTimeout::Kill => engine.kill(&sid),
                    OnTimeout::Pause => engine.pause(&sid),
                })
            })
            .unwrap_or_else(|e| Err(Error::Backend(e.message)));
        if r.is_ok() && action == OnTimeout::Kill {
            st.forget(&sid);
        }
        let outcome = match (&r, action) {
            (Ok(()), OnTimeout::Kill) | (Err(Error::NotFound { .. }), _) => {
                st.db().remove(&id)?;
                if r.is_ok() {
                    "kill"
                } else {
                    "gone"
                }
            }
            (Ok(()), OnTimeout::Pause) => {
                st.db().set_expiry(&sid, None, None)?;
                "pause"
            }
            // Already paused, or its runtime is gone: nothing left to stop.
            (Err(Error::Conflict(_)), _) => {
                st.db().set_expiry(&sid, None, None)?;
                "skipped"
            }
            (Err(e), _) => {
                tracing::warn!(
                    "timeout of {id} could not be applied ({e}); retrying in {} s",
                    RETRY_MS / 1000
                );
                st.db().set_expiry(&sid, Some(now + RETRY_MS), None)?;
                "failed"
            }
        };
        let (status, code) = match &r {
            Ok(()) => (200, None),
            Err(e) => (engine_status(e).as_u16(), Some(e.code())),
        };
        record(
            st,
            &format!("ttl.{}", if action == OnTimeout::Kill { "kill" } else { "pause" }),
            status,
            code,
            Some(&id),
            None,
        );
        st.metrics.ttl(outcome);
        done.push((id, outcome));
    }
    Ok(done)
}

/// Runs [`tick`] forever, and [`recover`] every [`RECONCILE_EVERY`].
pub async fn run(st: AppState) {
    let mut last = std::time::Instant::now();
    loop {
        tokio::time::sleep(st.cfg.ttl_tick).await;
        if let Err(e) = st.blocking(|engine, st| tick(engine, st, now_ms())).await {
            tracing::warn!("timeout check failed: {e}");
        }
        if last.elapsed() >= RECONCILE_EVERY {
            last = std::time::Instant::now();
            if let Err(e) = st.blocking(recover).await {
                tracing::warn!("reconciliation failed: {e}");
            }
        }
    }
}

/// Has the engine reconcile (skipped while another operation holds the data directory), audits
/// what it did, and gives adopted children the service record a fork would have given them:
/// their source's metadata and timeout.
pub fn recover(engine: &Engine, st: &AppState) -> ApiResult<ReconcileReport> {
    let r = engine.reconcile()?;
    if r.is_empty() {
        return Ok(r);
    }
    let default_ms = (st.cfg.default_timeout_s * 1000) as i64;
    for id in &r.adopted {
        let source = engine
            .sandbox(id)?
            .parent_snapshot
            .and_then(|p| engine.find_snapshot(p.as_str()).ok())
            .and_then(|s| s.source);
        let parent = match source {
            Some(src) => st.db().get(&src)?,
            None => None,
        }
        .unwrap_or_else(|| SandboxMeta { timeout_ms: default_ms, ..Default::default() });
        let meta = SandboxMeta {
            expires_ms: Some(now_ms() + parent.timeout_ms),
            created_by: "reconcile".into(),
            ..parent
        };
        st.db().put(id, &meta)?;
    }
    tracing::warn!("recovered from an interrupted operation: {}", r.summary());
    let detail = serde_json::to_string(&r).unwrap_or_else(|_| r.summary());
    record(st, "service.reconcile", 200, None, None, Some(detail));
    Ok(r)
}

/// Matches the service's records to the engine's at start: records of sandboxes the engine no
/// longer has are dropped, and sandboxes whose runtime is gone are reported (and audited) as lost.
/// Returns (sandboxes alive, lost, records dropped).
pub fn reconcile(engine: &Engine, st: &AppState) -> ApiResult<(usize, usize, usize)> {
    recover(engine, st)?;
    let views = engine.list()?;
    let known: BTreeSet<String> = views.iter().map(|v| v.sandbox.id.to_string()).collect();
    let db = st.db();
    let mut dropped = 0;
    for id in db.ids()? {
        if !known.contains(&id) {
            db.remove(&id)?;
            dropped += 1;
        }
    }
    drop(db);
    let mut lost = 0;
    for v in views.iter().filter(|v| v.sandbox.state == SandboxState::Lost) {
        lost += 1;
        record(
            st,
            "service.lost",
            200,
            None,
            Some(v.sandbox.id.as_str()),
            Some(format!(
                "found lost at service start: {}",
                v.lost_reason.as_deref().unwrap_or("runtime gone")
            )),
        );
    }
    Ok((views.len() - lost, lost, dropped))
}
