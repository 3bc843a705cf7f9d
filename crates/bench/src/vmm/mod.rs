//! Benchmarks of fork, density, checkpoint, rollback, live branch and chain spawn, as
//! library calls the CLI wraps (`branchbox bench fork --backend microvm`, ...). Each returns
//! a [`Report`] with the reference measured in the same run; nothing here asserts a timing.

mod branch;
mod claim;
mod host;
mod timetravel;
mod warm;

pub use branch::{bench_branch, BranchBenchOptions};
pub use claim::{bench_claim, ClaimBenchOptions};
pub use timetravel::{
    bench_chain, bench_checkpoint, bench_rollback, ChainBenchOptions, CheckpointBenchOptions,
    RollbackBenchOptions,
};

use crate::report::{Report, Stats};
use branchbox_vmm::hypervisor::Hypervisor;
use branchbox_vmm::memory::GuestRam;
use branchbox_vmm::snapshot::Snapshot;
use branchbox_vmm::synthetic::fork::{fork_with, ShellPool};
use branchbox_vmm::synthetic::testguest::{self, Command};
use branchbox_vmm::synthetic::vm::Vm;
use branchbox_vmm::{Error, Result};
use host::{host_facts, kvm, mem};
use kvm_bindings::kvm_userspace_memory_region;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use warm::{stats, warm_snapshot};

/// Parameters of [`bench_fork`].
#[derive(Debug, Clone)]
pub struct ForkBenchOptions {
    /// Guest RAM of the snapshot, in MiB; all of it is touched before the snapshot.
    pub mem_mib: u64,
    /// Numbers of children forked at once (e.g. 1, 10, 100).
    pub counts: Vec<usize>,
    /// Repetitions of each `counts` entry.
    pub rounds: usize,
    /// Repetitions of the single-child fork whose p50 is reported.
    pub single_runs: usize,
    /// Threads that restore and run children (and build the floor's bare VMs).
    pub workers: usize,
}

fn host_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl Default for ForkBenchOptions {
    fn default() -> Self {
        ForkBenchOptions {
            mem_mib: 512,
            counts: vec![1, 10, 100],
            rounds: 5,
            single_runs: 100,
            workers: host_cpus(),
        }
    }
}

impl ForkBenchOptions {
    /// A short run for CI: 64 MiB, up to 10 children.
    pub fn short() -> Self {
        ForkBenchOptions {
            mem_mib: 64,
            counts: vec![1, 10],
            rounds: 2,
            single_runs: 10,
            workers: host_cpus(),
        }
    }
}

/// Parameters of [`bench_density`].
#[derive(Debug, Clone)]
pub struct DensityBenchOptions {
    /// Guest RAM of the parent, in MiB; all of it is touched before the snapshot.
    pub mem_mib: u64,
    /// Idle children forked from the parent's snapshot.
    pub children: usize,
}

impl Default for DensityBenchOptions {
    fn default() -> Self {
        DensityBenchOptions { mem_mib: 512, children: 100 }
    }
}

impl DensityBenchOptions {
    /// A short run for CI: 64 MiB, 10 children.
    pub fn short() -> Self {
        DensityBenchOptions { mem_mib: 64, children: 10 }
    }
}

/// Forks `n` children over `workers` threads and runs each until it answers a ping.
fn fork_and_ping(snapshot: &Snapshot, n: usize, pool: &mut ShellPool, workers: usize) -> Result<Vec<Vm>> {
    fork_with(snapshot, n, pool, workers, |child| testguest::call(child, Command::Ping).map(|_| ()))
        .into_iter()
        .collect()
}

/// A bare VM of the floor: its VM, vCPU and RAM, dropped together.
type BareVm = (kvm_ioctls::VmFd, kvm_ioctls::VcpuFd, GuestRam);

/// `n` bare VMs built over `workers` threads.
fn bare_vms(hv: &Hypervisor, snapshot: &Snapshot, n: usize, workers: usize) -> Result<Vec<BareVm>> {
    let per_worker = n.div_ceil(workers.clamp(1, n.max(1)));
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .step_by(per_worker.max(1))
            .map(|start| {
                let count = per_worker.min(n - start);
                scope.spawn(move || (0..count).map(|_| bare_vm(hv, snapshot)).collect::<Result<Vec<_>>>())
            })
            .collect();
        let mut all = Vec::with_capacity(n);
        for h in handles {
            let part = h.join().map_err(|_| Error::Thread("a floor worker panicked".into()))??;
            all.extend(part);
        }
        Ok(all)
    })
}

