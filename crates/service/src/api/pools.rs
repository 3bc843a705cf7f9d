//! Warm pools: create, list, get, delete, and claim a sandbox from one (`docs/pools.md`).

use crate::auth::Caller;
use crate::db::OnTimeout;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{sandbox_path, seconds, snapshot_ref, ApiJson};
use crate::middleware::AuditNote;
use crate::ops::sandboxes::client_meta;
use crate::pool::claim::{ClaimSpec, Claimed, FileData};
use crate::pool::{self, PoolDef, Pools};
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use base64::Engine as _;
use branchbox_model::{now_ms, Name};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use utoipa::ToSchema;

/// Most ready sandboxes one pool may keep.
pub const MAX_POOL_SIZE: u32 = 64;
/// Idle age when a pool names none, seconds.
pub const DEFAULT_MAX_IDLE_S: f64 = 3600.0;
/// Longest idle age a pool may set, seconds (a week).
pub const MAX_IDLE_S: u64 = 7 * 24 * 3600;
/// How long a claim waits for an empty pool when it names no wait, seconds.
pub const DEFAULT_WAIT_S: f64 = 30.0;
/// Most files one claim may write.
pub const MAX_CLAIM_FILES: usize = 64;

/// A new pool.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePool {
    /// Its name (the snapshot naming rule: no spaces or '/').
    pub name: String,
    /// The snapshot (id or name) its sandboxes are restored from.
    pub snapshot: Option<String>,
    /// A template instead of a snapshot: its sandboxes start from the template's final snapshot.
    pub template: Option<String>,
    /// How many ready sandboxes it keeps (1 to 64; they count against the service's cap).
    pub size: u32,
    /// Ready sandboxes older than this are replaced with fresh ones, seconds (default 3600).
    pub max_idle: Option<f64>,
    /// Keep ready sandboxes paused (true) or running idle (false, the default: a claim then
    /// skips the resume).
    pub paused: Option<bool>,
}

/// A change to a pool: its size, its idle age or both; what it leaves out stays as it is.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdatePool {
    /// How many ready sandboxes it keeps (1 to 64, within the service's cap). A smaller size
    /// destroys the oldest ready sandboxes beyond it; a larger one starts a refill.
    pub size: Option<u32>,
    /// Ready sandboxes older than this are replaced with fresh ones, seconds (at most a week).
    pub max_idle: Option<f64>,
}

/// A pool and how full it is.
#[derive(Debug, Serialize, ToSchema)]
pub struct PoolInfo {
    /// Its definition.
    #[serde(flatten)]
    pub def: PoolDef,
    /// Ready sandboxes now.
    pub ready: usize,
    /// Their ids, oldest first (hidden from the sandbox list until claimed).
    pub members: Vec<String>,
    /// Host memory of its ready sandboxes, bytes (`null` where the host does not show it).
    pub memory_bytes: Option<u64>,
    /// Claims served from the pool since the service started.
    pub claims_pool: u64,
    /// Claims that started a sandbox because the pool was empty, since the service started.
    pub claims_cold: u64,
    /// Why the last refill failed, until one succeeds.
    pub last_error: Option<String>,
}

/// A file a claim writes into the sandbox before handing it out.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimFile {
    /// Absolute path (missing parent directories are created).
    pub path: String,
    /// The content: UTF-8 text, or base64 with `"encoding": "base64"`.
    pub content: String,
    /// `utf8` (default) or `base64`.
    pub encoding: Option<FileEncoding>,
    /// Permission bits, e.g. 0o644 as 420.
    pub mode: Option<u32>,
}

/// How a claim file's content is written in the request.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileEncoding {
    /// Text.
    Utf8,
    /// Base64 (standard alphabet, padded).
    Base64,
}

