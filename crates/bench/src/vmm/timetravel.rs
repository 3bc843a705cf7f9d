//! Benchmarks of checkpoint, rollback and chain spawn, in place on one VM of the synthetic
//! test guest, each with its reference measured in the same run.

use super::host::{host_facts, TempDir, PAGE};
use crate::report::{Report, Stats};
use branchbox_vmm::config::VmConfig;
use branchbox_vmm::hypervisor::Hypervisor;
use branchbox_vmm::snapshot::Snapshot;
use branchbox_vmm::synthetic::fork::{fork, ShellPool};
use branchbox_vmm::synthetic::testguest::{self, Command, DATA_BASE};
use branchbox_vmm::synthetic::vm::Vm;
use branchbox_vmm::{Error, Result};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Seed of the pattern every qword of a touched guest holds.
const TOUCH_SEED: u64 = 0x5eed;

/// A VM of the test guest with every data qword written, checkpointed once (the full base
/// layer) into a fresh directory, so later checkpoints are deltas.
pub(super) fn touched(hv: &Arc<Hypervisor>, mem_mib: u64) -> Result<(Vm, TempDir)> {
    let config = VmConfig { mem_size: mem_mib << 20, vcpus: 1, irqchip: false };
    let mut vm = Vm::boot(hv, config)?;
    testguest::install(&mut vm)?;
    let qwords = config.mem_size.saturating_sub(DATA_BASE) / 8;
    testguest::call(&mut vm, Command::Fill { base: DATA_BASE, count: qwords, stride: 8, seed: TOUCH_SEED })?;
    let dir = TempDir::new()?;
    vm.checkpoint(dir.path(), "base")?.wait()?;
    Ok((vm, dir))
}

/// Dirties `mib` MiB from the start of guest data (one qword per page) with `seed`.
fn dirty(vm: &mut Vm, mib: u64, seed: u64) -> Result<()> {
    if DATA_BASE + (mib << 20) > vm.config().mem_size {
        return Err(Error::Config(format!(
            "{mib} MiB cannot be dirtied in a {} byte guest",
            vm.config().mem_size
        )));
    }
    let pages = (mib << 20) / PAGE;
    expect_ok(
        testguest::call(vm, Command::Fill { base: DATA_BASE, count: pages, stride: PAGE, seed })?.status,
    )
}

