//! E2B's sandbox metrics (`Sandbox.get_metrics`, `GET /sandboxes/{id}/metrics`), measured from
//! the host cgroups runsc runs a sandbox's runtime in (cgroup v1, `/branchbox/<id>-g<N>` for
//! generation N: each restore or rollback in place starts a new one). The answer is one point,
//! now: CPU over a short window, memory as the cgroup counts it; branchboxd keeps no history,
//! so an interval that ends before now (or starts after it) has no points, as does a paused
//! sandbox (its runtime is gone) and a sandbox whose runtime has no such cgroups (the microvm
//! backend, a cgroup v2 host): E2B answers an empty list where it has no figures either.
//! `GET /sandboxes/metrics?sandbox_ids=a,b` answers the point of now of each sandbox named,
//! all measured over one window; a sandbox with no figures (unknown, paused, without such
//! cgroups) is left out of its map.

use super::{network::e2b_id, pb::Timestamp, E2bError};
use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::{Path, RawQuery, State};
use axum::routing::get;
use axum::{Json, Router};
use branchbox_model::{SandboxId, SandboxState};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path as FsPath, PathBuf};
use std::time::{Duration, Instant};

type E2bResult<T> = Result<T, E2bError>;

/// Where the cgroup v1 controllers are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// How long the CPU is watched for one point.
const WINDOW: Duration = Duration::from_millis(250);

/// Most sandboxes one batch names (E2B's bound).
const MAX_BATCH: usize = 100;

/// The routes under [`super::PREFIX`] this module serves.
pub fn routes() -> Router<AppState> {
    Router::new().route("/sandboxes/{id}/metrics", get(metrics)).route("/sandboxes/metrics", get(batch))
}

/// E2B's `SandboxMetric`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct E2bMetric {
    timestamp: String,
    timestamp_unix: i64,
    cpu_count: u32,
    cpu_used_pct: f64,
    mem_used: u64,
    mem_total: u64,
    mem_cache: u64,
    disk_used: u64,
    disk_total: u64,
}

/// E2B's `SandboxesWithMetrics`: each measured sandbox's point of now, by id.
#[derive(Debug, Serialize)]
struct Batch {
    sandboxes: BTreeMap<String, E2bMetric>,
}

/// The query: the interval asked for, Unix seconds (both optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Interval {
    start: Option<i64>,
    end: Option<i64>,
}

impl Interval {
    fn parse(query: Option<&str>) -> E2bResult<Interval> {
        let q: Interval = serde_urlencoded::from_str(query.unwrap_or_default()).map_err(|e| {
            E2bError(ApiError::bad_request("bad_query", format!("the metrics query does not parse: {e}")))
        })?;
        if let (Some(s), Some(e)) = (q.start, q.end) {
            if s > e {
                return Err(E2bError(ApiError::bad_request(
                    "bad_query",
                    format!("start {s} is after end {e}"),
                )));
            }
        }
        Ok(q)
    }

    /// Whether a point taken at `now_s` lies in the interval; `end` is taken to the second the
    /// client's clock rounded it down to, so one second of lag is allowed.
    fn holds(&self, now_s: i64) -> bool {
        self.start.is_none_or(|s| s <= now_s) && self.end.is_none_or(|e| e.saturating_add(1) >= now_s)
    }
}

/// One look at a runtime generation's cgroups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Look {
    /// CPU time its tasks used, nanoseconds (`cpuacct.usage`).
    cpu_ns: u64,
    /// Memory it is charged for, bytes (`memory.usage_in_bytes`).
    memory: u64,
    /// Of that, the host's page cache of files (`cache` less `shmem`: gVisor keeps the guest's
    /// memory, files written inside included, in shared memory, which the host counts as cache).
    file_cache: u64,
}

/// The cgroup name of sandbox `id`'s newest runtime generation.
fn generation(root: &FsPath, id: &str) -> Option<String> {
    let prefix = format!("{id}-g");
    std::fs::read_dir(root.join("memory/branchbox"))
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let g: u32 = name.strip_prefix(&prefix)?.parse().ok()?;
            Some((g, name))
        })
        .max()
        .map(|(_, name)| name)
}

