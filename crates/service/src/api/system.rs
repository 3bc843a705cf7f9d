//! The service itself: health, metrics, the lineage graph and the audit log.

use super::extract::{sandbox_id, ApiQuery};
use super::types::*;
use crate::db::{AuditEntry, AuditFilter};
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::AppState;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use branchbox_model::SandboxState;
use std::collections::{BTreeMap, BTreeSet};

/// Liveness: answers without a token and touches nothing.
#[utoipa::path(get, path = "/healthz", tag = "service", responses((status = 200, body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health { status: "ok".into() })
}

/// Query of the service's proof.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ChallengeQuery {
    /// A fresh random value of the client's, 32 to 128 hex digits.
    pub nonce: String,
}

/// The service's proof that it holds the client's token.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct Challenge {
    /// The address the service listens on (as in `<data>/service/url`, without `http://`).
    pub listen: String,
    /// Hex HMAC-SHA256 keyed with SHA-256(token) over `branchbox-service-proof\n<listen>\n<nonce>`,
    /// one per accepted token; empty when authentication is off.
    pub proofs: Vec<String>,
}

/// Proves the service holds a token before a client sends it: a process that took over the
/// service's port after the service died cannot answer. Needs no token.
#[utoipa::path(get, path = "/v1/auth/challenge", tag = "service", params(ChallengeQuery),
    responses((status = 200, body = Challenge), (status = "4XX", body = ErrorBody, description = "bad nonce")))]
pub async fn challenge(
    State(st): State<AppState>,
    ApiQuery(q): ApiQuery<ChallengeQuery>,
) -> ApiResult<Json<Challenge>> {
    let n = &q.nonce;
    if !(32..=128).contains(&n.len()) || !n.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::invalid("nonce must be 32 to 128 hex digits, fresh and random for each check"));
    }
    let listen = st.cfg.listen.clone().unwrap_or_default();
    let proofs = st.tokens.as_ref().map(|t| t.proofs(&listen, n)).unwrap_or_default();
    Ok(Json(Challenge { listen, proofs }))
}

/// Metrics in the Prometheus text format.
#[utoipa::path(get, path = "/metrics", tag = "service",
    responses((status = 200, content_type = "text/plain", body = String), (status = "4XX", body = ErrorBody, description = "unauthorized")))]
pub async fn metrics(State(st): State<AppState>) -> ApiResult<impl IntoResponse> {
    let (counts, pools) = st
        .blocking(|engine, st| {
            let mut by: BTreeMap<&'static str, usize> =
                [("running", 0), ("paused", 0), ("lost", 0)].into_iter().collect();
            for v in engine.list()? {
                *by.entry(v.sandbox.state.as_str()).or_default() += 1;
            }
            Ok((by, crate::pool::render_metrics(st)?))
        })
        .await?;
    let text = st.metrics.render(&counts, st.cfg.max_sandboxes) + &pools;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text))
}

/// The lineage: every snapshot and sandbox with its parent edges, or only the part connected
/// to one sandbox.
#[utoipa::path(get, path = "/v1/lineage", tag = "snapshots", params(LineageQuery),
    responses((status = 200, body = Lineage), (status = "4XX", body = ErrorBody, description = "bad sandbox id")))]
pub async fn lineage(
    State(st): State<AppState>,
    ApiQuery(q): ApiQuery<LineageQuery>,
) -> ApiResult<Json<Lineage>> {
    let only = q.sandbox.as_deref().map(sandbox_id).transpose()?;
    let out = st
        .blocking(move |engine, _| {
            let snaps = engine.snapshots()?;
            let boxes = engine.list()?;
            let mut refs: std::collections::HashMap<String, Vec<String>> = std::collections::HashMap::new();
            for (name, snap) in engine.refs()? {
                refs.entry(snap).or_default().push(name);
            }
            if let Some(id) = &only {
                if !boxes.iter().any(|b| &b.sandbox.id == id) {
                    return Err(branchbox_model::Error::not_found(
                        "sandbox",
                        id.as_str(),
                        "GET /v1/sandboxes lists them",
                    )
                    .into());
                }
            }
            let mut l = Lineage {
                snapshots: snaps
                    .iter()
                    .map(|s| LineageSnapshot {
                        id: s.id.to_string(),
                        parent: s.parent.as_ref().map(ToString::to_string),
                        source: s.source.as_ref().map(ToString::to_string),
                        kind: s.kind.as_str().into(),
                        name: s.name.clone(),
                        created_ms: s.created_ms,
                        deleted: s.deleted_ms.is_some(),
                        refs: refs.remove(s.id.as_str()).unwrap_or_default(),
                    })
                    .collect(),
                sandboxes: boxes
                    .iter()
                    .map(|b| LineageSandbox {
                        id: b.sandbox.id.to_string(),
                        parent_snapshot: b.sandbox.parent_snapshot.as_ref().map(ToString::to_string),
                        state: if b.alive { b.sandbox.state.into() } else { SandboxState::Lost.into() },
                    })
                    .collect(),
            };
            if let Some(id) = only {
                let keep = component(&l, id.as_str());
                l.snapshots.retain(|s| keep.contains(&s.id));
                l.sandboxes.retain(|s| keep.contains(&s.id));
            }
            Ok(l)
        })
        .await?;
    Ok(Json(out))
}

