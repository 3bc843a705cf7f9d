//! `branchbox bench`: each benchmark subcommand's options turned into a call of
//! `branchbox-bench` (docs/benchmarks.md), and the report it returns printed.

use crate::args::{BackendArg, BenchCmd, TravelArgs};
use crate::output::print;
use anyhow::{bail, Result};
use branchbox_bench::sandbox as bench;
use branchbox_bench::travel::{self as bench_travel, Travel};
use branchbox_core::Engine;

/// A time-travel benchmark on the chosen backend.
fn travel(engine: &Engine, which: Travel, t: &TravelArgs) -> Result<branchbox_bench::report::Report> {
    use branchbox_bench::vmm;
    fn pick<T: Default>(short: bool, s: fn() -> T) -> T {
        if short {
            s()
        } else {
            T::default()
        }
    }
    Ok(match (t.backend, which) {
        (BackendArg::Microvm, Travel::Checkpoint) => {
            vmm::bench_checkpoint(&pick(t.short, vmm::CheckpointBenchOptions::short))?
        }
        (BackendArg::Microvm, Travel::Rollback) => {
            vmm::bench_rollback(&pick(t.short, vmm::RollbackBenchOptions::short))?
        }
        (BackendArg::Microvm, Travel::Branch) => {
            vmm::bench_branch(&pick(t.short, vmm::BranchBenchOptions::short))?
        }
        (BackendArg::Microvm, Travel::Chain) => {
            vmm::bench_chain(&pick(t.short, vmm::ChainBenchOptions::short))?
        }
        (_, which) => bench_travel::run(engine, which, if t.short { 1 } else { t.runs.max(1) }, t.short)?,
    })
}

/// Runs one `branchbox bench` subcommand and prints its report.
pub fn run(engine: &Engine, cmd: BenchCmd, json: bool) -> Result<i32> {
    let report = match cmd {
        BenchCmd::Exec { runs } => bench::exec(engine, runs.max(1))?,
        BenchCmd::Fork { backend: BackendArg::Microvm, mib, children, runs, short, processes: true } => {
            let mut o = if short {
                branchbox_bench::vmm::ProcessForkBenchOptions::short()
            } else {
                Default::default()
            };
            if let Some(m) = mib {
                o.mem_mib = m;
            }
            if let Some(n) = children {
                o.counts = [10, n].into_iter().filter(|c| *c <= n).collect();
                o.counts.dedup();
            }
            if !short {
                o.rounds = runs.max(1);
            }
            branchbox_bench::vmm::bench_fork_processes(&o)?
        }
        BenchCmd::Fork { backend: BackendArg::Gvisor | BackendArg::Auto, processes: true, .. } => {
            bail!("--processes measures the microvm engine's VMM processes; add --backend microvm")
        }
        BenchCmd::Fork {
            backend: BackendArg::Gvisor | BackendArg::Auto,
            mib,
            children,
            runs,
            short,
            processes: false,
        } => {
            let (mib, wide, runs) =
                if short { (16, 3, 1) } else { (mib.unwrap_or(50), children.unwrap_or(10), runs) };
            bench::fork(engine, mib, wide.max(1), runs.max(1))?
        }
        BenchCmd::Fork { backend: BackendArg::Microvm, mib, children, runs, short, processes: false } => {
            let mut o =
                if short { branchbox_bench::vmm::ForkBenchOptions::short() } else { Default::default() };
            if let Some(m) = mib {
                o.mem_mib = m;
            }
            if let Some(n) = children {
                o.counts = [1, 10, n].into_iter().filter(|c| *c <= n).collect();
                o.counts.dedup();
            }
            if !short {
                o.rounds = runs.max(1);
            }
            branchbox_bench::vmm::bench_fork(&o)?
        }
        BenchCmd::Checkpoint(t) => travel(engine, Travel::Checkpoint, &t)?,
        BenchCmd::Rollback(t) => travel(engine, Travel::Rollback, &t)?,
        BenchCmd::Branch(t) => travel(engine, Travel::Branch, &t)?,
        BenchCmd::Chain(t) => travel(engine, Travel::Chain, &t)?,
        BenchCmd::Soak { sandboxes, seconds, seed, short } => {
            let seed = seed.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0)
            });
            let o = if short {
                branchbox_bench::soak::SoakOptions::short(seed)
            } else {
                branchbox_bench::soak::SoakOptions {
                    sandboxes: sandboxes.max(1),
                    duration: std::time::Duration::from_secs(seconds),
                    seed,
                }
            };
            branchbox_bench::soak::soak(engine, &o)?
        }
        BenchCmd::Net { runs, connects, mib, transfers, short } => {
            let o = if short {
                branchbox_bench::net::NetBenchOptions::short()
            } else {
                branchbox_bench::net::NetBenchOptions { runs, connects, mib, transfers }
            };
            branchbox_bench::net::net(engine, &o)?
        }
        BenchCmd::Claim { mib, pool, claims, short } => {
            let o = if short {
                branchbox_bench::vmm::ClaimBenchOptions::short()
            } else {
                branchbox_bench::vmm::ClaimBenchOptions { mem_mib: mib, pool_size: pool, claims }
            };
            branchbox_bench::vmm::bench_claim(&o)?
        }
        BenchCmd::Density { mib, children, short } => {
            let o = if short {
                branchbox_bench::vmm::DensityBenchOptions::short()
            } else {
                branchbox_bench::vmm::DensityBenchOptions { mem_mib: mib, children }
            };
            branchbox_bench::vmm::bench_density(&o)?
        }
    };
    if json {
        print(true, &report, String::new);
    } else {
        println!("{}", serde_json::to_string(&report)?);
        eprintln!("{}", report.summary);
    }
    Ok(0)
}