/// The floor: a bare VM over the snapshot's layer (create VM, map the layer MAP_PRIVATE,
/// register the slot, create the vCPU, set registers), without running it.
fn bare_vm(hv: &Hypervisor, snapshot: &Snapshot) -> Result<BareVm> {
    let size = snapshot.state().config.mem_size;
    let vm = hv.kvm().create_vm().map_err(kvm("KVM_CREATE_VM"))?;
    let ram = GuestRam::from_layer(&snapshot.chain().base_layer().file, size as usize)?;
    let region = kvm_userspace_memory_region {
        slot: 0,
        flags: 0,
        guest_phys_addr: 0,
        memory_size: size,
        userspace_addr: ram.host_addr(),
    };
    // SAFETY: the region covers `ram`, returned alongside the VM and dropped after it.
    unsafe { vm.set_user_memory_region(region) }.map_err(kvm("KVM_SET_USER_MEMORY_REGION"))?;
    let vcpu = vm.create_vcpu(0).map_err(kvm("KVM_CREATE_VCPU"))?;
    let sregs = vcpu.get_sregs().map_err(kvm("KVM_GET_SREGS"))?;
    vcpu.set_sregs(&testguest::user_mode_sregs(sregs)).map_err(kvm("KVM_SET_SREGS"))?;
    vcpu.set_regs(&testguest::initial_regs()).map_err(kvm("KVM_SET_REGS"))?;
    Ok((vm, vcpu, ram))
}

fn time<T>(f: impl FnOnce() -> Result<T>) -> Result<(Duration, T)> {
    let start = Instant::now();
    let out = f()?;
    Ok((start.elapsed(), out))
}

/// Fork n children (for each n in `counts`) of a warm snapshot with all RAM touched; the
/// clock stops when every child has run guest code and rung its doorbell. The floor is the
/// same number of bare VMs over the same layer, measured in the same run.
pub fn bench_fork(opts: &ForkBenchOptions) -> Result<Report> {
    let hv = Hypervisor::open()?;
    let warm = warm_snapshot(&hv, opts.mem_mib)?;
    let config = warm.snapshot.state().config;
    let mut pool = ShellPool::new(&hv, config);
    let mut figures = BTreeMap::new();
    let mut ratios = BTreeMap::new();
    let rounds = opts.rounds.max(1);
    let w = opts.workers.max(1);
    for &n in &opts.counts {
        let (mut floor, mut cold, mut pooled) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let (d, bare) = time(|| bare_vms(&hv, &warm.snapshot, n, w))?;
            floor.push(d);
            drop(bare);
            let (d, children) =
                time(|| fork_and_ping(&warm.snapshot, n, &mut ShellPool::new(&hv, config), w))?;
            cold.push(d);
            drop(children);
            pool.fill(n)?;
            let (d, children) = time(|| fork_and_ping(&warm.snapshot, n, &mut pool, w))?;
            pooled.push(d);
            drop(children);
        }
        let (floor, cold, pooled) = (stats(&floor)?, stats(&cold)?, stats(&pooled)?);
        ratios.insert(format!("fork_n{n}_pooled/floor_n{n}"), pooled.p50 / floor.p50);
        ratios.insert(format!("fork_n{n}_cold/floor_n{n}"), cold.p50 / floor.p50);
        figures.insert(format!("floor_n{n}"), floor);
        figures.insert(format!("fork_n{n}_cold"), cold);
        figures.insert(format!("fork_n{n}_pooled"), pooled);
    }
    let (mut single, mut single_cold, mut single_floor) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..opts.single_runs.max(1) {
        pool.fill(1)?;
        let (d, child) = time(|| fork_and_ping(&warm.snapshot, 1, &mut pool, 1))?;
        single.push(d);
        drop(child);
        let (d, child) = time(|| fork_and_ping(&warm.snapshot, 1, &mut ShellPool::new(&hv, config), 1))?;
        single_cold.push(d);
        drop(child);
        let (d, bare) = time(|| bare_vm(&hv, &warm.snapshot))?;
        single_floor.push(d);
        drop(bare);
    }
    let (single, single_cold, single_floor) = (stats(&single)?, stats(&single_cold)?, stats(&single_floor)?);
    ratios.insert("single_fork_pooled/floor_single".into(), single.p50 / single_floor.p50);
    ratios.insert("single_fork_cold/floor_single".into(), single_cold.p50 / single_floor.p50);
    let summary = format!(
        "microvm fork of a {} MiB warm snapshot: single fork p50 {:.3} ms pooled, {:.3} ms cold \
         (bare-VM floor {:.3} ms); {}",
        opts.mem_mib,
        single.p50,
        single_cold.p50,
        single_floor.p50,
        opts.counts
            .iter()
            .filter_map(|n| Some(format!(
                "n={n}: {:.1} ms pooled / {:.1} ms cold vs floor {:.1} ms",
                figures.get(&format!("fork_n{n}_pooled"))?.p50,
                figures.get(&format!("fork_n{n}_cold"))?.p50,
                figures.get(&format!("floor_n{n}"))?.p50
            )))
            .collect::<Vec<_>>()
            .join("; ")
    );
    figures.insert("single_fork_pooled".into(), single);
    figures.insert("single_fork_cold".into(), single_cold);
    figures.insert("floor_single".into(), single_floor);
    drop(warm.parent);
    Ok(Report {
        bench: "fork".into(),
        backend: "microvm".into(),
        method: "Parent: the synthetic test guest (user mode, see docs/microvm.md) with all its \
                 RAM written, snapshotted once (layer in the page cache: warm). fork_nN: clock \
                 starts, N children are restored over the shared layer MAP_PRIVATE (vCPU, VM and \
                 device state), each is sent a ping and run until its guest rings the MMIO \
                 doorbell, clock stops after the last answer; children are spread over `workers` \
                 threads (single_fork: one thread). _pooled: VM shells \
                 (VM, slot, vCPU) were built before the clock started; _cold: built on the \
                 clock. floor_nN: N bare VMs (create VM, mmap the layer MAP_PRIVATE, register the \
                 slot, create the vCPU, set regs/sregs), not run, built over the same threads, \
                 same run."
            .into(),
        inputs: json!({
            "mem_mib": opts.mem_mib,
            "counts": opts.counts,
            "rounds": rounds,
            "single_runs": opts.single_runs.max(1),
            "workers": w,
        }),
        host: host_facts(&hv),
        figures,
        ratios,
        summary,
    })
}