/// A claim.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    /// Environment added to every command run through the service.
    pub envs: Option<BTreeMap<String, String>>,
    /// Labels, as at creation.
    pub metadata: Option<BTreeMap<String, String>>,
    /// Files written before the sandbox is handed out.
    pub files: Option<Vec<ClaimFile>>,
    /// The claimed sandbox's timeout, seconds (default: the service's).
    pub timeout: Option<f64>,
    /// What its timeout does (default `kill`).
    pub on_timeout: Option<OnTimeout>,
    /// How long to wait for a ready sandbox when the pool is empty, seconds (default 30);
    /// then the claim fails with 503 `pool_empty`.
    pub wait: Option<f64>,
    /// When the pool is empty, start a sandbox from its snapshot at once instead of waiting;
    /// the result then says `"source": "cold"`.
    pub allow_cold: Option<bool>,
}

fn info(st: &AppState, pools: &Pools, def: PoolDef) -> ApiResult<PoolInfo> {
    let members = st.db().members(&def.name)?;
    let mem: Vec<u64> = members.iter().filter_map(|m| pool::sandbox_memory(&m.id)).collect();
    let s = pools.stats(&def.name);
    Ok(PoolInfo {
        ready: members.len(),
        members: members.iter().map(|m| m.id.clone()).collect(),
        memory_bytes: (!mem.is_empty() || members.is_empty()).then(|| mem.iter().sum()),
        claims_pool: s.claims_pool,
        claims_cold: s.claims_cold,
        last_error: s.last_error,
        def,
    })
}

fn pool_name(s: &str) -> ApiResult<String> {
    Name::parse("pool name", s).map_err(|e| ApiError::invalid(e.to_string()))?;
    Ok(s.to_string())
}

/// A pool's size, checked: 1 to [`MAX_POOL_SIZE`], and within the service's cap.
fn check_size(st: &AppState, size: u32) -> ApiResult<u32> {
    if size == 0 || size > MAX_POOL_SIZE || size as usize > st.cfg.max_sandboxes {
        return Err(ApiError::invalid(format!(
            "size {size} is out of range: a pool keeps 1 to {MAX_POOL_SIZE} ready sandboxes (and no more than the service's cap of {})",
            st.cfg.max_sandboxes
        )));
    }
    Ok(size)
}

/// A pool's idle age, checked (above 0, at most [`MAX_IDLE_S`] seconds), in ms.
fn max_idle_ms(s: f64) -> ApiResult<i64> {
    Ok(seconds("max_idle", s, MAX_IDLE_S)?.as_millis() as i64)
}

fn note(pool: &str) -> AuditNote {
    AuditNote { detail: Some(format!("pool {pool}")), ..Default::default() }
}

/// Creates a pool; the service fills it in the background.
#[utoipa::path(post, path = "/v1/pools", tag = "pools", request_body = CreatePool,
    responses((status = 201, body = PoolInfo, description = "created; filling starts now"),
              (status = "4XX", body = ErrorBody, description = "bad request, unknown snapshot, name taken (409)")))]
pub async fn create(
    State(st): State<AppState>,
    State(pools): State<Arc<Pools>>,
    Extension(caller): Extension<Caller>,
    ApiJson(req): ApiJson<CreatePool>,
) -> ApiResult<(StatusCode, Extension<AuditNote>, Json<PoolInfo>)> {
    let name = pool_name(&req.name)?;
    let snapshot = req.snapshot.as_deref().map(snapshot_ref).transpose()?;
    if snapshot.is_some() == req.template.is_some() {
        return Err(ApiError::invalid("name exactly one of snapshot and template as the pool's source"));
    }
    if let Some(t) = &req.template {
        Name::parse("template name", t).map_err(|e| ApiError::invalid(e.to_string()))?;
    }
    let def = PoolDef {
        name: name.clone(),
        snapshot,
        template: req.template,
        size: check_size(&st, req.size)?,
        paused: req.paused.unwrap_or(false),
        max_idle_ms: max_idle_ms(req.max_idle.unwrap_or(DEFAULT_MAX_IDLE_S))?,
        created_ms: now_ms(),
        created_by: caller.0,
    };
    let p = pools.clone();
    let out = st
        .blocking(move |engine, st| {
            if let Some(s) = &def.snapshot {
                let snap = engine.find_snapshot(s)?;
                if snap.deleted_ms.is_some() {
                    return Err(ApiError::new(
                        StatusCode::CONFLICT,
                        "conflict",
                        format!("snapshot {} was deleted; a pool needs one that can be restored", snap.id),
                    ));
                }
            }
            if !st.db().pool_insert(&def)? {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "conflict",
                    format!(
                        "a pool named {:?} exists already; DELETE /v1/pools/{} first or choose another name",
                        def.name, def.name
                    ),
                ));
            }
            info(st, &p, def)
        })
        .await?;
    pools.wake();
    Ok((StatusCode::CREATED, Extension(note(&name)), Json(out)))
}

