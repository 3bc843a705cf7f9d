//! Benchmark of live branching: fork one child from a *running* source, ten times in a row,
//! with the source's pause window measured.

use super::host::host_facts;
use super::timetravel::touched;
use crate::report::{Report, Stats};
use branchbox_vmm::hypervisor::Hypervisor;
use branchbox_vmm::snapshot::Snapshot;
use branchbox_vmm::synthetic::checkpoint::Checkpoint;
use branchbox_vmm::synthetic::fork::{fork, ShellPool};
use branchbox_vmm::synthetic::testguest::{self, Command, DATA_BASE};
use branchbox_vmm::synthetic::vcpu::RunOutcome;
use branchbox_vmm::synthetic::vm::Vm;
use branchbox_vmm::{Error, Result};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Parameters of [`bench_branch`].
#[derive(Debug, Clone)]
pub struct BranchBenchOptions {
    /// Guest RAM sizes of the source in MiB (all of it written), one run each.
    pub mem_mib: Vec<u64>,
    /// Branches taken in a row from the same running source.
    pub branches: usize,
    /// Pages the source rewrites per command while it runs (its dirty rate).
    pub busy_pages: u64,
    /// Gap between branches, in milliseconds.
    pub gap_ms: u64,
}

impl Default for BranchBenchOptions {
    fn default() -> Self {
        BranchBenchOptions { mem_mib: vec![512, 1536], branches: 10, busy_pages: 256, gap_ms: 5 }
    }
}

impl BranchBenchOptions {
    /// A short run for CI: one 64 MiB source, 5 branches.
    pub fn short() -> Self {
        BranchBenchOptions { mem_mib: vec![64], branches: 5, busy_pages: 64, gap_ms: 2 }
    }
}

/// What the source thread reports for one branch.
struct Taken {
    checkpoint: Checkpoint,
    stopped: Instant,
    resumed: Instant,
}

/// Runs the source guest (rewriting `busy_pages` pages per command, forever) until `stop`;
/// each time it is paused with a pending name in `names`, takes checkpoint `name` in `dir`
/// and resumes at once.
fn run_source(
    mut vm: Vm,
    dir: &std::path::Path,
    busy_pages: u64,
    names: &mpsc::Receiver<Option<String>>,
    taken: &mpsc::Sender<Result<Taken>>,
) -> Result<Vm> {
    let mut seed = 1;
    let busy = |seed| Command::Fill { base: DATA_BASE, count: busy_pages, stride: 4096, seed };
    testguest::post(&vm, busy(seed))?;
    loop {
        match vm.run()? {
            RunOutcome::Device => {
                seed += 1;
                testguest::post(&vm, busy(seed))?;
            }
            RunOutcome::Paused => {
                let stopped = Instant::now();
                let Ok(Some(name)) = names.recv() else { return Ok(vm) };
                let result = vm.checkpoint(dir, &name);
                let resumed = Instant::now();
                let report = result.map(|checkpoint| Taken { checkpoint, stopped, resumed });
                if taken.send(report).is_err() {
                    return Ok(vm);
                }
            }
        }
    }
}

