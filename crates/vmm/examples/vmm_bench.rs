//! Runs the fork and density benchmarks and prints their reports as JSON, one per line.
//! `--short` runs the CI-sized version. The CLI's `branchbox bench` calls the same functions.

use branchbox_vmm::{bench_density, bench_fork, DensityBenchOptions, ForkBenchOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let short = std::env::args().any(|a| a == "--short");
    let (fork, density) = if short {
        (ForkBenchOptions::short(), DensityBenchOptions::short())
    } else {
        (ForkBenchOptions::default(), DensityBenchOptions::default())
    };
    for report in [bench_fork(&fork)?, bench_density(&density)?] {
        println!("{}", serde_json::to_string(&report)?);
        eprintln!("{}", report.summary);
    }
    Ok(())
}
