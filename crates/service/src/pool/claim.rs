//! Claiming a sandbox from a pool: take the oldest ready one, wake it (resume when paused),
//! give it a fresh identity through the agent's after-fork hook (a member restored long ago
//! would otherwise keep a stale clock, and its entropy pool must not match its siblings'),
//! then the claim's files, environment and metadata.
//!
//! A claim never cold-starts silently: an empty pool is waited on until the claim's deadline,
//! and a sandbox is started from the pool's snapshot only when the caller allows it, which the
//! result says (`source: cold`).

use super::{start, PoolDef, Pools};
use crate::db::SandboxMeta;
use crate::error::{ApiError, ApiResult};
use crate::ops::types::SandboxInfo;
use crate::state::AppState;
use axum::http::StatusCode;
use branchbox_core::Engine;
use branchbox_model::{now_ms, SandboxId, SandboxState};
use branchbox_protocol::{ClientError, HookReport, StepOutcome};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use utoipa::ToSchema;

/// Where a claimed sandbox came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClaimSource {
    /// A ready sandbox of the pool.
    Pool,
    /// Started from the pool's snapshot at claim time, because the pool was empty and the
    /// caller allowed it (`allow_cold`).
    Cold,
}

/// What a claim applies to the sandbox it hands out.
#[derive(Debug, Clone)]
pub struct ClaimSpec {
    /// The pool.
    pub pool: String,
    /// The service record the sandbox gets (its expiry is set when it is handed out).
    pub meta: SandboxMeta,
    /// Files written before it is handed out.
    pub files: Vec<FileData>,
    /// How long to wait for a ready sandbox when the pool is empty.
    pub wait: Duration,
    /// Start one from the pool's snapshot when none is ready (instead of waiting).
    pub allow_cold: bool,
}

/// A file a claim writes.
#[derive(Debug, Clone)]
pub struct FileData {
    /// Absolute path in the sandbox.
    pub path: String,
    /// Content.
    pub data: Vec<u8>,
    /// Permission bits.
    pub mode: Option<u32>,
}

/// A claimed sandbox.
#[derive(Debug, Serialize, ToSchema)]
pub struct Claimed {
    /// The sandbox, now the caller's.
    pub sandbox: SandboxInfo,
    /// `pool`: a ready sandbox; `cold`: started at claim time (only with `allow_cold`).
    pub source: ClaimSource,
    /// The pool.
    pub pool: String,
    /// Time spent waiting for the pool to hold a ready sandbox, ms.
    pub waited_ms: u64,
    /// What the after-fork hook did at claim time, per step (`entropy`, `clock`, `hostname`,
    /// `machine_id`): `applied`, or `unsupported: why` / `failed: why`.
    pub identity: BTreeMap<String, String>,
}

fn step(o: &StepOutcome) -> String {
    match o {
        StepOutcome::Applied => "applied".into(),
        StepOutcome::Unsupported(why) => format!("unsupported: {why}"),
        StepOutcome::Failed(why) => format!("failed: {why}"),
    }
}

fn identity(h: &HookReport) -> BTreeMap<String, String> {
    [("entropy", &h.entropy), ("clock", &h.clock), ("hostname", &h.hostname), ("machine_id", &h.machine_id)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), step(v)))
        .collect()
}

/// The hostname the engine gives a sandbox at restore (`bb-` and 8 digits of its id), given
/// again at claim so the hook keeps it.
fn hostname(id: &SandboxId) -> String {
    format!("bb-{}", id.as_str().get(4..12).unwrap_or("sandbox"))
}

/// Runs the after-fork hook in a running sandbox: new machine-id, host clock, fresh entropy.
fn refresh_identity(engine: &Engine, st: &AppState, id: &SandboxId) -> ApiResult<HookReport> {
    let mut conn = st.agent(engine, id, Duration::ZERO)?;
    conn.after_fork(id.as_str(), &hostname(id)).map_err(|e| match e {
        ClientError::Unexpected(_) | ClientError::Entropy(_) => {
            ApiError::internal(format!("sandbox {id}'s after-fork hook failed: {e}; it was not handed out"))
        }
        e => e.into(),
    })
}

/// Why preparing a sandbox failed: the sandbox itself (try another), or the claim (stop).
enum Failure {
    Sandbox(ApiError),
    Claim(ApiError),
}