/// Every pool.
#[utoipa::path(get, path = "/v1/pools", tag = "pools",
    responses((status = 200, body = Vec<PoolInfo>), (status = "4XX", body = ErrorBody, description = "unauthorized")))]
pub async fn list(
    State(st): State<AppState>,
    State(pools): State<Arc<Pools>>,
) -> ApiResult<Json<Vec<PoolInfo>>> {
    let out = st
        .blocking(move |_, st| {
            let defs = st.db().pools()?;
            defs.into_iter().map(|d| info(st, &pools, d)).collect()
        })
        .await?;
    Ok(Json(out))
}

fn missing(name: &str) -> ApiError {
    ApiError::not_found(format!("pool {name:?} does not exist; GET /v1/pools lists them"))
}

fn find(st: &AppState, name: &str) -> ApiResult<PoolDef> {
    st.db().pool(name)?.ok_or_else(|| missing(name))
}

/// One pool.
#[utoipa::path(get, path = "/v1/pools/{pool}", tag = "pools", params(("pool" = String, Path, description = "pool name")),
    responses((status = 200, body = PoolInfo), (status = "4XX", body = ErrorBody, description = "bad name or not found")))]
pub async fn get(
    State(st): State<AppState>,
    State(pools): State<Arc<Pools>>,
    Path(name): Path<String>,
) -> ApiResult<Json<PoolInfo>> {
    let name = pool_name(&name)?;
    Ok(Json(st.blocking(move |_, st| info(st, &pools, find(st, &name)?)).await?))
}

/// Deletes a pool and destroys its ready sandboxes (claimed ones are the claimers' and stay).
#[utoipa::path(delete, path = "/v1/pools/{pool}", tag = "pools", params(("pool" = String, Path, description = "pool name")),
    responses((status = 204, description = "deleted"), (status = "4XX", body = ErrorBody, description = "bad name or not found")))]
pub async fn delete(
    State(st): State<AppState>,
    State(pools): State<Arc<Pools>>,
    Path(name): Path<String>,
) -> ApiResult<(StatusCode, Extension<AuditNote>)> {
    let name = pool_name(&name)?;
    let n = note(&name);
    st.blocking(move |engine, st| {
        let members = {
            let db = st.db();
            let members = db.members(&name)?;
            if !db.pool_delete(&name)? {
                return Err(missing(&name));
            }
            members
        };
        pool::destroy_members(engine, st, &members);
        pools.forget(&name);
        Ok(())
    })
    .await?;
    Ok((StatusCode::NO_CONTENT, Extension(n)))
}

/// Changes a pool's size or idle age. Shrinking destroys the oldest ready sandboxes beyond the
/// new size at once (claimed ones are the claimers' and stay); growing starts a refill. The
/// change is kept in the service database, so it outlives a restart.
#[utoipa::path(patch, path = "/v1/pools/{pool}", tag = "pools", params(("pool" = String, Path, description = "pool name")),
    request_body = UpdatePool,
    responses((status = 200, body = PoolInfo, description = "changed; ready sandboxes beyond a smaller size are gone"),
              (status = "4XX", body = ErrorBody, description = "bad size or idle age (nothing changed), or no such pool")))]
