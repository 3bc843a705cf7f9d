//! Shared state of the running service, below every surface: configuration, tokens, a pool of
//! engines, the service database, admission (the sandbox cap), metrics and the bounds of
//! long-lived streams. What only one part of the service needs (warm pools' run-time state,
//! the diff cache, E2B's terminals, watchers and uploads) is that part's own state, beside
//! this one (axum substates: `crate::api::ApiState`, `crate::e2b::E2bState`).
//!
//! An `Engine` holds a SQLite connection, which may move between threads but not be shared, so
//! engine work runs on the blocking pool with an engine taken from a small pool (opening one
//! per request would work too; reuse saves the open).

use crate::auth::Tokens;
use crate::config::ServiceConfig;
use crate::db::ServiceDb;
use crate::error::{ApiError, ApiResult};
use crate::metrics::Metrics;
use axum::http::StatusCode;
use branchbox_core::Engine;
use branchbox_model::{AgentConn, SandboxId, SandboxState};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Shared state, cheap to clone.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

/// What [`AppState`] holds.
pub struct Inner {
    /// Settings.
    pub cfg: ServiceConfig,
    /// Accepted tokens; `None` when authentication is off.
    pub tokens: Option<Tokens>,
    /// Metrics.
    pub metrics: Metrics,
    /// Long-lived streams: their bounds, and the signal that ends them when the service stops.
    pub streams: crate::streams::Streams,
    engines: Mutex<Vec<Engine>>,
    db: Mutex<ServiceDb>,
    /// Sandboxes admitted but not yet recorded by the engine.
    pending: Mutex<usize>,
    /// One lock per sandbox for operations that change its runtime (pause, resume, snapshot,
    /// fork, rollback, kill): the backend swaps containers during some of them, and two at once
    /// on one sandbox would race each other.
    sandbox_locks: Mutex<HashMap<String, Arc<Mutex<()>>>>,
}

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Capacity held for sandboxes being created; released when dropped (by then the engine has
/// recorded them, or they failed).
pub struct Reservation {
    state: AppState,
    n: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut p = lock(&self.state.pending);
        *p = p.saturating_sub(self.n);
    }
}

impl AppState {
    /// Opens the service's database and checks the engine's data directory.
    pub fn open(cfg: ServiceConfig, tokens: Option<Tokens>) -> anyhow::Result<AppState> {
        let dir = cfg.service_dir();
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(&dir)?;
        let db = ServiceDb::open(&dir.join("service.db"))?;
        db.pool_schema()?;
        let engine = Engine::open(cfg.engine.clone())?;
        Ok(AppState(Arc::new(Inner {
            cfg,
            tokens,
            metrics: Metrics::default(),
            streams: Default::default(),
            engines: Mutex::new(vec![engine]),
            db: Mutex::new(db),
            pending: Mutex::new(0),
            sandbox_locks: Mutex::new(HashMap::new()),
        })))
    }

    /// The service database, locked.
    pub fn db(&self) -> MutexGuard<'_, ServiceDb> {
        lock(&self.db)
    }

    fn take_engine(&self) -> ApiResult<Engine> {
        if let Some(e) = lock(&self.engines).pop() {
            return Ok(e);
        }
        Ok(Engine::open(self.cfg.engine.clone())?)
    }

    fn put_engine(&self, e: Engine) {
        let mut pool = lock(&self.engines);
        // Enough for steady load; a burst opens more and the extra ones are simply dropped.
        if pool.len() < 16 {
            pool.push(e);
        }
    }

    /// Runs `f` with an engine on the blocking pool.
    pub async fn blocking<T, F>(&self, f: F) -> ApiResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Engine, &AppState) -> ApiResult<T> + Send + 'static,
    {
        let st = self.clone();
        tokio::task::spawn_blocking(move || {
            let engine = st.take_engine()?;
            let r = f(&engine, &st);
            st.put_engine(engine);
            r
        })
        .await
        .map_err(|e| ApiError::internal(format!("a worker failed: {e}; the request was not completed")))?
    }

    /// Connects to a sandbox's agent with a stall limit: a read or write on the connection that
    /// waits longer than the service's `agent_stall` plus `beyond` (the time the call itself
    /// may legitimately take, such as a command's timeout) fails, so a guest that stops
    /// answering frees the worker thread instead of holding it after the client got its 504.
    pub fn agent(&self, engine: &Engine, id: &SandboxId, beyond: Duration) -> ApiResult<AgentConn> {
        let mut conn = engine.connect(id)?;
        let stall = Some(self.cfg.agent_stall + beyond);
        conn.set_wait(stall);
        conn.stream_mut()
            .set_write_timeout(stall)
            .map_err(|e| ApiError::internal(format!("cannot bound the agent connection: {e}")))?;
        Ok(conn)
    }

    /// Runs `f` while holding the sandbox's runtime lock (see `sandbox_locks`).
    pub fn exclusive<T>(&self, id: &SandboxId, f: impl FnOnce() -> ApiResult<T>) -> ApiResult<T> {
        let lock = lock(&self.sandbox_locks).entry(id.to_string()).or_default().clone();
        let _held = lock.lock().unwrap_or_else(|p| p.into_inner());
        f()
    }

    /// Forgets the runtime lock of a sandbox that is gone.
    pub fn forget(&self, id: &SandboxId) {
        lock(&self.sandbox_locks).remove(id.as_str());
    }

    /// Admits `n` new sandboxes or answers 503 when that would pass the cap. Counts what the
    /// engine records (running or paused; lost ones hold nothing) plus admissions in flight.
    pub fn reserve(&self, engine: &Engine, n: usize) -> ApiResult<Reservation> {
        let mut pending = lock(&self.pending);
        let live = engine.list()?.iter().filter(|v| v.sandbox.state != SandboxState::Lost).count();
        let max = self.cfg.max_sandboxes;
        if live + *pending + n > max {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "at_capacity",
                format!(
                    "the service runs {} of at most {max} sandboxes and cannot start {n} more; kill some \
                     (DELETE /v1/sandboxes/{{id}}) or retry later",
                    live + *pending
                ),
            ));
        }
        *pending += n;
        Ok(Reservation { state: self.clone(), n })
    }
}
