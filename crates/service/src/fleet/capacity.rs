//! How much room a node has for new sandboxes: `GET /v1/fleet/capacity` answers it (the native
//! API registers the route, `crate::api`), and a node at its cap asks its peers before it
//! passes a create on ([`super::spill`]).

use super::forward::{send, FORWARDED};
use super::Peer;
use crate::error::{ApiResult, ErrorBody};
use crate::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, Method, StatusCode};
use axum::Json;
use branchbox_model::SandboxState;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use utoipa::ToSchema;

/// The route.
pub const PATH: &str = "/v1/fleet/capacity";
/// Longest a peer may take to say how much room it has.
const DEADLINE: Duration = Duration::from_secs(2);

/// A node's sandboxes against its cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Capacity {
    /// Sandboxes it holds (running or paused; lost ones hold nothing).
    pub sandboxes: usize,
    /// Its `--max-sandboxes`.
    pub max_sandboxes: usize,
    /// How many more it would start now; creates already admitted but not yet recorded are
    /// not counted, so a create may still find it full.
    pub room: usize,
}

/// This node's sandboxes against its `--max-sandboxes`: what a fleet peer asks before it passes
/// a create it has no room for to this node.
#[utoipa::path(get, path = "/v1/fleet/capacity", tag = "fleet",
    responses((status = 200, body = Capacity), (status = "4XX", body = ErrorBody, description = "unauthorized")))]
pub async fn capacity(State(st): State<AppState>) -> ApiResult<Json<Capacity>> {
    let c = st
        .blocking(|engine, st| {
            let sandboxes = engine.list()?.iter().filter(|v| v.sandbox.state != SandboxState::Lost).count();
            let max_sandboxes = st.cfg.max_sandboxes;
            Ok(Capacity { sandboxes, max_sandboxes, room: max_sandboxes.saturating_sub(sandboxes) })
        })
        .await?;
    Ok(Json(c))
}

/// Each peer's capacity, asked of all at once; `Err` says why a peer gave none.
pub async fn of_peers(peers: &[Peer]) -> Vec<Result<Capacity, String>> {
    let asks = peers.iter().map(|p| async move {
        let asked = async {
            let req = axum::http::Request::builder()
                .method(Method::GET)
                .uri(PATH)
                .header(header::HOST, &p.authority)
                .header(header::AUTHORIZATION, format!("Bearer {}", p.token))
                .header(FORWARDED, "capacity")
                .body(Body::empty())
                .map_err(|e| e.to_string())?;
            let r = send(p, req).await.map_err(|e| format!("did not answer: {e}"))?;
            if r.status() != StatusCode::OK {
                return Err(format!("answered {} to {PATH}", r.status().as_u16()));
            }
            let bytes = axum::body::to_bytes(Body::new(r.into_body()), 4096)
                .await
                .map_err(|_| "its capacity answer was cut short or too long".to_string())?;
            serde_json::from_slice::<Capacity>(&bytes)
                .map_err(|e| format!("its capacity answer is unreadable: {e}"))
        };
        tokio::time::timeout(DEADLINE, asked)
            .await
            .unwrap_or_else(|_| Err(format!("no capacity answer in {} s", DEADLINE.as_secs())))
    });
    futures_util::future::join_all(asks).await
}