/// Host memory each idle child adds: children of one warm snapshot, each run until it
/// answered a ping, then measured from `/proc/self/smaps` (private pages inside each child's
/// RAM mapping) and `/proc/self/smaps_rollup` (the whole process); compared with the
/// parent's resident RAM.
pub fn bench_density(opts: &DensityBenchOptions) -> Result<Report> {
    let hv = Hypervisor::open()?;
    let warm = warm_snapshot(&hv, opts.mem_mib)?;
    let config = warm.snapshot.state().config;
    let mut pool = ShellPool::new(&hv, config);
    let n = opts.children.max(1);
    pool.fill(n)?;
    let before = rollup_private()?;
    let children = fork_and_ping(&warm.snapshot, n, &mut pool, 1)?;
    let after = rollup_private()?;
    let per_child: Vec<f64> =
        children.iter().map(|c| c.ram().private_bytes().map(|b| b as f64 / 1024.0)).collect::<Result<_>>()?;
    let shared: Vec<f64> = children
        .iter()
        .map(|c| c.ram().resident_bytes().map(|b| b as f64 / 1024.0))
        .collect::<Result<_>>()?;
    let process_per_child = (after.saturating_sub(before)) as f64 / 1024.0 / n as f64;
    let parent_kib = warm.parent_rss as f64 / 1024.0;
    let mut figures = BTreeMap::new();
    let kib =
        |v: &[f64]| Stats::from_samples("KiB", v).ok_or_else(|| Error::Config("no children measured".into()));
    let child_stats = kib(&per_child)?;
    figures.insert("child_private_ram".into(), child_stats.clone());
    figures.insert("child_resident_ram_shared_included".into(), kib(&shared)?);
    figures.insert("process_private_per_child".into(), kib(&[process_per_child])?);
    figures.insert("ref_parent_rss".into(), kib(&[parent_kib])?);
    let mut ratios = BTreeMap::new();
    ratios.insert("child_private_ram/ref_parent_rss".into(), child_stats.p50 / parent_kib);
    ratios.insert("process_private_per_child/ref_parent_rss".into(), process_per_child / parent_kib);
    let summary = format!(
        "microvm density: {n} idle children of a {} MiB parent (RSS {:.0} MiB) add {:.0} KiB of \
         private guest RAM each (p50), {:.0} KiB per child process-wide",
        opts.mem_mib,
        parent_kib / 1024.0,
        child_stats.p50,
        process_per_child
    );
    drop(children);
    Ok(Report {
        bench: "density".into(),
        backend: "microvm".into(),
        method: "Children are forked from a warm snapshot of the synthetic test guest with all \
                 RAM written, each runs until it answers a ping, then idles. child_private_ram: \
                 Anonymous (copied-on-write) kB of /proc/self/smaps inside each child's RAM \
                 mapping. process_private_per_child: growth of Private_Clean+Private_Dirty in \
                 /proc/self/smaps_rollup over forking the children (shells pre-built before), \
                 divided by their number: adds the VMM's own per-child memory. Not counted: \
                 kernel memory KVM allocates per VM (vCPU structures, shadow page tables). \
                 ref_parent_rss: Rss of the parent's RAM mapping before the snapshot."
            .into(),
        inputs: json!({ "mem_mib": opts.mem_mib, "children": n }),
        host: host_facts(&hv),
        figures,
        ratios,
        summary,
    })
}

