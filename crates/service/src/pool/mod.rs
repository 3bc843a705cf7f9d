//! Warm pools: N ready sandboxes restored from a snapshot, kept paused or running idle, and
//! refilled in the background by the service, so that a claim hands one out in milliseconds
//! instead of restoring (or creating) one. `docs/pools.md` describes them.
//!
//! Definitions and members live in the service database ([`store`]): after a restart the
//! service re-adopts the members still alive and refills the rest. Pooled sandboxes are engine
//! sandboxes without a service record; the sandbox list hides them until they are claimed.

pub mod claim;
pub mod store;

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use branchbox_core::Engine;
use branchbox_model::{now_ms, SandboxId};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
pub use store::{Member, PoolDef};

/// How long a pool whose refill failed waits before it is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(5);
/// How often the refill loop looks at the pools when nothing wakes it (idle ages, deaths).
const REFILL_TICK: Duration = Duration::from_secs(1);

/// Counters and the last refill failure of one pool, since the service started.
#[derive(Debug, Clone, Default)]
pub struct PoolStats {
    /// Claims served from the pool.
    pub claims_pool: u64,
    /// Claims that started a sandbox because the pool was empty (the caller allowed it).
    pub claims_cold: u64,
    /// Sandboxes added by refills.
    pub refills: u64,
    /// Ready sandboxes discarded: past the idle age, or found dead.
    pub discarded: u64,
    /// Why the last refill failed, until one succeeds.
    pub last_error: Option<String>,
    retry_at: Option<Instant>,
}

/// The service's pools at run time: what wakes the refill loop and waiting claims, and counters.
#[derive(Default)]
pub struct Pools {
    wake: tokio::sync::Notify,
    ready: tokio::sync::Notify,
    stats: Mutex<BTreeMap<String, PoolStats>>,
}

impl Pools {
    fn with<T>(&self, pool: &str, f: impl FnOnce(&mut PoolStats) -> T) -> T {
        let mut all = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        f(all.entry(pool.to_string()).or_default())
    }

    /// A pool's counters.
    pub fn stats(&self, pool: &str) -> PoolStats {
        self.with(pool, |s| s.clone())
    }

    /// Forgets a deleted pool's counters.
    pub fn forget(&self, pool: &str) {
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).remove(pool);
    }

    /// Asks the refill loop to look at the pools now (a claim took a member, a pool was added).
    pub fn wake(&self) {
        self.wake.notify_one();
    }
}

/// Starts one sandbox of a pool: restored from its snapshot, or from its template's last
/// successful build (with the template's env, workdir and user for its commands).
pub fn start(engine: &Engine, def: &PoolDef) -> ApiResult<SandboxId> {
    match (&def.snapshot, &def.template) {
        (Some(s), _) => Ok(engine.restore(s)?.sandbox.id),
        (None, Some(t)) => Ok(engine.create_from_template(t)?.sandbox.id),
        (None, None) => Err(ApiError::internal(format!("pool {} names no snapshot", def.name))),
    }
}

/// Destroys a pooled sandbox, unless a claim took it first.
fn discard(engine: &Engine, st: &AppState, id: &str) -> ApiResult<()> {
    if !st.db().member_remove(id)? {
        return Ok(());
    }
    let Ok(sid) = SandboxId::parse(id) else { return Ok(()) };
    match st.exclusive(&sid, || Ok(engine.kill(&sid))) {
        Ok(Ok(())) | Ok(Err(branchbox_model::Error::NotFound { .. })) => {}
        Ok(Err(e)) => tracing::warn!("could not destroy pooled sandbox {id}: {e}"),
        Err(e) => tracing::warn!("could not destroy pooled sandbox {id}: {e}"),
    }
    st.forget(&sid);
    Ok(())
}

/// Destroys every ready sandbox of a deleted pool (its records are gone already).
pub fn destroy_members(engine: &Engine, st: &AppState, members: &[Member]) {
    for m in members {
        let Ok(sid) = SandboxId::parse(&m.id) else { continue };
        if let Err(e) = st.exclusive(&sid, || Ok(engine.kill(&sid))).and_then(|r| Ok(r?)) {
            tracing::warn!("could not destroy pooled sandbox {}: {e}", m.id);
        }
        st.forget(&sid);
    }
}

