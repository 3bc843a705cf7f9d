//! Fork: many independent VMs from one snapshot, each a new KVM VM over the shared layer.
//!
//! A KVM VM belongs to the process that created it, so a fork is never `fork(2)`: each child
//! is a new VM whose RAM maps the snapshot's layer `MAP_PRIVATE` and whose vCPU/VM/device
//! state is restored from the parsed snapshot. Building the VM (KVM_CREATE_VM, slot, vCPUs)
//! is most of a child's cost, so a [`ShellPool`] builds shells ahead of time, off the fork
//! path; a fork then only re-maps the layer over a shell's RAM and restores state. A
//! snapshot with a disk gives each child a new empty top over its frozen chain, all made by
//! one fork of the disk's store before the children are restored.

use crate::config::VmConfig;
use crate::error::{Error, Result};
use crate::hypervisor::Hypervisor;
use crate::snapshot::Snapshot;
use crate::synthetic::vm::Vm;
use branchbox_disk::LayeredBackend;
use branchbox_persist::RestoreError;
use std::path::Path;
use std::sync::Arc;

/// Pre-built VM shells of one shape, ready to receive a snapshot.
pub struct ShellPool {
    hv: Arc<Hypervisor>,
    config: VmConfig,
    shells: Vec<Vm>,
}

impl ShellPool {
    /// An empty pool of shells shaped `config`.
    pub fn new(hv: &Arc<Hypervisor>, config: VmConfig) -> ShellPool {
        ShellPool { hv: Arc::clone(hv), config, shells: Vec::new() }
    }

    /// Builds shells until the pool holds `n`.
    pub fn fill(&mut self, n: usize) -> Result<()> {
        while self.shells.len() < n {
            self.shells.push(Vm::shell(&self.hv, self.config)?);
        }
        Ok(())
    }

    /// Shells ready now.
    pub fn len(&self) -> usize {
        self.shells.len()
    }

    /// Whether no shell is ready.
    pub fn is_empty(&self) -> bool {
        self.shells.is_empty()
    }

    /// The shape of this pool's shells.
    pub fn config(&self) -> VmConfig {
        self.config
    }

    /// A ready shell, or a new one when the pool is empty.
    pub fn take(&mut self) -> Result<Vm> {
        match self.shells.pop() {
            Some(vm) => Ok(vm),
            None => Vm::shell(&self.hv, self.config),
        }
    }
}

/// One child being made: its shell, its disk's new chain, and the outcome.
type Slot = (Option<Vm>, Option<LayeredBackend>, Option<Result<Vm>>);

/// Restores `n` independent children of `snapshot`, taking shells from `pool` (which must
/// have the snapshot's shape). Each child is paused where the snapshot was taken; one
/// child's failure does not stop the others.
pub fn fork(snapshot: &Snapshot, n: usize, pool: &mut ShellPool) -> Vec<Result<Vm>> {
    fork_with(snapshot, n, pool, 1, |_| Ok(()))
}

/// [`fork`] spread over `workers` threads, running `then` on each child in its worker right
/// after the restore (e.g. to run it until it answers). Shells missing from the pool are
/// built in the workers too. Results keep the children's order.
pub fn fork_with<F>(
    snapshot: &Snapshot,
    n: usize,
    pool: &mut ShellPool,
    workers: usize,
    then: F,
) -> Vec<Result<Vm>>
where
    F: Fn(&mut Vm) -> Result<()> + Sync,
{
    // Every child's disk chain in one fork of the store: its directories are synced once.
    let mut disks: Vec<Option<LayeredBackend>> = match snapshot.disk().map(|d| d.fork(n)) {
        Some(Ok(tops)) => tops.into_iter().map(Some).collect(),
        Some(Err(e)) => {
            let rest = (1..n).map(|_| {
                let detail = "the disk's fork for every child failed; the first child's error says why";
                Err(Error::Restore(RestoreError::new("disk", detail)))
            });
            return std::iter::once(Err(e)).chain(rest).take(n).collect();
        }
        None => Vec::new(),
    };
    disks.resize_with(n, || None);
    let mut slots: Vec<Slot> = disks.into_iter().map(|disk| (pool.shells.pop(), disk, None)).collect();
    let (hv, config) = (&pool.hv, pool.config);
    let one = |shell: Option<Vm>, disk: Option<LayeredBackend>| -> Result<Vm> {
        let shell = match shell {
            Some(vm) => vm,
            None => Vm::shell(hv, config)?,
        };
        let mut child = Vm::restore_with(shell, snapshot, disk)?;
        then(&mut child)?;
        Ok(child)
    };
    let per_worker = n.div_ceil(workers.clamp(1, n.max(1)));
    if per_worker >= n {
        for (shell, disk, out) in &mut slots {
            *out = Some(one(shell.take(), disk.take()));
        }
    } else {
        std::thread::scope(|scope| {
            for chunk in slots.chunks_mut(per_worker) {
                let one = &one;
                scope.spawn(move || {
                    for (shell, disk, out) in chunk {
                        *out = Some(one(shell.take(), disk.take()));
                    }
                });
            }
        });
    }
    slots
        .into_iter()
        .map(|(_, _, out)| out.unwrap_or_else(|| Err(Error::Thread("a fork worker stopped early".into()))))
        .collect()
}

/// Forks `n` children from the paused VM `parent`: snapshots it into `dir` (after which the
/// parent itself runs on the new layer, copy-on-write like its children) and forks from
/// that snapshot.
pub fn fork_paused(
    parent: &mut Vm,
    dir: &Path,
    n: usize,
    pool: &mut ShellPool,
) -> Result<(Snapshot, Vec<Result<Vm>>)> {
    parent.snapshot(dir)?;
    let snapshot = Snapshot::open(dir)?;
    let children = fork(&snapshot, n, pool);
    Ok((snapshot, children))
}
