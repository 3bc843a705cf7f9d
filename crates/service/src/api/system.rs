//! The service itself: health, metrics, the lineage graph and the audit log.

use crate::db::{AuditEntry, AuditFilter};
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{sandbox_id, ApiQuery};
use crate::ops::types::*;
use crate::pool::Pools;
use crate::state::AppState;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use std::collections::BTreeMap;
use std::sync::Arc;

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
pub async fn metrics(
    State(st): State<AppState>,
    State(pools): State<Arc<Pools>>,
) -> ApiResult<impl IntoResponse> {
    let (counts, pools) = st
        .blocking(move |engine, st| {
            let mut by: BTreeMap<&'static str, usize> =
                [("running", 0), ("paused", 0), ("lost", 0)].into_iter().collect();
            for v in engine.list()? {
                *by.entry(v.sandbox.state.as_str()).or_default() += 1;
            }
            Ok((by, crate::pool::render_metrics(st, &pools)?))
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
    Ok(Json(crate::ops::lineage::lineage(&st, only).await?))
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
