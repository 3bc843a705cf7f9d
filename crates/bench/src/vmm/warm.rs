//! What several benchmarks start from: a warm snapshot of the synthetic guest, and the
//! summary of a list of timings.

use super::host::{TempDir, PAGE};
use crate::report::Stats;
use branchbox_vmm::config::VmConfig;
use branchbox_vmm::hypervisor::Hypervisor;
use branchbox_vmm::snapshot::Snapshot;
use branchbox_vmm::synthetic::testguest::{self, Command, DATA_BASE};
use branchbox_vmm::synthetic::vm::Vm;
use branchbox_vmm::{Error, Result};
use std::sync::Arc;
use std::time::Duration;

/// A parent with all of its RAM touched, snapshotted into a temporary directory.
pub(super) struct WarmSnapshot {
    pub(super) parent: Vm,
    pub(super) parent_rss: u64,
    pub(super) snapshot: Snapshot,
    _dir: TempDir,
}

pub(super) fn warm_snapshot(hv: &Arc<Hypervisor>, mem_mib: u64) -> Result<WarmSnapshot> {
    let config = VmConfig { mem_size: mem_mib << 20, vcpus: 1, irqchip: false };
    let mut parent = Vm::boot(hv, config)?;
    testguest::install(&mut parent)?;
    let pages = config.mem_size.saturating_sub(DATA_BASE) / PAGE;
    // Every qword, so the layer holds no zero page and no hole.
    let touch = Command::Fill { base: DATA_BASE, count: pages * PAGE / 8, stride: 8, seed: 0x5eed };
    testguest::call(&mut parent, touch)?;
    let parent_rss = parent.ram().resident_bytes()?;
    let dir = TempDir::new()?;
    parent.snapshot(dir.path())?;
    let snapshot = Snapshot::open(dir.path())?;
    Ok(WarmSnapshot { parent, parent_rss, snapshot, _dir: dir })
}

/// p50 and friends of `samples`, in ms.
pub(super) fn stats(samples: &[Duration]) -> Result<Stats> {
    Stats::from_durations(samples).ok_or_else(|| Error::Config("a figure has no samples".into()))
}
