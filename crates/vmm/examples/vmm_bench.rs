//! Runs the fork and density benchmarks and prints their reports as JSON, one per line.
//! `--short` runs the CI-sized version; `--workers N` sets the fork threads. The CLI's
//! `branchbox bench` calls the same functions.

use branchbox_vmm::{bench_density, bench_fork, DensityBenchOptions, ForkBenchOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let short = std::env::args().any(|a| a == "--short");
    let (mut fork, density) = if short {
        (ForkBenchOptions::short(), DensityBenchOptions::short())
    } else {
        (ForkBenchOptions::default(), DensityBenchOptions::default())
    };
    let args: Vec<String> = std::env::args().collect();
    if let Some(w) = args.iter().position(|a| a == "--workers") {
        fork.workers = args.get(w + 1).ok_or("--workers needs a number")?.parse()?;
    }
    for report in [bench_fork(&fork)?, bench_density(&density)?] {
        println!("{}", serde_json::to_string(&report)?);
        eprintln!("{}", report.summary);
    }
    Ok(())
}