/// Private bytes of this whole process (`Private_Clean` + `Private_Dirty` of smaps_rollup).
fn rollup_private() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/self/smaps_rollup").map_err(mem("read smaps_rollup"))?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("Private_Clean:") || l.starts_with("Private_Dirty:"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum::<u64>()
        * 1024)
}

/// Parameters of [`bench_fork_processes`].
#[derive(Debug, Clone)]
pub struct ProcessForkBenchOptions {
    /// Guest RAM of the snapshot, in MiB; all of it is touched before the snapshot.
    pub mem_mib: u64,
    /// Numbers of children forked at once.
    pub counts: Vec<usize>,
    /// Repetitions of each `counts` entry.
    pub rounds: usize,
    /// Threads of the in-process fork and the floor.
    pub workers: usize,
    /// Pings to one child for the round-trip figures.
    pub pings: usize,
    /// The `branchbox-vmm` program.
    pub program: std::path::PathBuf,
}

impl Default for ProcessForkBenchOptions {
    fn default() -> Self {
        ProcessForkBenchOptions {
            mem_mib: 512,
            counts: vec![10, 100],
            rounds: 5,
            workers: host_cpus(),
            pings: 200,
            program: branchbox_vmm::process::default_program(),
        }
    }
}

impl ProcessForkBenchOptions {
    /// A short run for CI: 64 MiB, up to 10 children.
    pub fn short() -> Self {
        ProcessForkBenchOptions {
            mem_mib: 64,
            counts: vec![1, 10],
            rounds: 2,
            pings: 20,
            ..Default::default()
        }
    }
}

fn client(e: branchbox_vmm::process::ClientError) -> Error {
    Error::Process(e.to_string())
}

/// Forks `n` children of snapshot `dir` into `pool`'s processes and pings each (pings sent
/// to all before any answer is read); returns the children and how many were pre-started.
fn fork_processes(
    pool: &branchbox_vmm::process::VmmPool,
    dir: &std::path::Path,
    n: usize,
) -> Result<(Vec<branchbox_vmm::process::VmmProcess>, usize)> {
    let fork = pool.fork(dir, branchbox_vmm::snapshot::DEFAULT_NAME, n, true);
    let mut children =
        fork.children.into_iter().collect::<std::result::Result<Vec<_>, _>>().map_err(client)?;
    let ping = branchbox_vmm::process::protocol::Request::Call { command: Command::Ping };
    for c in &mut children {
        c.send(&ping).map_err(client)?;
    }
    for c in &mut children {
        c.recv_answer().map_err(client)?;
    }
    Ok((children, fork.from_pool))
}