/// Restores one sandbox for a pool and records it as ready.
fn fill_one(engine: &Engine, st: &AppState, def: &PoolDef) -> ApiResult<()> {
    let id = {
        let _held = st.reserve(engine, 1)?;
        start(engine, def)?
    };
    let paused = if def.paused { st.exclusive(&id, || Ok(engine.pause(&id)?)) } else { Ok(()) };
    let kept = paused.and_then(|()| {
        // Under the database lock, so a pool deleted meanwhile never gets a member back.
        let db = st.db();
        if db.pool(&def.name)?.is_none() {
            return Ok(false);
        }
        db.member_add(&Member { id: id.to_string(), pool: def.name.clone(), ready_ms: now_ms() })?;
        Ok(true)
    });
    if !matches!(kept, Ok(true)) {
        let _ = st.exclusive(&id, || Ok(engine.kill(&id)));
        st.forget(&id);
    }
    kept.map(|_| ())
}

/// Every sandbox's id and whether its runtime is alive.
pub fn liveness(engine: &Engine) -> ApiResult<BTreeMap<String, bool>> {
    Ok(engine.list()?.into_iter().map(|v| (v.sandbox.id.to_string(), v.alive)).collect())
}

/// The members a pool of `size` holds beyond it, from `members` ordered oldest first: the
/// oldest go, so those kept have the most of their idle age left.
fn surplus(members: &[Member], size: u32) -> &[Member] {
    &members[..members.len().saturating_sub(size as usize)]
}

/// Discards a pool's members that died or waited longer than its `max_idle`, then the oldest
/// of those beyond its size (after a shrink); returns how many stay ready. Only members are
/// touched: a claimed sandbox is no longer one, so it is never destroyed here.
pub fn prune(
    engine: &Engine,
    st: &AppState,
    pools: &Pools,
    def: &PoolDef,
    alive: &BTreeMap<String, bool>,
) -> ApiResult<u32> {
    let now = now_ms();
    // Read first: a `for` over `st.db()...` would hold the database lock through the loop,
    // and `discard` takes it again.
    let members = st.db().members(&def.name)?;
    let mut kept = Vec::new();
    for m in members {
        let live = alive.get(&m.id).copied().unwrap_or(false);
        if live && now.saturating_sub(m.ready_ms) <= def.max_idle_ms {
            kept.push(m);
        } else {
            discard(engine, st, &m.id)?;
            pools.with(&def.name, |s| s.discarded += 1);
        }
    }
    let extra = surplus(&kept, def.size);
    for m in extra {
        discard(engine, st, &m.id)?;
    }
    Ok((kept.len() - extra.len()) as u32)
}

/// One pass over every pool: discards members that died, idled too long or stand beyond the
/// pool's size ([`prune`]), and adds at most one sandbox to each pool that is short. Returns true while some pool is still short.
pub fn refill_pass(engine: &Engine, st: &AppState, pools: &Pools) -> ApiResult<bool> {
    let defs = st.db().pools()?;
    if defs.is_empty() {
        return Ok(false);
    }
    let alive = liveness(engine)?;
    let mut short = false;
    for def in defs {
        if pools.with(&def.name, |s| s.retry_at.is_some_and(|t| Instant::now() < t)) {
            continue;
        }
        let ready = prune(engine, st, pools, &def, &alive)?;
        if ready >= def.size {
            continue;
        }
        match fill_one(engine, st, &def) {
            Ok(()) => {
                pools.with(&def.name, |s| {
                    s.refills += 1;
                    s.last_error = None;
                    s.retry_at = None;
                });
                pools.ready.notify_waiters();
                short |= ready + 1 < def.size;
            }
            Err(e) => {
                tracing::warn!("refilling pool {} failed: {e}", def.name);
                pools.with(&def.name, |s| {
                    s.last_error = Some(e.message.clone());
                    s.retry_at = Some(Instant::now() + RETRY_AFTER);
                });
            }
        }
    }
    Ok(short)
}

/// Keeps the pools full, forever: a pass whenever a claim or a new pool wakes it, every
/// [`REFILL_TICK`] otherwise, and pass after pass while a pool is short.
pub async fn run(st: AppState, pools: Arc<Pools>) {
    loop {
        let p = pools.clone();
        match st.blocking(move |engine, st| refill_pass(engine, st, &p)).await {
            Ok(true) => continue,
            Ok(false) => {}
            Err(e) => tracing::warn!("pool refill failed: {e}"),
        }
        tokio::select! {
            () = pools.wake.notified() => {}
            () = tokio::time::sleep(REFILL_TICK) => {}
        }
    }
}

