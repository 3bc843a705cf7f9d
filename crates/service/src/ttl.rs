//! Sandbox timeouts, enforced by a background task, and the reconciliation run at start: the
//! service's records are matched to what the engine still has, so a restart loses nothing.

use crate::api::sandboxes::db_err;
use crate::db::{AuditEntry, OnTimeout};
use crate::error::{engine_status, ApiResult};
use crate::state::AppState;
use branchbox_core::Engine;
use branchbox_model::{now_ms, Error, SandboxId, SandboxState};
use std::collections::BTreeSet;

/// How long a failed timeout action waits before it is tried again, ms.
const RETRY_MS: i64 = 30_000;

fn record(
    st: &AppState,
    action: &str,
    status: u16,
    code: Option<&str>,
    sandbox: &str,
    detail: Option<String>,
) {
    let e = AuditEntry {
        seq: 0,
        at_ms: 0,
        who: "service".into(),
        action: action.into(),
        status,
        code: code.map(Into::into),
        sandbox: Some(sandbox.into()),
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
    let due = st.db().due(now).map_err(db_err)?;
    let mut done = Vec::new();
    for (id, action) in due {
        let Ok(sid) = SandboxId::parse(&id) else {
            st.db().remove(&id).map_err(db_err)?;
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
                st.db().remove(&id).map_err(db_err)?;
                if r.is_ok() {
                    "kill"
                } else {
                    "gone"
                }
            }
            (Ok(()), OnTimeout::Pause) => {
                st.db().set_expiry(&sid, None, None).map_err(db_err)?;
                "pause"
            }
            // Already paused, or its runtime is gone: nothing left to stop.
            (Err(Error::Conflict(_)), _) => {
                st.db().set_expiry(&sid, None, None).map_err(db_err)?;
                "skipped"
            }
            (Err(e), _) => {
                tracing::warn!(
                    "timeout of {id} could not be applied ({e}); retrying in {} s",
                    RETRY_MS / 1000
                );
                st.db().set_expiry(&sid, Some(now + RETRY_MS), None).map_err(db_err)?;
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
            &id,
            None,
        );
        st.metrics.ttl(outcome);
        done.push((id, outcome));
    }
    Ok(done)
}

/// Runs [`tick`] forever.
pub async fn run(st: AppState) {
    loop {
        tokio::time::sleep(st.cfg.ttl_tick).await;
        if let Err(e) = st.blocking(|engine, st| tick(engine, st, now_ms())).await {
            tracing::warn!("timeout check failed: {e}");
        }
    }
}

/// Matches the service's records to the engine's at start: records of sandboxes the engine no
/// longer has are dropped, and sandboxes whose runtime is gone are reported (and audited) as lost.
/// Returns (sandboxes alive, lost, records dropped).
pub fn reconcile(engine: &Engine, st: &AppState) -> ApiResult<(usize, usize, usize)> {
    let views = engine.list()?;
    let known: BTreeSet<String> = views.iter().map(|v| v.sandbox.id.to_string()).collect();
    let db = st.db();
    let mut dropped = 0;
    for id in db.ids().map_err(db_err)? {
        if !known.contains(&id) {
            db.remove(&id).map_err(db_err)?;
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
            v.sandbox.id.as_str(),
            Some("runtime gone at service start".into()),
        );
    }
    Ok((views.len() - lost, lost, dropped))
}
