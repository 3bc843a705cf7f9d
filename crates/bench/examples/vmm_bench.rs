//! Runs the microVM benchmarks and prints their reports as JSON, one per line.
//! `--short` runs the CI-sized version; `--workers N` sets the fork threads; `--only NAME`
//! (fork, fork-processes, density, checkpoint, rollback, branch, chain) runs one. The CLI's `branchbox
//! bench` calls the same functions.

use branchbox_bench::report::Report;
use branchbox_bench::vmm::{
    bench_branch, bench_chain, bench_checkpoint, bench_density, bench_fork, bench_fork_processes,
    bench_rollback, BranchBenchOptions, ChainBenchOptions, CheckpointBenchOptions, DensityBenchOptions,
    ForkBenchOptions, ProcessForkBenchOptions, RollbackBenchOptions,
};

type Bench = Box<dyn Fn() -> branchbox_vmm::Result<Report>>;

fn pick<T>(short: bool, s: T, d: T) -> T {
    if short {
        s
    } else {
        d
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let short = args.iter().any(|a| a == "--short");
    let only = args.iter().position(|a| a == "--only").and_then(|i| args.get(i + 1)).cloned();
    let mut fork = if short { ForkBenchOptions::short() } else { ForkBenchOptions::default() };
    if let Some(w) = args.iter().position(|a| a == "--workers") {
        fork.workers = args.get(w + 1).ok_or("--workers needs a number")?.parse()?;
    }
    let mut processes = pick(short, ProcessForkBenchOptions::short(), ProcessForkBenchOptions::default());
    processes.workers = fork.workers;
    let (density, checkpoint, rollback, branch, chain) = (
        pick(short, DensityBenchOptions::short(), DensityBenchOptions::default()),
        pick(short, CheckpointBenchOptions::short(), CheckpointBenchOptions::default()),
        pick(short, RollbackBenchOptions::short(), RollbackBenchOptions::default()),
        pick(short, BranchBenchOptions::short(), BranchBenchOptions::default()),
        pick(short, ChainBenchOptions::short(), ChainBenchOptions::default()),
    );
    let benches: Vec<(&str, Bench)> = vec![
        ("fork", Box::new(move || bench_fork(&fork))),
        ("fork-processes", Box::new(move || bench_fork_processes(&processes))),
        ("density", Box::new(move || bench_density(&density))),
        ("checkpoint", Box::new(move || bench_checkpoint(&checkpoint))),
        ("rollback", Box::new(move || bench_rollback(&rollback))),
        ("branch", Box::new(move || bench_branch(&branch))),
        ("chain", Box::new(move || bench_chain(&chain))),
    ];
    for (name, run) in benches {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let report = run()?;
        println!("{}", serde_json::to_string(&report)?);
        eprintln!("{}", report.summary);
    }
    Ok(())
}
