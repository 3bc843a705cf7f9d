//! The benchmarks run end to end at a tiny size and report every figure with its reference.
//! Timings are not asserted: only that the report is complete.

use branchbox_vmm::{bench_density, bench_fork, DensityBenchOptions, ForkBenchOptions, Hypervisor};

#[test]
fn fork_and_density_benchmarks_report_figures_and_references() {
    if let Err(e) = Hypervisor::open() {
        println!("skipped: {e}");
        return;
    }
    let opts = ForkBenchOptions { mem_mib: 8, counts: vec![1, 3], rounds: 1, single_runs: 2, workers: 2 };
    let report = bench_fork(&opts).unwrap();
    for name in ["floor_n3", "fork_n3_pooled", "fork_n3_cold", "single_fork_pooled", "floor_single"] {
        assert!(report.figures.contains_key(name), "missing {name}");
    }
    assert!(report.ratios.contains_key("fork_n3_pooled/floor_n3"));
    assert_eq!(report.figures["single_fork_pooled"].runs, 2);

    let report = bench_density(&DensityBenchOptions { mem_mib: 8, children: 3 }).unwrap();
    let child = &report.figures["child_private_ram"];
    assert_eq!(child.runs, 3);
    // An idle child holds a handful of private pages, far from the parent's 8 MiB.
    assert!(child.max <= 64.0, "idle child holds {} KiB", child.max);
    assert!(report.figures["ref_parent_rss"].p50 > 4096.0);
}
