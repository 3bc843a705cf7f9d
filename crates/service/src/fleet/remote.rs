//! Portable snapshots through the API: a node serves the chunks of the snapshots it holds to
//! the other nodes (`GET /v1/snapshots/{snapshot}/chunks/{sha256}`), and pushes and pulls
//! snapshots to and from the S3-compatible store it is configured with
//! (`POST /v1/snapshots/{snapshot}/push`, `POST /v1/snapshots/pull`), a pull asking a peer of
//! its peers file for each chunk before the store. The store is named by branchboxd's
//! environment as for `branchbox remote` (`BRANCHBOX_REMOTE`, `BRANCHBOX_S3_ENDPOINT`,
//! `AWS_*`), read at each request. docs/remote.md, "Through the API" and "Pull from a peer".
//!
//! The routes are part of the native API's OpenAPI document (`crate::api` adds them with its
//! authentication and audit log); the serving side keeps parsed manifests between a peer's
//! requests ([`manifests`]).

mod manifests;

use self::manifests::Manifests;
use super::Fleet;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{snapshot_ref, ApiJson};
use crate::middleware::AuditNote;
use crate::AppState;
use axum::extract::{FromRef, Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use branchbox_chunks::peer::{ChunkSource, HeldChunks, HeldError, Peer};
use branchbox_chunks::s3::{Remote, RemoteConfig, StoreSettings};
use branchbox_chunks::{PullReport, PushReport, LOCAL_MANIFEST};
use branchbox_model::SnapshotId;
use serde::{Deserialize, Serialize};
use std::ops::ControlFlow;
use std::sync::Arc;
use tokio::sync::Semaphore;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Chunks read for peers at once; each holds up to 4 MiB in memory until it is sent.
const CHUNK_READS: usize = 8;

#[derive(Clone)]
struct Shared {
    fleet: Fleet,
    reads: Arc<Semaphore>,
    manifests: Arc<Manifests<HeldChunks>>,
}

/// The routes with their OpenAPI description, for a router whose state holds an [`AppState`];
/// the caller puts them behind authentication by this node's token and the audit log.
pub fn routes<S>(st: &AppState) -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    AppState: FromRef<S>,
{
    let shared = Shared {
        fleet: Fleet::new(st),
        reads: Arc::new(Semaphore::new(CHUNK_READS)),
        manifests: Default::default(),
    };
    OpenApiRouter::new()
        .routes(routes!(chunk))
        .routes(routes!(push))
        .routes(routes!(pull))
        .layer(Extension(shared))
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
/// names it, checked against its hash before it is sent. Peers ask this during a pull.
#[utoipa::path(get, path = "/v1/snapshots/{snapshot}/chunks/{hash}", tag = "remote",
    params(("snapshot" = String, Path, description = "snapshot id (not a name)"),
           ("hash" = String, Path, description = "the chunk's SHA-256, 64 lowercase hex digits")),
    responses((status = 200, content_type = "application/octet-stream", body = Vec<u8>, description = "the chunk's bytes"),
              (status = "4XX", body = ErrorBody, description = "bad id (400); not pushed or pulled here, or no such chunk in its manifest (404)"),
              (status = 500, body = ErrorBody, description = "the local copy is damaged or unreadable")))]