/// Every node connected to `start` through parent, source or parent-snapshot edges.
fn component(l: &Lineage, start: &str) -> BTreeSet<String> {
    let mut edges: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    for s in &l.snapshots {
        if let Some(p) = &s.parent {
            pairs.push((s.id.as_str(), p.as_str()));
        }
        if let Some(src) = &s.source {
            pairs.push((s.id.as_str(), src.as_str()));
        }
    }
    for b in &l.sandboxes {
        if let Some(p) = &b.parent_snapshot {
            pairs.push((b.id.as_str(), p.as_str()));
        }
    }
    for (a, b) in pairs {
        edges.entry(a).or_default().push(b);
        edges.entry(b).or_default().push(a);
    }
    let mut seen = BTreeSet::from([start.to_string()]);
    let mut todo = vec![start];
    while let Some(n) = todo.pop() {
        for next in edges.get(n).into_iter().flatten() {
            if seen.insert(next.to_string()) {
                todo.push(next);
            }
        }
    }
    seen
}

/// The audit log of state-changing calls, oldest first.
#[utoipa::path(get, path = "/v1/audit", tag = "service", params(AuditQuery),
    responses((status = 200, body = Vec<AuditEntry>), (status = "4XX", body = ErrorBody, description = "bad query")))]
pub async fn audit(
    State(st): State<AppState>,
    ApiQuery(q): ApiQuery<AuditQuery>,
) -> ApiResult<Json<Vec<AuditEntry>>> {
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid("limit must be 1 to 1000"));
    }
    if q.who.as_ref().is_some_and(|w| w.len() > 64) || q.sandbox.as_ref().is_some_and(|s| s.len() > 64) {
        return Err(ApiError::invalid("who and sandbox filters are at most 64 characters"));
    }
    let f = AuditFilter { sandbox: q.sandbox, who: q.who, after: q.after, limit };
    let out = st.blocking(move |_, st| st.db().audit_log(&f).map_err(ApiError::from)).await?;
    Ok(Json(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(id: &str, parent: Option<&str>, source: &str) -> LineageSnapshot {
        LineageSnapshot {
            id: id.into(),
            parent: parent.map(Into::into),
            source: Some(source.into()),
            kind: "snapshot".into(),
            name: None,
            created_ms: 0,
            deleted: false,
            refs: Vec::new(),
        }
    }

    fn sbx(id: &str, parent: Option<&str>) -> LineageSandbox {
        LineageSandbox { id: id.into(), parent_snapshot: parent.map(Into::into), state: StateName::Running }
    }

    #[test]
    fn lineage_component_holds_ancestors_and_descendants_only() {
        // a -> s1 -> b -> s2 -> c ; unrelated: d -> s3 -> e
        let l = Lineage {
            snapshots: vec![snap("s1", None, "a"), snap("s2", Some("s1"), "b"), snap("s3", None, "d")],
            sandboxes: vec![
                sbx("a", None),
                sbx("b", Some("s1")),
                sbx("c", Some("s2")),
                sbx("d", None),
                sbx("e", Some("s3")),
            ],
        };
        let got = component(&l, "b");
        let want: BTreeSet<String> = ["a", "s1", "b", "s2", "c"].iter().map(|s| s.to_string()).collect();
        assert_eq!(got, want);
    }
}
