//! The benchmarks run end to end at a tiny size and report every figure with its reference.
//! Timings are not asserted: only that the report is complete.

use branchbox_bench::vmm::{
    bench_branch, bench_chain, bench_checkpoint, bench_density, bench_fork, bench_fork_processes,
    bench_rollback, BranchBenchOptions, ChainBenchOptions, CheckpointBenchOptions, DensityBenchOptions,
    ForkBenchOptions, ProcessForkBenchOptions, RollbackBenchOptions,
};
use branchbox_vmm::Hypervisor;

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

#[test]
fn fork_into_processes_benchmark_reports_figures_and_references() {
    if let Err(e) = Hypervisor::open() {
        println!("skipped: {e}");
        return;
    }
    let opts = ProcessForkBenchOptions {
        mem_mib: 8,
        counts: vec![3],
        rounds: 1,
        workers: 2,
        pings: 2,
        // The workspace build puts branchbox-vmm next to target/debug/deps (or set BRANCHBOX_VMM).
        program: branchbox_vmm::process::default_program(),
    };
    let r = bench_fork_processes(&opts).unwrap();
    for name in ["floor_n3", "fork_n3_inprocess_pooled", "fork_n3_processes_pooled", "fork_n3_processes_cold"]
    {
        assert_eq!(r.figures[name].runs, 1, "{name}");
    }
    assert_eq!(r.figures["ping_process"].runs, 2);
    assert!(r.ratios.contains_key("fork_n3_processes_pooled/fork_n3_inprocess_pooled"));
}

#[test]
fn time_travel_benchmarks_report_figures_and_references() {
    if let Err(e) = Hypervisor::open() {
        println!("skipped: {e}");
        return;
    }
    let r =
        bench_checkpoint(&CheckpointBenchOptions { mem_mib: 8, dirty_mib: vec![1, 2], rounds: 1 }).unwrap();
    for name in ["checkpoint_2mib", "checkpoint_2mib_pause", "checkpoint_2mib_durable", "ref_full_snapshot"] {
        assert!(r.figures.contains_key(name), "checkpoint: missing {name}");
    }
    assert!(r.ratios.contains_key("checkpoint_1mib/ref_full_snapshot"));
    assert!(
        r.figures.contains_key("dirty_set_kvm_log_1mib") && r.figures.contains_key("dirty_set_pagemap_1mib")
    );

    let r = bench_rollback(&RollbackBenchOptions { mem_mib: 8, dirty_mib: vec![1], rounds: 2 }).unwrap();
    assert_eq!(r.figures["rollback_1mib"].runs, 2);
    assert!(r.ratios.contains_key("rollback_1mib/ref_full_restore_1mib"));

    let r = bench_branch(&BranchBenchOptions { mem_mib: vec![8], branches: 3, busy_pages: 8, gap_ms: 1 })
        .unwrap();
    assert_eq!(r.figures["pause_window_8mib"].runs, 3);
    assert!(r.figures.contains_key("ref_fork_cold_snapshot_8mib"));

    let r = bench_chain(&ChainBenchOptions { mem_mib: 8, link_mib: 1, stride_pages: 1, runs: 2 }).unwrap();
    for depth in 0..4 {
        assert_eq!(r.figures[&format!("spawn_depth{depth}")].runs, 2);
    }
    assert!(r.ratios.contains_key("spawn_depth3/spawn_depth0"));
}