async fn chunk(
    State(st): State<AppState>,
    Extension(sh): Extension<Shared>,
    Path((snapshot, hash)): Path<(String, String)>,
) -> ApiResult<Response> {
    let id = SnapshotId::parse(&snapshot).map_err(|e| ApiError::bad_request("invalid_id", e.to_string()))?;
    let dir = st.cfg.engine.data_dir.join("snapshots").join(id.as_str());
    let _permit = sh.reads.acquire().await.map_err(|_| ApiError::internal("the chunk readers are closed"))?;
    let manifests = sh.manifests.clone();
    let read = tokio::task::spawn_blocking(move || {
        manifests.get(&id, &dir.join(LOCAL_MANIFEST), || HeldChunks::load(&dir, &id))?.read(&hash)
    })
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

/// What a push did.
#[derive(Debug, Serialize, ToSchema)]
struct PushAnswer {
    /// The snapshot's id.
    snapshot: String,
    /// Chunks in its manifest.
    chunks: usize,
    /// Chunks uploaded.
    sent_chunks: usize,
    /// Bytes uploaded.
    sent_bytes: u64,
    /// Bytes the store had already.
    skipped_bytes: u64,
    /// Wall time, seconds.
    seconds: f64,
}

impl From<PushReport> for PushAnswer {
    fn from(r: PushReport) -> PushAnswer {
        // Taken apart whole, so a field added to the report cannot be left out of the answer.
        let PushReport { snapshot, chunks, sent_chunks, sent_bytes, skipped_bytes, seconds } = r;
        PushAnswer { snapshot, chunks, sent_chunks, sent_bytes, skipped_bytes, seconds }
    }
}

/// What a pull did.
#[derive(Debug, Serialize, ToSchema)]
struct PullAnswer {
    /// The snapshot's id.
    snapshot: String,
    /// Chunks in its manifest.
    chunks: usize,
    /// Bytes downloaded: `peer_bytes` + `s3_bytes`.
    fetched_bytes: u64,
    /// Bytes copied from snapshots already here.
    reused_bytes: u64,
    /// Bytes fetched from the peer.
    peer_bytes: u64,
    /// Bytes fetched from the store.
    s3_bytes: u64,
    /// Why the pull stopped asking the peer, when it had one and it failed.
    peer_error: Option<String>,
    /// Wall time, seconds.
    seconds: f64,
}

impl From<PullReport> for PullAnswer {
    fn from(r: PullReport) -> PullAnswer {
        let PullReport {
            snapshot,
            chunks,
            fetched_bytes,
            reused_bytes,
            peer_bytes,
            s3_bytes,
            peer_error,
            seconds,
        } = r;
        PullAnswer {
            snapshot,
            chunks,
            fetched_bytes,
            reused_bytes,
            peer_bytes,
            s3_bytes,
            peer_error,
            seconds,
        }
    }
}

/// Pushes a snapshot (id or name) to the store: the chunks it lacks, then the manifest.
#[utoipa::path(post, path = "/v1/snapshots/{snapshot}/push", tag = "remote",
    params(("snapshot" = String, Path, description = "snapshot id or name")),
    responses((status = 200, body = PushAnswer),
              (status = "4XX", body = ErrorBody, description = "bad reference (400) or no such snapshot (404)"),
              (status = 502, body = ErrorBody, description = "the store refused what was sent"),
              (status = 503, body = ErrorBody, description = "no store configured, or it is unreachable")))]
async fn push(
    State(st): State<AppState>,
    Path(snapshot): Path<String>,
) -> ApiResult<(StatusCode, Extension<AuditNote>, Json<PushAnswer>)> {
    let snapshot = snapshot_ref(&snapshot)?;
    // An unknown snapshot is a 404 whether or not a store is configured.
    let id = st.blocking(move |engine, _| Ok(engine.find_snapshot(&snapshot)?.id)).await?;
    let remote = store(&st.cfg.store)?;
    let url = remote.url().to_string();
    let r = st
        .blocking(move |engine, _| {
            Ok(engine.push_snapshot(&remote, id.as_str(), &mut |_| ControlFlow::Continue(()))?)
        })
        .await?;
    let note = AuditNote {
        snapshot: Some(r.snapshot.clone()),
        detail: Some(format!("pushed to {url}: {} chunks, {} bytes sent", r.chunks, r.sent_bytes)),
        ..Default::default()
    };
    Ok((StatusCode::OK, Extension(note), Json(r.into())))
}

/// What `POST /v1/snapshots/pull` takes.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct PullBody {
    /// The pushed snapshot's id.
    id: String,
    /// A peer of this node's peers file (`--peers`) to ask for each chunk before the store.
    #[serde(default)]
    peer: Option<String>,
}

/// Pulls a pushed snapshot into this node under the same id, asking `peer` for each chunk
/// before the store.
#[utoipa::path(post, path = "/v1/snapshots/pull", tag = "remote", request_body = PullBody,
    responses((status = 200, body = PullAnswer),
              (status = "4XX", body = ErrorBody, description = "bad id or body, a peer not in the peers file (400/422), never pushed (404), already here (409)"),
              (status = 502, body = ErrorBody, description = "a chunk in the store is corrupt or missing, or the manifest is refused; nothing was recorded"),
              (status = 503, body = ErrorBody, description = "no store configured, or it is unreachable")))]
async fn pull(
    State(st): State<AppState>,
    Extension(sh): Extension<Shared>,
    ApiJson(body): ApiJson<PullBody>,
) -> ApiResult<(StatusCode, Extension<AuditNote>, Json<PullAnswer>)> {
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
    Ok((StatusCode::OK, Extension(note), Json(r.into())))
}