/// Ten branches in a row of one running source per RAM size: the main thread pauses the
/// source, the source thread checkpoints and resumes, the main thread forks one child
/// from the checkpoint into a pooled shell and runs it until it answers. Reference: fork
/// one child from the source's cold base snapshot (opened from disk on the clock).
pub fn bench_branch(opts: &BranchBenchOptions) -> Result<Report> {
    let hv = Hypervisor::open()?;
    let mut figures = BTreeMap::new();
    let mut ratios = BTreeMap::new();
    let mut summary = Vec::new();
    let branches = opts.branches.max(1);
    for &mib in &opts.mem_mib {
        let (vm, dir) = touched(&hv, mib)?;
        let config = vm.config();
        let mut pool = ShellPool::new(&hv, config);
        pool.fill(branches + 1)?;
        let pause = vm.pause_handle()?;
        let (name_tx, name_rx) = mpsc::channel();
        let (taken_tx, taken_rx) = mpsc::channel();
        let (mut windows, mut kicks, mut answered, mut per_branch) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut ready_at = Vec::new();
        let outcome = std::thread::scope(|scope| -> Result<()> {
            let dir_path = dir.path();
            let busy = opts.busy_pages;
            let source = scope.spawn(move || run_source(vm, dir_path, busy, &name_rx, &taken_tx));
            let result = (|| -> Result<()> {
                for b in 0..branches {
                    std::thread::sleep(Duration::from_millis(opts.gap_ms));
                    let start = Instant::now();
                    pause.request_pause();
                    name_tx
                        .send(Some(format!("b{b}")))
                        .map_err(|_| Error::Thread("the source stopped".into()))?;
                    let taken = taken_rx.recv().map_err(|_| Error::Thread("the source stopped".into()))??;
                    let mut checkpoint = taken.checkpoint;
                    let snapshot = checkpoint.ready()?;
                    ready_at.push(start.elapsed());
                    let mut child = fork(&snapshot, 1, &mut pool)
                        .pop()
                        .unwrap_or_else(|| Err(Error::Config("no child".into())))?;
                    testguest::wait_answer(&mut child)?;
                    answered.push(start.elapsed());
                    let window = taken.resumed - taken.stopped;
                    windows.push(window);
                    kicks.push(taken.stopped - start);
                    per_branch.push(window.as_secs_f64() * 1e3);
                    checkpoint.wait()?;
                }
                Ok(())
            })();
            pause.request_pause();
            let _ = name_tx.send(None);
            let joined = source.join().map_err(|_| Error::Thread("the source thread panicked".into()))?;
            result?;
            joined.map(drop)
        });
        outcome?;
        let mut reference = Vec::new();
        for _ in 0..branches {
            let start = Instant::now();
            let snap = Snapshot::open_named(dir.path(), "base")?;
            let mut child =
                fork(&snap, 1, &mut pool).pop().unwrap_or_else(|| Err(Error::Config("no child".into())))?;
            testguest::call(&mut child, Command::Ping)?;
            reference.push(start.elapsed());
            pool.fill(1)?;
        }
        let stat =
            |v: &[Duration]| Stats::from_durations(v).ok_or_else(|| Error::Config("no samples".into()));
        let (w, k, a, r) = (stat(&windows)?, stat(&kicks)?, stat(&answered)?, stat(&reference)?);
        figures.insert(format!("layer_ready_{mib}mib"), stat(&ready_at)?);
        let first = per_branch.first().copied().unwrap_or(f64::NAN);
        let last = per_branch.last().copied().unwrap_or(f64::NAN);
        let tail = per_branch.get(1..).map_or(f64::NAN, |t| t.iter().sum::<f64>() / t.len().max(1) as f64);
        summary.push(format!(
            "{mib} MiB: pause window p50 {:.2} ms p90 {:.2} ms (first {first:.2}, last {last:.2}), child answered p50 {:.2} ms vs cold-snapshot fork {:.2} ms",
            w.p50, w.p90, a.p50, r.p50
        ));
        ratios.insert(format!("child_answered_{mib}mib/ref_fork_cold_snapshot_{mib}mib"), a.p50 / r.p50);
        ratios.insert(format!("pause_window_{mib}mib_later_mean/first"), tail / first);
        ratios.insert(format!("pause_window_{mib}mib_last/first"), last / first);
        figures.insert(format!("pause_window_{mib}mib"), w);
        figures.insert(format!("pause_request_to_stop_{mib}mib"), k);
        figures.insert(format!("child_answered_{mib}mib"), a);
        figures.insert(format!("ref_fork_cold_snapshot_{mib}mib"), r);
        figures.insert(
            format!("pause_window_{mib}mib_per_branch"),
            Stats::from_samples("ms", &per_branch).ok_or_else(|| Error::Config("no samples".into()))?,
        );
        drop(dir);
    }
    Ok(Report {
        bench: "branch".into(),
        backend: "microvm".into(),
        method: "A source of the synthetic test guest with all RAM written and a base layer runs \
                 a loop of commands that rewrite busy_pages pages. Per branch (in a row, gap_ms \
                 apart): clock starts, the main thread asks the source's vCPU to pause; the \
                 source thread checkpoints it (CPU/device state, KVM dirty log, fork of the layer \
                 writer) and resumes it at once; the main thread waits until the delta's content \
                 is written, forks one child into a pooled shell and runs it until its guest \
                 rings the doorbell: clock stops (child_answered). pause_window: vCPU stopped \
                 (run loop returned) to resumed (checkpoint returned), measured on the source \
                 thread; pause_request_to_stop: from the request to the vCPU stopping. \
                 layer_ready: from the request until the delta's content was written. \
                 ref_fork_cold_snapshot: open the source's base snapshot from disk, fork one \
                 child, ping it, same pool."
            .into(),
        inputs: json!({ "mem_mib": opts.mem_mib, "branches": branches, "busy_pages": opts.busy_pages, "gap_ms": opts.gap_ms }),
        host: host_facts(&hv),
        figures,
        ratios,
        summary: format!("microvm live branch, {branches} in a row: {}", summary.join("; ")),
    })
}