fn expect_ok(status: u64) -> Result<()> {
    match status {
        0 => Ok(()),
        s => Err(Error::Protocol(format!("the guest reported {s} mismatches"))),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn push(figures: &mut BTreeMap<String, Vec<f64>>, name: String, d: Duration) {
    figures.entry(name).or_default().push(ms(d));
}

fn summarize(samples: BTreeMap<String, Vec<f64>>) -> Result<BTreeMap<String, Stats>> {
    samples
        .into_iter()
        .map(|(k, v)| {
            Ok((
                k,
                Stats::from_samples("ms", &v)
                    .ok_or_else(|| Error::Config("a figure has no samples".into()))?,
            ))
        })
        .collect()
}

fn ratio(figures: &BTreeMap<String, Stats>, ratios: &mut BTreeMap<String, f64>, a: &str, b: &str) {
    if let (Some(x), Some(y)) = (figures.get(a), figures.get(b)) {
        ratios.insert(format!("{a}/{b}"), x.p50 / y.p50);
    }
}

/// The floor of a copy-on-write capture of the first `mib` MiB of guest data, just
/// dirtied: a `fork` whose child exits at once, with exactly those pages inheritable. It
/// copies and write-protects their page table entries and makes KVM drop its mappings of
/// them, as every capture that does not copy the pages must; the clock stops when `fork`
/// returns in the parent.
fn capture_floor(vm: &Vm, mib: u64) -> Result<Duration> {
    let (first, pages) = (DATA_BASE / PAGE, (mib << 20) / PAGE);
    vm.ram().set_forkable(first, pages, true)?;
    let start = Instant::now();
    // SAFETY: the child only calls `_exit`.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: leaves the forked child at once, running nothing.
        unsafe { libc::_exit(0) };
    }
    let took = start.elapsed();
    let err = std::io::Error::last_os_error();
    vm.ram().set_forkable(first, pages, false)?;
    if pid < 0 {
        return Err(Error::Memory { op: "fork for the capture floor", source: err });
    }
    let mut status = 0;
    // SAFETY: reaps our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    Ok(took)
}

/// Parameters of [`bench_checkpoint`].
#[derive(Debug, Clone)]
pub struct CheckpointBenchOptions {
    /// Guest RAM in MiB; all of it is written before the first (base) checkpoint.
    pub mem_mib: u64,
    /// MiB dirtied between two checkpoints (e.g. 1, 10, 100).
    pub dirty_mib: Vec<u64>,
    /// Checkpoints per `dirty_mib` entry (and full snapshots for the reference).
    pub rounds: usize,
}

impl Default for CheckpointBenchOptions {
    fn default() -> Self {
        CheckpointBenchOptions { mem_mib: 512, dirty_mib: vec![1, 10, 100], rounds: 5 }
    }
}

impl CheckpointBenchOptions {
    /// A short run for CI: 64 MiB, 1 and 8 MiB dirtied.
    pub fn short() -> Self {
        CheckpointBenchOptions { mem_mib: 64, dirty_mib: vec![1, 8], rounds: 2 }
    }
}

/// Checkpoint in place after dirtying 1/10/100 MiB: the clock runs from the checkpoint call
/// until the guest answered a ping afterwards (it runs again); the delta is written after
/// that, and its time to durable is reported too. Reference: a full snapshot of the same
/// RAM. Also measures the two ways to find the dirty pages on the same dirtied set.
pub fn bench_checkpoint(opts: &CheckpointBenchOptions) -> Result<Report> {
    let hv = Hypervisor::open()?;
    let (mut vm, dir) = touched(&hv, opts.mem_mib)?;
    let rounds = opts.rounds.max(1);
    let mut samples: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut pages_found: BTreeMap<String, u64> = BTreeMap::new();
    // A second VM for the dirty-tracking comparison: a child of the base with logging on.
    let base = Snapshot::open_named(dir.path(), "base")?;
    let mut probe = fork(&base, 1, &mut ShellPool::new(&hv, vm.config()))
        .pop()
        .unwrap_or_else(|| Err(Error::Config("no child".into())))?;
    probe.set_dirty_logging(true)?;
    let mut seq = 0;
    for &mib in &opts.dirty_mib {
        for round in 0..rounds {
            seq += 1;
            dirty(&mut vm, mib, seq)?;
            let start = Instant::now();
            let cp = vm.checkpoint(dir.path(), &format!("c{mib}m{round}"))?;
            let pause = cp.pause();
            testguest::call(&mut vm, Command::Ping)?;
            let running = start.elapsed();
            cp.wait()?;
            let durable = start.elapsed();
            push(&mut samples, format!("checkpoint_{mib}mib"), running);
            push(&mut samples, format!("checkpoint_{mib}mib_pause"), pause);
            push(&mut samples, format!("checkpoint_{mib}mib_durable"), durable);
            dirty(&mut vm, mib, seq)?;
            push(&mut samples, format!("capture_floor_{mib}mib"), capture_floor(&vm, mib)?);

            dirty(&mut probe, mib, seq)?;
            let t = Instant::now();
            let logged = probe.take_dirty_log()?;
            push(&mut samples, format!("dirty_set_kvm_log_{mib}mib"), t.elapsed());
            let t = Instant::now();
            let private = probe.ram().private_pages()?;
            push(&mut samples, format!("dirty_set_pagemap_{mib}mib"), t.elapsed());
            pages_found.insert(format!("kvm_log_{mib}mib"), logged.len() as u64);
            pages_found.insert(format!("pagemap_{mib}mib"), private.len() as u64);
        }
    }
    drop(probe);
    // Reference: full snapshots of the same RAM, each into a directory of its own.
    for _ in 0..rounds {
        let full = TempDir::new()?;
        let start = Instant::now();
        vm.checkpoint(full.path(), "full")?;
        testguest::call(&mut vm, Command::Ping)?;
        push(&mut samples, "ref_full_snapshot".into(), start.elapsed());
    }
    let figures = summarize(samples)?;
    let mut ratios = BTreeMap::new();
    for &mib in &opts.dirty_mib {
        ratio(&figures, &mut ratios, &format!("checkpoint_{mib}mib"), "ref_full_snapshot");
        ratio(
            &figures,
            &mut ratios,
            &format!("checkpoint_{mib}mib_pause"),
            &format!("capture_floor_{mib}mib"),
        );
        ratio(
            &figures,
            &mut ratios,
            &format!("dirty_set_kvm_log_{mib}mib"),
            &format!("dirty_set_pagemap_{mib}mib"),
        );
    }
    let summary = format!(
        "microvm checkpoint in place, {} MiB guest: {}; full snapshot {:.1} ms",
        opts.mem_mib,
        opts.dirty_mib
            .iter()
            .filter_map(|m| Some(format!(
                "{m} MiB dirtied {:.2} ms (pause {:.2}, capture floor {:.2}, durable {:.1})",
                figures.get(&format!("checkpoint_{m}mib"))?.p50,
                figures.get(&format!("checkpoint_{m}mib_pause"))?.p50,
                figures.get(&format!("capture_floor_{m}mib"))?.p50,
                figures.get(&format!("checkpoint_{m}mib_durable"))?.p50
            )))
            .collect::<Vec<_>>()
            .join(", "),
        figures.get("ref_full_snapshot").map_or(f64::NAN, |s| s.p50)
    );
    Ok(Report {
        bench: "checkpoint".into(),
        backend: "microvm".into(),
        method: "The synthetic test guest with all RAM written and a base checkpoint. Per round the \
                 guest dirties N MiB (one qword per page), then checkpoint_NMiB: clock starts, \
                 Vm::checkpoint (CPU/device state, dirty set from the KVM dirty log, fork of the \
                 layer writer), the guest answers a ping (it runs again), clock stops. _pause: \
                 the time the VM had to stay paused. _durable: until the delta layer and state \
                 file are fsynced and renamed (written by the forked writer while the guest runs). \
                 capture_floor_NMiB: the guest dirties the same N MiB again, then a fork() of a \
                 child that exits at once with exactly those pages inheritable (page tables \
                 copied and write-protected, KVM's mappings of them dropped), clock stops when \
                 fork returns: what any capture that does not copy the pages costs here. \
                 ref_full_snapshot: the same VM's full snapshot (whole RAM layer written and \
                 fsynced) into a new directory, then a ping. dirty_set_*: on a second VM with \
                 the same N MiB dirtied, KVM_GET_DIRTY_LOG vs a PAGEMAP_SCAN of the private pages \
                 of its mapping."
            .into(),
        inputs: json!({ "mem_mib": opts.mem_mib, "dirty_mib": opts.dirty_mib, "rounds": rounds, "pages_found": pages_found }),
        host: host_facts(&hv),
        figures,
        ratios,
        summary,
    })
}

/// Parameters of [`bench_rollback`].
#[derive(Debug, Clone)]
pub struct RollbackBenchOptions {
    /// Guest RAM in MiB; all of it is written before the checkpoint.
    pub mem_mib: u64,
    /// MiB dirtied after the checkpoint, before each rollback (e.g. 1, 10, 100).
    pub dirty_mib: Vec<u64>,
    /// Rollbacks per `dirty_mib` entry.
    pub rounds: usize,
}

impl Default for RollbackBenchOptions {
    fn default() -> Self {
        RollbackBenchOptions { mem_mib: 512, dirty_mib: vec![1, 10, 100], rounds: 10 }
    }
}

impl RollbackBenchOptions {
    /// A short run for CI: 64 MiB, 1 and 8 MiB dirtied.
    pub fn short() -> Self {
        RollbackBenchOptions { mem_mib: 64, dirty_mib: vec![1, 8], rounds: 3 }
    }
}

/// Asks the guest to verify 64 qwords spread over the first `mib` MiB hold the touched
/// pattern, and checks the answer counter equals `seq`.
fn verify_restored(vm: &mut Vm, mib: u64, seq: u64) -> Result<()> {
    let stride = ((mib << 20) / 64).max(PAGE);
    let a = testguest::call(vm, Command::Check { base: DATA_BASE, count: 64, stride, seed: TOUCH_SEED })?;
    expect_ok(a.status)?;
    if a.seq != seq {
        return Err(Error::Protocol(format!("answer counter {} after the rollback, expected {seq}", a.seq)));
    }
    Ok(())
}

/// Rollback in place after dirtying 1/10/100 MiB: the clock runs from the rollback call
/// until the guest, running from the restored state, verified memory it had overwritten
/// and answered with the checkpoint's answer counter. Reference: restoring a full
/// snapshot of the same state into a new VM, verified the same way.
pub fn bench_rollback(opts: &RollbackBenchOptions) -> Result<Report> {
    let hv = Hypervisor::open()?;
    let (mut vm, dir) = touched(&hv, opts.mem_mib)?;
    let target = vm.checkpoint(dir.path(), "target")?.wait()?;
    let seq = testguest::call(&mut vm, Command::Ping)?.seq;
    let full_dir = TempDir::new()?;
    let mut copy = Vm::restore_into(Vm::shell(&hv, vm.config())?, &target)?;
    copy.checkpoint(full_dir.path(), "full")?.wait()?;
    drop(copy);
    let full = Snapshot::open_named(full_dir.path(), "full")?;
    let rounds = opts.rounds.max(1);
    let mut samples: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for &mib in &opts.dirty_mib {
        for round in 0..rounds {
            dirty(&mut vm, mib, 0xd1 + round as u64)?;
            let start = Instant::now();
            vm.rollback(&target)?;
            let host = start.elapsed();
            verify_restored(&mut vm, mib, seq)?;
            push(&mut samples, format!("rollback_{mib}mib"), start.elapsed());
            push(&mut samples, format!("rollback_{mib}mib_host"), host);
        }
        for _ in 0..rounds {
            let start = Instant::now();
            let mut restored = Vm::restore_into(Vm::shell(&hv, vm.config())?, &full)?;
            verify_restored(&mut restored, mib, seq)?;
            push(&mut samples, format!("ref_full_restore_{mib}mib"), start.elapsed());
        }
    }
    let figures = summarize(samples)?;
    let mut ratios = BTreeMap::new();
    for &mib in &opts.dirty_mib {
        ratio(&figures, &mut ratios, &format!("rollback_{mib}mib"), &format!("ref_full_restore_{mib}mib"));
    }
    let summary = format!(
        "microvm rollback in place, {} MiB guest: {}",
        opts.mem_mib,
        opts.dirty_mib
            .iter()
            .filter_map(|m| Some(format!(
                "{m} MiB dirtied {:.2} ms (host part {:.2}) vs full-snapshot restore {:.2} ms",
                figures.get(&format!("rollback_{m}mib"))?.p50,
                figures.get(&format!("rollback_{m}mib_host"))?.p50,
                figures.get(&format!("ref_full_restore_{m}mib"))?.p50
            )))
            .collect::<Vec<_>>()
            .join("; ")
    );
    Ok(Report {
        bench: "rollback".into(),
        backend: "microvm".into(),
        method: "The synthetic test guest with all RAM written, a base checkpoint and a delta \
                 checkpoint `target`. Per round the guest overwrites the first N MiB (one qword \
                 per page), then rollback_NMiB: clock starts, Vm::rollback(target) (CPU/device \
                 state, drop or re-map the dirtied pages), the guest checks 64 qwords spread over \
                 the N MiB hold the checkpoint's values and answers with the checkpoint's answer \
                 counter + 1, clock stops. _host: the rollback call alone. ref_full_restore_NMiB: \
                 the same state saved as a full snapshot, restored into a new VM (shell built on \
                 the clock), verified the same way."
            .into(),
        inputs: json!({ "mem_mib": opts.mem_mib, "dirty_mib": opts.dirty_mib, "rounds": rounds }),
        host: host_facts(&hv),
        figures,
        ratios,
        summary,
    })
}

/// Parameters of [`bench_chain`].
#[derive(Debug, Clone)]
pub struct ChainBenchOptions {
    /// Guest RAM in MiB; all of it is written before the base layer.
    pub mem_mib: u64,
    /// MiB each delta link dirties (overlapping the previous link by half).
    pub link_mib: u64,
    /// Distance in pages between dirtied pages (1: contiguous runs; 2: every other page,
    /// the worst case for the merged index's run count).
    pub stride_pages: u64,
    /// Spawns per depth.
    pub runs: usize,
}

impl Default for ChainBenchOptions {
    fn default() -> Self {
        ChainBenchOptions { mem_mib: 512, link_mib: 16, stride_pages: 1, runs: 50 }
    }
}

impl ChainBenchOptions {
    /// A short run for CI: 64 MiB, 4 MiB links, 10 spawns per depth.
    pub fn short() -> Self {
        ChainBenchOptions { mem_mib: 64, link_mib: 4, stride_pages: 1, runs: 10 }
    }
}

/// Spawn (fork one child from a pooled shell, run it until it answers a ping) from
/// snapshots at chain depth 0..3, interleaved; reference: depth 0.
pub fn bench_chain(opts: &ChainBenchOptions) -> Result<Report> {
    let hv = Hypervisor::open()?;
    let (mut vm, dir) = touched(&hv, opts.mem_mib)?;
    let stride = opts.stride_pages.max(1);
    let link_pages = (opts.link_mib << 20) / PAGE / stride;
    for depth in 1..=3u64 {
        let base = DATA_BASE + (depth - 1) * (opts.link_mib << 20) / 2;
        let fill = Command::Fill { base, count: link_pages, stride: stride * PAGE, seed: depth };
        expect_ok(testguest::call(&mut vm, fill)?.status)?;
        vm.checkpoint(dir.path(), &format!("d{depth}"))?.wait()?;
    }
    let mut samples: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut snaps = Vec::new();
    let mut runs_per_depth = Vec::new();
    for depth in 0..=3u64 {
        let name = if depth == 0 { "base".to_string() } else { format!("d{depth}") };
        let start = Instant::now();
        let snap = Snapshot::open_named(dir.path(), &name)?;
        push(&mut samples, format!("open_depth{depth}"), start.elapsed());
        runs_per_depth.push(snap.chain().merged().runs.len());
        snaps.push(snap);
    }
    let mut pool = ShellPool::new(&hv, vm.config());
    for _ in 0..opts.runs.max(1) {
        pool.fill(snaps.len())?;
        for (depth, snap) in snaps.iter().enumerate() {
            let start = Instant::now();
            let mut child =
                fork(snap, 1, &mut pool).pop().unwrap_or_else(|| Err(Error::Config("no child".into())))?;
            let restored = start.elapsed();
            testguest::call(&mut child, Command::Ping)?;
            push(&mut samples, format!("spawn_depth{depth}"), start.elapsed());
            push(&mut samples, format!("spawn_depth{depth}_restore"), restored);
        }
    }
    let figures = summarize(samples)?;
    let mut ratios = BTreeMap::new();
    for depth in 1..=3 {
        ratio(&figures, &mut ratios, &format!("spawn_depth{depth}"), "spawn_depth0");
    }
    let p50 = |k: &str| figures.get(k).map_or(f64::NAN, |s| s.p50);
    let summary = format!(
        "microvm chain spawn, {} MiB guest, {} MiB links: depth 0 {:.3} ms, 1 {:.3} ms, 2 {:.3} ms, 3 {:.3} ms \
         (depth3/depth0 {:.2})",
        opts.mem_mib,
        opts.link_mib,
        p50("spawn_depth0"),
        p50("spawn_depth1"),
        p50("spawn_depth2"),
        p50("spawn_depth3"),
        p50("spawn_depth3") / p50("spawn_depth0")
    );
    Ok(Report {
        bench: "chain".into(),
        backend: "microvm".into(),
        method: "The synthetic test guest with all RAM written, a base layer (depth 0) and three \
                 delta checkpoints (depth 1..3), each dirtying link_mib MiB that overlap the \
                 previous link by half. Each snapshot is opened once (open_depthN: parse, open \
                 layers, build the merged page index). spawn_depthN: clock starts, one child is \
                 restored into a pooled shell (base layer mapped, then one MAP_FIXED mapping per \
                 run of the merged index), it answers a ping, clock stops; depths interleaved \
                 per round; _restore: the clock stopped before the ping. Reference: depth 0."
            .into(),
        inputs: json!({
            "mem_mib": opts.mem_mib,
            "link_mib": opts.link_mib,
            "stride_pages": stride,
            "runs": opts.runs.max(1),
            "merged_runs_per_depth": runs_per_depth,
        }),
        host: host_facts(&hv),
        figures,
        ratios,
        summary,
    })
}
