//! Portable snapshots through the API: a node serves the chunks of the snapshots it holds to
//! the other nodes (`GET /v1/snapshots/{snapshot}/chunks/{sha256}`), and pushes and pulls
//! snapshots to and from the S3-compatible store it is configured with
//! (`POST /v1/snapshots/{snapshot}/push`, `POST /v1/snapshots/pull`), a pull asking a peer of
//! its peers file for each chunk before the store. The store is named by branchboxd's
//! environment as for `branchbox remote` (`BRANCHBOX_REMOTE`, `BRANCHBOX_S3_ENDPOINT`,
//! `AWS_*`), read at each request. docs/remote.md, "Through the API" and "Pull from a peer".

use super::Fleet;
use crate::error::{ApiError, ApiResult};
use crate::extract::{snapshot_ref, ApiJson};
use crate::middleware::{audit, authenticate, AuditNote};
use crate::AppState;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use branchbox_chunks::peer::{read_held_chunk, ChunkSource, HeldError, Peer};
use branchbox_chunks::s3::{Remote, RemoteConfig, StoreSettings};
use branchbox_chunks::{PullReport, PushReport};
use branchbox_model::SnapshotId;
use serde::Deserialize;
use std::ops::ControlFlow;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// Chunks read for peers at once; each holds up to 4 MiB in memory until it is sent.
const CHUNK_READS: usize = 8;

#[derive(Clone)]
struct Shared {
    fleet: Fleet,
    reads: Arc<Semaphore>,
}

/// The routes, behind authentication by this node's token and the audit log.
pub fn router(st: AppState) -> Router {
    let shared = Shared { fleet: Fleet::new(&st), reads: Arc::new(Semaphore::new(CHUNK_READS)) };
    Router::new()
        .route("/v1/snapshots/{snapshot}/chunks/{hash}", get(chunk))
        .route("/v1/snapshots/{snapshot}/push", post(push))
        .route("/v1/snapshots/pull", post(pull))
        .layer(Extension(shared))
        .layer(from_fn_with_state(st.clone(), audit))
        .layer(from_fn_with_state(st.clone(), authenticate))
        .with_state(st)
}

/// The store branchboxd's flags name, else its environment, or 503 saying what is missing.
fn store(flags: &StoreSettings) -> ApiResult<Remote> {
    RemoteConfig::from_env(flags).and_then(|cfg| Remote::new(&cfg)).map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            format!(
                "this branchboxd has no usable snapshot store: {e}; start it with BRANCHBOX_REMOTE, \
                 BRANCHBOX_S3_ENDPOINT, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY set (docs/remote.md)"
            ),
        )
    })
}

/// One chunk of a snapshot this node holds (pushed from here or pulled here), as its manifest
/// names it, checked against its hash before it is sent.
async fn chunk(
    State(st): State<AppState>,
    Extension(sh): Extension<Shared>,
    Path((snapshot, hash)): Path<(String, String)>,
) -> ApiResult<Response> {
    let id = SnapshotId::parse(&snapshot).map_err(|e| ApiError::bad_request("invalid_id", e.to_string()))?;
    let dir = st.cfg.engine.data_dir.join("snapshots").join(id.as_str());
    let _permit = sh.reads.acquire().await.map_err(|_| ApiError::internal("the chunk readers are closed"))?;
    let read = tokio::task::spawn_blocking(move || read_held_chunk(&dir, &id, &hash))
        .await
        .map_err(|e| ApiError::internal(format!("a worker failed: {e}")))?;
    match read {
        Ok(data) => Ok(([(header::CONTENT_TYPE, "application/octet-stream")], data).into_response()),
        Err(e @ (HeldError::NoSnapshot(_) | HeldError::NotNamed { .. })) => {
            Err(ApiError::not_found(e.to_string()))
        }
        Err(HeldError::Local(e)) => Err(ApiError::internal(e.to_string())),
    }
}

/// Pushes a snapshot (id or name) to the store: the chunks it lacks, then the manifest.
async fn push(
    State(st): State<AppState>,
    Path(snapshot): Path<String>,
) -> ApiResult<(StatusCode, Extension<AuditNote>, Json<PushReport>)> {
    let snapshot = snapshot_ref(&snapshot)?;
    let remote = store(&st.cfg.store)?;
    let url = remote.url().to_string();
    let r = st
        .blocking(move |engine, _| {
            Ok(engine.push_snapshot(&remote, &snapshot, &mut |_| ControlFlow::Continue(()))?)
        })
        .await?;
    let note = AuditNote {
        snapshot: Some(r.snapshot.clone()),
        detail: Some(format!("pushed to {url}: {} chunks, {} bytes sent", r.chunks, r.sent_bytes)),
        ..Default::default()
    };
    Ok((StatusCode::OK, Extension(note), Json(r)))
}

/// What `POST /v1/snapshots/pull` takes.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PullBody {
    /// The pushed snapshot's id.
    id: String,
    /// A peer of this node's peers file (`--peers`) to ask for each chunk before the store.
    #[serde(default)]
    peer: Option<String>,
}

/// Pulls a pushed snapshot into this node under the same id.
async fn pull(
    State(st): State<AppState>,
    Extension(sh): Extension<Shared>,
    ApiJson(body): ApiJson<PullBody>,
) -> ApiResult<(StatusCode, Extension<AuditNote>, Json<PullReport>)> {
    let id = SnapshotId::parse(&body.id).map_err(|e| ApiError::bad_request("invalid_id", e.to_string()))?;
    let peer = match &body.peer {
        None => None,
        Some(name) => {
            let peers = sh.fleet.peers();
            let p = peers.iter().find(|p| &p.name == name).ok_or_else(|| {
                ApiError::invalid(format!(
                    "no peer {:?} in this node's peers file; a pull asks only the nodes branchboxd was given with --peers",
                    name.chars().take(64).collect::<String>()
                ))
            })?;
            let url = format!("http://{}", p.authority);
            Some(Peer::new(&url, Some(p.token.clone())).map_err(|e| ApiError::invalid(e.to_string()))?)
        }
    };
    let remote = store(&st.cfg.store)?;
    let url = remote.url().to_string();
    let r = st
        .blocking(move |engine, _| {
            let peer = peer.as_ref().map(|p| p as &dyn ChunkSource);
            Ok(engine.pull_snapshot(&remote, id.as_str(), peer, &mut |_| {})?)
        })
        .await?;
    let from =
        body.peer.as_deref().map(|n| format!(", {} bytes from peer {n}", r.peer_bytes)).unwrap_or_default();
    let note = AuditNote {
        snapshot: Some(r.snapshot.clone()),
        detail: Some(format!("pulled from {url}: {} bytes fetched{from}", r.fetched_bytes)),
        ..Default::default()
    };
    Ok((StatusCode::OK, Extension(note), Json(r)))
}
