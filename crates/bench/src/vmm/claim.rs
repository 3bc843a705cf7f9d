//! Claims from a warm pool of paused microVM children (the synthetic guest), the microvm
//! counterpart of branchboxd's gVisor pools (`docs/pools.md`): what a claim costs once the
//! children are already restored and waiting.

use super::host::host_facts;
use super::warm::{stats, warm_snapshot};
use crate::report::{Report, Stats};
use branchbox_vmm::hypervisor::Hypervisor;
use branchbox_vmm::synthetic::fork::{fork, ShellPool};
use branchbox_vmm::synthetic::testguest::{self, Command, DATA_BASE};
use branchbox_vmm::synthetic::vm::Vm;
use branchbox_vmm::{Error, Result};
use serde_json::json;
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// Where a claim writes the child's new identity: 16 bytes, as the VMGenID device writes its
/// generation id into guest RAM before it interrupts the guest.
const IDENTITY_ADDR: u64 = DATA_BASE;

/// Parameters of [`bench_claim`].
#[derive(Debug, Clone)]
pub struct ClaimBenchOptions {
    /// Guest RAM of the pooled snapshot, MiB; all of it is touched before the snapshot.
    pub mem_mib: u64,
    /// Children kept ready (restored, paused) in the pool.
    pub pool_size: usize,
    /// Timed claims.
    pub claims: usize,
}

impl Default for ClaimBenchOptions {
    fn default() -> Self {
        ClaimBenchOptions { mem_mib: 512, pool_size: 16, claims: 200 }
    }
}

impl ClaimBenchOptions {
    /// A short run for CI: 64 MiB, a pool of 4, 20 claims.
    pub fn short() -> Self {
        ClaimBenchOptions { mem_mib: 64, pool_size: 4, claims: 20 }
    }
}

/// Refills `ready` with `n` children restored from the snapshot, not run (paused); returns
/// the time each took, shells included (a pool's refill builds them too).
fn refill(
    snapshot: &branchbox_vmm::snapshot::Snapshot,
    shells: &mut ShellPool,
    ready: &mut VecDeque<Vm>,
    n: usize,
) -> Result<Duration> {
    let start = Instant::now();
    shells.fill(n)?;
    for child in fork(snapshot, n, shells) {
        ready.push_back(child?);
    }
    Ok(start.elapsed() / n.max(1) as u32)
}

/// A fresh identity per claim, from the kernel's random source.
fn identity() -> Result<[u8; 16]> {
    let mut id = [0u8; 16];
    getrandom::getrandom(&mut id)
        .map_err(|e| Error::Memory { op: "getrandom", source: std::io::Error::from(e) })?;
    Ok(id)
}

/// The `pct` percentile of `samples` in ms (nearest rank).
fn percentile_ms(samples: &[Duration], pct: f64) -> f64 {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    let rank = ((pct / 100.0) * ms.len() as f64).ceil() as usize;
    ms.get(rank.saturating_sub(1)).copied().unwrap_or(0.0)
}

/// Claims from a pool of paused children of a warm snapshot: the clock runs from taking a
/// ready child to its guest answering a ping, with a new identity written into its RAM
/// first. The floor, in the same run, is a ping to the same child once it runs (the guest
/// round trip alone). Refills happen off the clock, as a pool refills in the background.
pub fn bench_claim(opts: &ClaimBenchOptions) -> Result<Report> {
    let hv = Hypervisor::open()?;
    let warm = warm_snapshot(&hv, opts.mem_mib)?;
    let config = warm.snapshot.state().config;
    let mut shells = ShellPool::new(&hv, config);
    let size = opts.pool_size.max(1);
    let mut ready = VecDeque::with_capacity(size);
    let mut refills = vec![refill(&warm.snapshot, &mut shells, &mut ready, size)?];
    let pooled_kib: Vec<f64> =
        ready.iter().map(|c| c.ram().private_bytes().map(|b| b as f64 / 1024.0)).collect::<Result<_>>()?;
    let (mut claims, mut floor) = (Vec::new(), Vec::new());
    for _ in 0..opts.claims.max(1) {
        if ready.is_empty() {
            refills.push(refill(&warm.snapshot, &mut shells, &mut ready, size)?);
        }
        let id = identity()?;
        let start = Instant::now();
        let mut child = ready.pop_front().ok_or_else(|| Error::Config("the pool is empty".into()))?;
        child.ram().write(IDENTITY_ADDR, &id)?;
        testguest::call(&mut child, Command::Ping)?;
        claims.push(start.elapsed());
        let start = Instant::now();
        testguest::call(&mut child, Command::Ping)?;
        floor.push(start.elapsed());
        let mut seen = [0u8; 16];
        child.ram().read(IDENTITY_ADDR, &mut seen)?;
        if seen != id {
            return Err(Error::Config("a claimed child does not hold the identity written into it".into()));
        }
    }
    let (claim_p99, floor_p99) = (percentile_ms(&claims, 99.0), percentile_ms(&floor, 99.0));
    let (claim, floor_stats, refill_stats) = (stats(&claims)?, stats(&floor)?, stats(&refills)?);
    let pooled =
        Stats::from_samples("KiB", &pooled_kib).ok_or_else(|| Error::Config("no pooled child".into()))?;
    let summary = format!(
        "microvm claim from a pool of {size} paused children of a {} MiB warm snapshot: p50 {:.3} ms, \
         p99 {:.3} ms to the guest answering (floor, a ping to a running child: p50 {:.3} ms, p99 \
         {:.3} ms); refill {:.2} ms per child; {:.0} KiB private RAM per pooled child",
        opts.mem_mib, claim.p50, claim_p99, floor_stats.p50, floor_p99, refill_stats.p50, pooled.p50
    );
    let mut ratios = BTreeMap::new();
    ratios.insert("claim/floor_ping".into(), claim.p50 / floor_stats.p50);
    let mut figures = BTreeMap::new();
    let one =
        |ms: f64| Stats::from_samples("ms", &[ms]).ok_or_else(|| Error::Config("no claim measured".into()));
    figures.insert("claim_p99".into(), one(claim_p99)?);
    figures.insert("floor_ping_p99".into(), one(floor_p99)?);
    figures.insert("claim".into(), claim);
    figures.insert("floor_ping".into(), floor_stats);
    figures.insert("refill_per_child".into(), refill_stats);
    figures.insert("pooled_child_private_ram".into(), pooled);
    drop(ready);
    drop(warm.parent);
    Ok(Report {
        bench: "claim".into(),
        backend: "microvm".into(),
        method: "A pool of children restored from a warm snapshot of the synthetic test guest \
                 (all RAM written) over the shared layer MAP_PRIVATE, VM shells built, not run \
                 (paused). claim: clock starts, the oldest ready child is taken, 16 fresh random \
                 bytes are written into its RAM (the VMGenID device's write of a new generation \
                 id), it runs until its guest answers a ping, clock stops; the bytes are read \
                 back after. floor_ping: a second ping to the same, now running, child. \
                 refill_per_child: shells plus restore, per child, off the claim clock. \
                 pooled_child_private_ram: Anonymous kB of each waiting child's RAM mapping."
            .into(),
        inputs: json!({
            "mem_mib": opts.mem_mib,
            "pool_size": size,
            "claims": opts.claims.max(1),
        }),
        host: host_facts(&hv),
        figures,
        ratios,
        summary,
    })
}