pub async fn update(
    State(st): State<AppState>,
    State(pools): State<Arc<Pools>>,
    Path(name): Path<String>,
    ApiJson(req): ApiJson<UpdatePool>,
) -> ApiResult<(StatusCode, Extension<AuditNote>, Json<PoolInfo>)> {
    let name = pool_name(&name)?;
    if req.size.is_none() && req.max_idle.is_none() {
        return Err(ApiError::invalid("name what to change: size, max_idle or both"));
    }
    let size = req.size.map(|s| check_size(&st, s)).transpose()?;
    let max_idle = req.max_idle.map(max_idle_ms).transpose()?;
    let n = AuditNote {
        detail: Some(format!("pool {name}: size {size:?}, max_idle_ms {max_idle:?}")),
        ..Default::default()
    };
    let p = pools.clone();
    let out = st
        .blocking(move |engine, st| {
            if !st.db().pool_update(&name, size, max_idle)? {
                return Err(missing(&name));
            }
            let def = find(st, &name)?;
            pool::prune(engine, st, &p, &def, &pool::liveness(engine)?)?;
            info(st, &p, def)
        })
        .await?;
    pools.wake();
    Ok((StatusCode::OK, Extension(n), Json(out)))
}

fn files(req: Option<Vec<ClaimFile>>) -> ApiResult<Vec<FileData>> {
    let req = req.unwrap_or_default();
    if req.len() > MAX_CLAIM_FILES {
        return Err(ApiError::invalid(format!(
            "the claim names {} files; at most {MAX_CLAIM_FILES} are allowed (upload more with PUT /v1/sandboxes/{{id}}/files)",
            req.len()
        )));
    }
    req.into_iter()
        .map(|f| {
            let path = sandbox_path(&f.path)?;
            let data = match f.encoding.unwrap_or(FileEncoding::Utf8) {
                FileEncoding::Utf8 => f.content.into_bytes(),
                FileEncoding::Base64 => {
                    base64::engine::general_purpose::STANDARD.decode(f.content.as_bytes()).map_err(|e| {
                        ApiError::invalid(format!("the content of {path} is not valid base64: {e}"))
                    })?
                }
            };
            if f.mode.is_some_and(|m| m > 0o7777) {
                return Err(ApiError::invalid(format!("the mode of {path} must be at most 0o7777 (4095)")));
            }
            Ok(FileData { path, data, mode: f.mode })
        })
        .collect()
}

/// Claims a ready sandbox from a pool, after giving it a fresh identity (machine-id, clock,
/// entropy) and the claim's files, environment and metadata. An empty pool is waited on up to
/// `wait` seconds (then 503 `pool_empty`), or with `allow_cold` a sandbox is started from the
/// pool's snapshot and the result says `"source": "cold"`.
#[utoipa::path(post, path = "/v1/pools/{pool}/claim", tag = "pools", params(("pool" = String, Path, description = "pool name")),
    request_body = ClaimRequest,
    responses((status = 201, body = Claimed, description = "the claimed sandbox, now the caller's"),
              (status = "4XX", body = ErrorBody, description = "bad request, or no such pool"),
              (status = 503, body = ErrorBody, description = "pool_empty: nothing ready within the wait; or at capacity")))]
pub async fn claim(
    State(st): State<AppState>,
    State(pools): State<Arc<Pools>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    ApiJson(req): ApiJson<ClaimRequest>,
) -> ApiResult<(StatusCode, Extension<AuditNote>, Json<Claimed>)> {
    let name = pool_name(&name)?;
    let meta = client_meta(&st, caller, req.timeout, req.on_timeout, req.metadata, req.envs)?;
    // The wait must end before the request's own time limit, so the client gets `pool_empty`.
    let max_wait = st.cfg.request_timeout.as_secs().saturating_sub(30).max(1);
    let wait = match req.wait {
        Some(0.0) => Duration::ZERO,
        Some(w) => seconds("wait", w, max_wait)?,
        None => Duration::from_secs_f64(DEFAULT_WAIT_S.min(max_wait as f64)),
    };
    let spec = ClaimSpec {
        pool: name.clone(),
        meta,
        files: files(req.files)?,
        wait,
        allow_cold: req.allow_cold.unwrap_or(false),
    };
    let out = crate::pool::claim::claim(&st, &pools, spec).await?;
    let n = AuditNote {
        sandbox: Some(out.sandbox.id.clone()),
        parent: out.sandbox.parent_snapshot.clone(),
        detail: Some(format!("pool {name}, source {:?}", out.source).to_lowercase()),
        ..Default::default()
    };
    Ok((StatusCode::CREATED, Extension(n), Json(out)))
}