/// Wakes a sandbox for its claimer and applies the claim; the sandbox is destroyed on failure.
fn hand_out(engine: &Engine, st: &AppState, id: &SandboxId, spec: &ClaimSpec) -> Result<Claimed, Failure> {
    let woken = st
        .exclusive(id, || {
            if engine.sandbox(id)?.state == SandboxState::Paused {
                engine.resume(id)?;
            }
            Ok(())
        })
        .and_then(|()| refresh_identity(engine, st, id));
    let applied = woken.map_err(Failure::Sandbox).and_then(|hook| {
        let mut conn = st.agent(engine, id, Duration::ZERO).map_err(Failure::Sandbox)?;
        for FileData { path, data, mode } in &spec.files {
            conn.write_file(path, &mut data.as_slice(), *mode, false, true).map_err(|e| {
                let e = ApiError::from(e);
                let message = format!("writing {path} into the claimed sandbox failed: {}", e.message);
                Failure::Claim(ApiError { message, ..e })
            })?;
        }
        let meta = SandboxMeta { expires_ms: Some(now_ms() + spec.meta.timeout_ms), ..spec.meta.clone() };
        st.db().put(id, &meta).map_err(|e| Failure::Claim(e.into()))?;
        let s = engine.sandbox(id).map_err(|e| Failure::Sandbox(e.into()))?;
        Ok(Claimed {
            sandbox: SandboxInfo::new(&s, true, Some(meta)),
            source: ClaimSource::Pool,
            pool: spec.pool.clone(),
            waited_ms: 0,
            identity: identity(&hook),
        })
    });
    if applied.is_err() {
        let _ = st.exclusive(id, || Ok(engine.kill(id)));
        st.forget(id);
        let _ = st.db().remove(id.as_str());
    }
    applied
}

fn pool_def(st: &AppState, name: &str) -> ApiResult<PoolDef> {
    st.db()
        .pool(name)?
        .ok_or_else(|| ApiError::not_found(format!("pool {name:?} does not exist; GET /v1/pools lists them")))
}

/// Takes ready members until one is handed out; `None` when the pool has none ready.
fn from_pool(engine: &Engine, st: &AppState, pools: &Pools, spec: &ClaimSpec) -> ApiResult<Option<Claimed>> {
    pool_def(st, &spec.pool)?;
    loop {
        let Some(m) = st.db().member_take(&spec.pool)? else { return Ok(None) };
        pools.wake();
        let Ok(id) = SandboxId::parse(&m.id) else { continue };
        match hand_out(engine, st, &id, spec) {
            Ok(c) => {
                pools.with(&spec.pool, |s| s.claims_pool += 1);
                return Ok(Some(c));
            }
            Err(Failure::Claim(e)) => return Err(e),
            Err(Failure::Sandbox(e)) => {
                tracing::warn!(
                    "pooled sandbox {id} of {} could not be handed out ({e}); trying the next",
                    spec.pool
                );
                pools.with(&spec.pool, |s| s.discarded += 1);
            }
        }
    }
}

/// Starts a sandbox from the pool's snapshot at claim time.
fn cold(engine: &Engine, st: &AppState, pools: &Pools, spec: &ClaimSpec) -> ApiResult<Claimed> {
    let def = pool_def(st, &spec.pool)?;
    let id = {
        let _held = st.reserve(engine, 1)?;
        start(engine, &def)?
    };
    let c = hand_out(engine, st, &id, spec).map_err(|f| match f {
        Failure::Sandbox(e) | Failure::Claim(e) => e,
    })?;
    pools.with(&spec.pool, |s| s.claims_cold += 1);
    Ok(Claimed { source: ClaimSource::Cold, ..c })
}

/// Claims a sandbox from a pool (see the module's description).
pub async fn claim(st: &AppState, pools: &Arc<Pools>, spec: ClaimSpec) -> ApiResult<Claimed> {
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + spec.wait;
    let spec = Arc::new(spec);
    loop {
        // Registered before looking, so a refill that lands in between still wakes us.
        let notified = pools.ready.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let (s, p) = (spec.clone(), pools.clone());
        if let Some(c) = st.blocking(move |engine, st| from_pool(engine, st, &p, &s)).await? {
            return Ok(Claimed { waited_ms: started.elapsed().as_millis() as u64, ..c });
        }
        if spec.allow_cold {
            let (s, p) = (spec.clone(), pools.clone());
            let c = st.blocking(move |engine, st| cold(engine, st, &p, &s)).await?;
            return Ok(Claimed { waited_ms: 0, ..c });
        }
        if tokio::time::Instant::now() >= deadline {
            let stats = pools.stats(&spec.pool);
            let why = stats.last_error.map(|e| format!("; its last refill failed: {e}")).unwrap_or_default();
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "pool_empty",
                format!(
                    "pool {:?} had no ready sandbox within the claim's wait of {} s{why}; wait longer \
                     (\"wait\"), make the pool bigger, or allow a cold start (\"allow_cold\": true)",
                    spec.pool,
                    spec.wait.as_secs_f64()
                ),
            ));
        }
        tokio::select! {
            () = notified => {}
            () = tokio::time::sleep_until(deadline) => {}
            // A backstop: members also appear through restarts and adoption.
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}