/// Fork of a warm snapshot into VMM processes (one per child) against the in-process fork
/// and the bare-VM floor, same clock-stop rule as [`bench_fork`]: every child has answered a
/// ping. `_processes_pooled`: the processes were started, and their shells built, before
/// the clock; `_processes_cold`: started on the clock.
pub fn bench_fork_processes(opts: &ProcessForkBenchOptions) -> Result<Report> {
    use branchbox_vmm::process::VmmPool;
    let hv = Hypervisor::open()?;
    let mut warm = warm_snapshot(&hv, opts.mem_mib)?;
    let config = warm.snapshot.state().config;
    let dir = warm.snapshot.dir().to_path_buf();
    let widest = opts.counts.iter().copied().max().unwrap_or(1).max(1);
    let pool = VmmPool::new(&opts.program, config, widest);
    let cold_pool = VmmPool::new(&opts.program, config, 0);
    let mut shells = ShellPool::new(&hv, config);
    let ready = Duration::from_secs(300);
    let (rounds, w) = (opts.rounds.max(1), opts.workers.max(1));
    let (mut figures, mut ratios) = (BTreeMap::new(), BTreeMap::new());
    for &n in &opts.counts {
        let n = n.max(1);
        let (mut floor, mut inproc, mut pooled, mut cold) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let (d, bare) = time(|| bare_vms(&hv, &warm.snapshot, n, w))?;
            floor.push(d);
            drop(bare);
            shells.fill(n)?;
            let (d, children) = time(|| fork_and_ping(&warm.snapshot, n, &mut shells, w))?;
            inproc.push(d);
            drop(children);
            pool.wait_ready(ready).map_err(client)?;
            let (d, (children, from_pool)) = time(|| fork_processes(&pool, &dir, n))?;
            if from_pool != n {
                return Err(Error::Process(format!("only {from_pool} of {n} processes came from the pool")));
            }
            pooled.push(d);
            drop(children);
            let (d, children) = time(|| fork_processes(&cold_pool, &dir, n))?;
            cold.push(d);
            drop(children);
        }
        let (floor, inproc, pooled, cold) = (stats(&floor)?, stats(&inproc)?, stats(&pooled)?, stats(&cold)?);
        ratios.insert(
            format!("fork_n{n}_processes_pooled/fork_n{n}_inprocess_pooled"),
            pooled.p50 / inproc.p50,
        );
        ratios.insert(format!("fork_n{n}_processes_pooled/floor_n{n}"), pooled.p50 / floor.p50);
        ratios.insert(format!("fork_n{n}_inprocess_pooled/floor_n{n}"), inproc.p50 / floor.p50);
        figures.insert(format!("floor_n{n}"), floor);
        figures.insert(format!("fork_n{n}_inprocess_pooled"), inproc);
        figures.insert(format!("fork_n{n}_processes_pooled"), pooled);
        figures.insert(format!("fork_n{n}_processes_cold"), cold);
    }
    // What one request across the process boundary costs: a ping to a child in its own
    // process against a ping to the parent in this one.
    pool.wait_ready(ready).map_err(client)?;
    let mut child = fork_processes(&pool, &dir, 1)?
        .0
        .pop()
        .ok_or_else(|| Error::Process("the fork returned no child".into()))?;
    let (mut remote, mut local) = (Vec::new(), Vec::new());
    for _ in 0..opts.pings.max(1) {
        remote.push(time(|| child.call(Command::Ping).map_err(client))?.0);
        local.push(time(|| testguest::call(&mut warm.parent, Command::Ping))?.0);
    }
    let (remote, local) = (stats(&remote)?, stats(&local)?);
    ratios.insert("ping_process/ping_inprocess".into(), remote.p50 / local.p50);
    let summary = format!(
        "microvm fork into VMM processes, {} MiB warm snapshot: {}; ping round trip {:.3} ms to a \
         process vs {:.3} ms in process",
        opts.mem_mib,
        opts.counts
            .iter()
            .filter_map(|n| Some(format!(
                "n={n}: {:.1} ms pooled processes / {:.1} ms processes started on the clock / {:.1} ms \
                 in-process pooled, floor {:.1} ms",
                figures.get(&format!("fork_n{n}_processes_pooled"))?.p50,
                figures.get(&format!("fork_n{n}_processes_cold"))?.p50,
                figures.get(&format!("fork_n{n}_inprocess_pooled"))?.p50,
                figures.get(&format!("floor_n{n}"))?.p50
            )))
            .collect::<Vec<_>>()
            .join("; "),
        remote.p50,
        local.p50
    );
    figures.insert("ping_process".into(), remote);
    figures.insert("ping_inprocess".into(), local);
    Ok(Report {
        bench: "fork_processes".into(),
        backend: "microvm".into(),
        method: "Parent: the synthetic test guest with all its RAM written, snapshotted once \
                 (layer in the page cache). fork_nN_processes_pooled: N branchbox-vmm processes \
                 were started and built their VM shells before the clock; clock starts, Restore \
                 (map the layer MAP_PRIVATE, load state, resume) is sent to all N, the replies \
                 read, a ping sent to all N, clock stops after the last answer. _processes_cold: \
                 the N processes are started on the clock (spawn, shell, handshake). \
                 fork_nN_inprocess_pooled: bench_fork's pooled fork (ShellPool, `workers` \
                 threads) with the same stop rule. floor_nN: N bare VMs over the same layer, not \
                 run. ping_process: one ping round trip to a child in its process (socket, \
                 vCPU thread, guest); ping_inprocess: the same guest call in this process."
            .into(),
        inputs: json!({
            "mem_mib": opts.mem_mib,
            "counts": opts.counts,
            "rounds": rounds,
            "workers": w,
            "pings": opts.pings.max(1),
            "program": opts.program.display().to_string(),
        }),
        host: host_facts(&hv),
        figures,
        ratios,
        summary,
    })
}