/// At service start: the members recorded before the restart that are still alive stay in
/// their pools (re-adopted); the rest are destroyed and forgotten, and refills replace them.
/// Returns (adopted, dropped).
pub fn adopt(engine: &Engine, st: &AppState) -> ApiResult<(usize, usize)> {
    let alive = liveness(engine)?;
    let pools: Vec<String> = st.db().pools()?.into_iter().map(|p| p.name).collect();
    let (mut adopted, mut dropped) = (0, 0);
    let members: Vec<Member> = {
        let db = st.db();
        let ids = db.member_ids()?;
        let mut all = Vec::new();
        for p in &pools {
            all.extend(db.members(p)?);
        }
        // Members of pools that no longer exist (a crash between the two deletes).
        for id in ids {
            if !all.iter().any(|m| m.id == id) {
                all.push(Member { id, pool: String::new(), ready_ms: 0 });
            }
        }
        all
    };
    for m in members {
        if !m.pool.is_empty() && alive.get(&m.id).copied().unwrap_or(false) {
            adopted += 1;
        } else {
            discard(engine, st, &m.id)?;
            dropped += 1;
        }
    }
    Ok((adopted, dropped))
}

/// Memory a sandbox's runtime uses on the host (its memory cgroups, cgroup v1), bytes; `None`
/// where the host does not show it.
pub fn sandbox_memory(id: &str) -> Option<u64> {
    let root = std::path::Path::new("/sys/fs/cgroup/memory/branchbox");
    let prefix = format!("{id}-g");
    let mut total = None;
    for e in std::fs::read_dir(root).ok()?.flatten() {
        if !e.file_name().to_string_lossy().starts_with(&prefix) {
            continue;
        }
        let used = std::fs::read_to_string(e.path().join("memory.usage_in_bytes"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok());
        if let Some(b) = used {
            total = Some(total.unwrap_or(0) + b);
        }
    }
    total
}

/// The pools' lines of `/metrics`: size, ready members, their memory, and the counters.
pub fn render_metrics(st: &AppState, pools: &Pools) -> ApiResult<String> {
    let mut rows = Vec::new();
    let defs = st.db().pools()?;
    for def in defs {
        let members = st.db().members(&def.name)?;
        let memory: u64 = members.iter().filter_map(|m| sandbox_memory(&m.id)).sum();
        let label = def.name.replace('\\', "\\\\").replace('"', "\\\"");
        rows.push((label, def.size, members.len(), memory, pools.stats(&def.name)));
    }
    type Row = (String, u32, usize, u64, PoolStats);
    // Each family's values for one pool: extra labels and the value.
    type Values = dyn Fn(&Row) -> Vec<(&'static str, u64)>;
    let families: [(&str, &str, &str, &Values); 6] = [
        ("branchbox_pool_size", "gauge", "Ready sandboxes a pool keeps.", &|r| vec![("", u64::from(r.1))]),
        ("branchbox_pool_ready", "gauge", "Ready sandboxes a pool holds now.", &|r| vec![("", r.2 as u64)]),
        (
            "branchbox_pool_memory_bytes",
            "gauge",
            "Host memory of a pool's ready sandboxes (their memory cgroups).",
            &|r| vec![("", r.3)],
        ),
        ("branchbox_pool_claims_total", "counter", "Claims, by where the sandbox came from.", &|r| {
            vec![(",source=\"pool\"", r.4.claims_pool), (",source=\"cold\"", r.4.claims_cold)]
        }),
        ("branchbox_pool_refills_total", "counter", "Sandboxes refills added.", &|r| vec![("", r.4.refills)]),
        (
            "branchbox_pool_discarded_total",
            "counter",
            "Ready sandboxes discarded: idle too long, or dead.",
            &|r| vec![("", r.4.discarded)],
        ),
    ];
    let mut out = String::new();
    for (name, kind, help, values) in families {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for r in &rows {
            for (extra, v) in values(r) {
                let _ = writeln!(out, "{name}{{pool=\"{}\"{extra}}} {v}", r.0);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: i64) -> Vec<Member> {
        (0..n).map(|i| Member { id: format!("sbx-{i}"), pool: "p".into(), ready_ms: i }).collect()
    }

    #[test]
    fn a_shrink_retires_the_oldest_members_beyond_the_size() {
        let all = members(5);
        let ids = |ms: &[Member]| ms.iter().map(|m| m.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(surplus(&all, 2)), ["sbx-0", "sbx-1", "sbx-2"]);
        assert_eq!(ids(surplus(&all, 5)), Vec::<String>::new());
        assert_eq!(ids(surplus(&all, 9)), Vec::<String>::new(), "a grown pool retires nothing");
        assert_eq!(ids(surplus(&[], 1)), Vec::<String>::new());
    }
}