/// The counter `key` of a cgroup file of `key value` lines.
fn counter(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

fn look(root: &FsPath, cid: &str) -> Option<Look> {
    let file = |controller: &str, name: &str| -> PathBuf {
        root.join(controller).join("branchbox").join(cid).join(name)
    };
    let number = |p: PathBuf| std::fs::read_to_string(p).ok()?.trim().parse::<u64>().ok();
    let cpu_ns = number(file("cpuacct", "cpuacct.usage"))?;
    let memory = number(file("memory", "memory.usage_in_bytes"))?;
    let stat = std::fs::read_to_string(file("memory", "memory.stat")).ok()?;
    let cache = counter(&stat, "cache")?;
    let shmem = counter(&stat, "shmem").unwrap_or(0);
    Some(Look { cpu_ns, memory, file_cache: cache.saturating_sub(shmem) })
}

/// Looks at each sandbox's newest generation now: its name, when, and what it showed.
async fn look_now(ids: Vec<String>) -> Vec<Option<(String, Instant, Look)>> {
    let n = ids.len();
    tokio::task::spawn_blocking(move || {
        let root = FsPath::new(CGROUP_ROOT);
        ids.iter()
            .map(|id| {
                let cid = generation(root, id)?;
                let l = look(root, &cid)?;
                Some((cid, Instant::now(), l))
            })
            .collect()
    })
    .await
    .unwrap_or_else(|_| vec![None; n])
}

/// What a sandbox's point is measured for: its id and its limits.
struct Measured {
    id: String,
    cpus: u32,
    memory_mib: u64,
}

impl Measured {
    fn of(s: &branchbox_model::Sandbox) -> Measured {
        Measured { id: s.id.to_string(), cpus: s.limits.cpus, memory_mib: s.limits.memory_mib }
    }
}

/// The point of now of each sandbox, all watched over one window; `None` for one with no
/// runtime to measure, or whose generation changed in between (a rollback).
async fn points(sandboxes: &[Measured]) -> Vec<Option<E2bMetric>> {
    let ids: Vec<String> = sandboxes.iter().map(|s| s.id.clone()).collect();
    let before = look_now(ids.clone()).await;
    if before.iter().all(Option::is_none) {
        return before.into_iter().map(|_| None).collect();
    }
    tokio::time::sleep(WINDOW).await;
    let after = look_now(ids).await;
    let now_ms = branchbox_model::now_ms();
    sandboxes
        .iter()
        .zip(before.into_iter().zip(after))
        .map(|(s, pair)| {
            let (Some((cid, t0, before)), Some((cid1, t1, after))) = pair else { return None };
            (cid == cid1).then(|| E2bMetric {
                timestamp: Timestamp::from_ns(now_ms.saturating_mul(1_000_000)).rfc3339(),
                timestamp_unix: now_ms / 1000,
                cpu_count: s.cpus,
                cpu_used_pct: cpu_percent(&before, &after, t1.duration_since(t0), s.cpus),
                mem_used: after.memory.saturating_sub(after.file_cache),
                mem_total: s.memory_mib.saturating_mul(1 << 20),
                mem_cache: after.file_cache,
                // The root file system lives in memory (gVisor's overlay): what is written
                // there is in mem_used, and there is no disk of its own to report.
                disk_used: 0,
                disk_total: 0,
            })
        })
        .collect()
}

/// The share of `cpus` CPUs used between two looks, in percent: at most 100, the runtime's
/// CPU quota (short windows can show a little more).
fn cpu_percent(before: &Look, after: &Look, elapsed: Duration, cpus: u32) -> f64 {
    let wall_ns = elapsed.as_nanos() as f64 * f64::from(cpus.max(1));
    if wall_ns <= 0.0 {
        return 0.0;
    }
    let used = after.cpu_ns.saturating_sub(before.cpu_ns) as f64;
    ((used / wall_ns * 100.0).min(100.0) * 100.0).round() / 100.0
}

/// `GET /sandboxes/{id}/metrics`: the sandbox's figures now, as one point (none outside the
/// interval asked for, or with no runtime to measure); 404 for a sandbox that does not exist.
async fn metrics(
    State(st): State<AppState>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> E2bResult<Json<Vec<E2bMetric>>> {
    let interval = Interval::parse(query.as_deref())?;
    let sid = e2b_id(&id)?;
    let sandbox = st.blocking(move |engine, _| Ok(engine.sandbox(&sid)?)).await?;
    if sandbox.state != SandboxState::Running || !interval.holds(branchbox_model::now_ms() / 1000) {
        return Ok(Json(Vec::new()));
    }
    Ok(Json(points(&[Measured::of(&sandbox)]).await.into_iter().flatten().collect()))
}

/// The sandboxes a batch names: `sandbox_ids`, comma-separated or repeated, at most
/// [`MAX_BATCH`], each shaped like a sandbox id (a 400 names the one that is not).
fn batch_ids(query: Option<&str>) -> E2bResult<Vec<SandboxId>> {
    let bad = |why: String| E2bError(ApiError::bad_request("bad_query", why));
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query.unwrap_or_default())
        .map_err(|e| bad(format!("the metrics query does not parse: {e}")))?;
    let mut given = Vec::new();
    for (key, value) in &pairs {
        if key != "sandbox_ids" {
            let key: String = key.chars().take(64).collect();
            return Err(bad(format!("{key:?} is not a parameter here; give sandbox_ids")));
        }
        given.extend(value.split(',').map(str::trim).filter(|v| !v.is_empty()));
    }
    if given.is_empty() {
        return Err(bad("give sandbox_ids: the sandboxes to measure, comma-separated".into()));
    }
    if given.len() > MAX_BATCH {
        return Err(bad(format!("at most {MAX_BATCH} sandbox_ids; {} were given", given.len())));
    }
    let mut ids: Vec<SandboxId> = Vec::with_capacity(given.len());
    for v in given {
        let id = SandboxId::parse(v).map_err(|_| {
            let v: String = v.chars().take(64).collect();
            bad(format!("sandbox_ids: {v:?} is not a sandbox id"))
        })?;
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    Ok(ids)
}

/// `GET /sandboxes/metrics?sandbox_ids=...`: the point of now of each sandbox named that has
/// one; those that do not exist, are paused or have no runtime to measure are left out.
async fn batch(State(st): State<AppState>, RawQuery(query): RawQuery) -> E2bResult<Json<Batch>> {
    let ids = batch_ids(query.as_deref())?;
    let running = st
        .blocking(move |engine, _| {
            let mut out = Vec::new();
            for id in &ids {
                match engine.sandbox(id) {
                    Ok(s) if s.state == SandboxState::Running => out.push(Measured::of(&s)),
                    Ok(_) | Err(branchbox_model::Error::NotFound { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(out)
        })
        .await?;
    let points = points(&running).await;
    let sandboxes = running.into_iter().zip(points).filter_map(|(s, p)| Some((s.id, p?))).collect();
    Ok(Json(Batch { sandboxes }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cgroup(root: &FsPath, cid: &str, cpu_ns: u64, memory: u64, stat: &str) {
        let mem = root.join("memory/branchbox").join(cid);
        let cpu = root.join("cpuacct/branchbox").join(cid);
        std::fs::create_dir_all(&mem).unwrap();
        std::fs::create_dir_all(&cpu).unwrap();
        std::fs::write(cpu.join("cpuacct.usage"), format!("{cpu_ns}\n")).unwrap();
        std::fs::write(mem.join("memory.usage_in_bytes"), format!("{memory}\n")).unwrap();
        std::fs::write(mem.join("memory.stat"), stat).unwrap();
    }

    #[test]
    fn the_newest_generation_is_read_and_its_file_cache_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let id = "sbx-0123456789abcdef";
        cgroup(dir.path(), &format!("{id}-g2"), 1, 1, "cache 0\n");
        cgroup(
            dir.path(),
            &format!("{id}-g10"),
            5_000,
            300 << 20,
            "cache 200000000\nrss 100\nshmem 150000000\n",
        );
        cgroup(dir.path(), "sbx-0123456789abcdef0-g99", 1, 1, "cache 0\n");
        std::fs::create_dir_all(dir.path().join(format!("memory/branchbox/{id}-dns"))).unwrap();
        let cid = generation(dir.path(), id).unwrap();
        assert_eq!(cid, format!("{id}-g10"), "by number, not by name");
        let l = look(dir.path(), &cid).unwrap();
        assert_eq!(l, Look { cpu_ns: 5_000, memory: 300 << 20, file_cache: 50_000_000 });
        assert_eq!(generation(dir.path(), "sbx-ffffffffffffffff"), None);
        cgroup(dir.path(), "broken-g1", 1, 1, "rss 5\n");
        assert_eq!(look(dir.path(), "broken-g1"), None, "a memory.stat without cache is no figure");
    }

    #[test]
    fn cpu_is_a_share_of_the_sandboxs_cpus_capped_at_its_quota() {
        let at = |cpu_ns| Look { cpu_ns, memory: 0, file_cache: 0 };
        let quarter = Duration::from_millis(250);
        assert_eq!(cpu_percent(&at(0), &at(125_000_000), quarter, 1), 50.0);
        assert_eq!(cpu_percent(&at(0), &at(125_000_000), quarter, 2), 25.0);
        assert_eq!(cpu_percent(&at(0), &at(400_000_000), quarter, 1), 100.0);
        assert_eq!(cpu_percent(&at(9), &at(3), quarter, 1), 0.0, "a counter that went back");
        assert_eq!(cpu_percent(&at(0), &at(1), Duration::ZERO, 1), 0.0);
    }

    #[test]
    fn the_interval_holds_the_point_of_now_or_not() {
        assert!(Interval::parse(None).unwrap().holds(1000));
        let i = Interval::parse(Some("start=900&end=999")).unwrap();
        assert!(i.holds(1000) && !i.holds(1001) && !i.holds(899));
        assert!(Interval::parse(Some("start=5&end=4")).is_err());
        let e = Interval::parse(Some("step=5")).unwrap_err().0.message;
        assert!(e.contains("step"), "{e}");
        assert!(Interval::parse(Some("start=soon")).is_err());
    }

    #[test]
    fn a_batch_names_at_most_its_bound_of_well_shaped_ids() {
        let (a, b) = ("sbx-0123456789abcdef", "sbx-fedcba9876543210");
        let ids = batch_ids(Some(&format!("sandbox_ids={a}%2C{b}&sandbox_ids={a}"))).unwrap();
        assert_eq!(
            ids.iter().map(SandboxId::as_str).collect::<Vec<_>>(),
            [a, b],
            "split, repeated, deduplicated"
        );
        let err = |q: &str| batch_ids(Some(q)).unwrap_err().0;
        let e = err(&format!("sandbox_ids={a},nope"));
        assert!(
            e.status == axum::http::StatusCode::BAD_REQUEST && e.message.contains("\"nope\""),
            "{}",
            e.message
        );
        assert!(err("").message.contains("give sandbox_ids"));
        assert!(err("sandbox_ids=").message.contains("give sandbox_ids"));
        assert!(err(&format!("ids={a}")).message.contains("\"ids\""));
        let many: Vec<String> = (0..=MAX_BATCH).map(|i| format!("sbx-{i:016x}")).collect();
        let e = err(&format!("sandbox_ids={}", many.join(",")));
        assert!(e.message.contains("at most 100 sandbox_ids; 101"), "{}", e.message);
        assert_eq!(
            batch_ids(Some(&format!("sandbox_ids={}", many[..MAX_BATCH].join(",")))).unwrap().len(),
            MAX_BATCH
        );
    }
}
