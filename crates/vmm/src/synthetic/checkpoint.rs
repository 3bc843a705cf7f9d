//! Time travel for one VM: checkpoint in place, roll back in place, branch a live VM.
//!
//! A VM's RAM is a `MAP_PRIVATE` view of a layer chain plus private copies of the pages
//! written since; [`Lineage`] tracks which chain the mapping shows (`mapped`), which chain
//! the next checkpoint extends (`head`) and which pages may be private.
//!
//! - **Checkpoint**: the first one of a VM writes a full base layer (inline). Later ones
//!   take the pages dirtied since the previous checkpoint, save CPU and device state, and
//!   `fork` a writer process that writes the delta layer and state file from memory as it
//!   was at that instant (`memory::layers::writer`); the VM may run again as soon as this returns.
//! - **Rollback**: restore CPU/device state (undone if KVM refuses any of it), then drop
//!   or re-map only the pages that can differ from the target (`memory::layers::plan`).
//! - **Branch**: a checkpoint of a running VM, then children forked from it.

use crate::disk::{DiskError, DiskRef, SnapshotDisk};
use crate::error::{Error, Result};
use crate::memory::dirty;
use crate::memory::layers::delta::{data_offset, encode_header, index_bytes, DeltaHeader};
use crate::memory::layers::plan::{rollback_plan, RemapOp};
use crate::memory::layers::writer::{WritePlan, Writer};
use crate::memory::layers::{Chain, LayerKind, LayerRef, OpenLayer};
use crate::memory::lineage::Lineage;
use crate::memory::PAGE_SIZE;
use crate::memory::{new_layer_name, write_atomic};
use crate::snapshot::lifecycle::DirLock;
use crate::snapshot::{format, state_file_name, valid_name, MachineState, Snapshot, DEFAULT_NAME};
use crate::synthetic::fork::{fork, ShellPool};
use crate::synthetic::vm::{CpuState, Vm};
use branchbox_persist::Snapshottable;
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A checkpoint just taken: its VM may run again; its layer may still be being written.
pub struct Checkpoint {
    dir: PathBuf,
    name: String,
    pause: Duration,
    pages: u64,
    state: MachineState,
    chain: Arc<Chain>,
    disk: Option<SnapshotDisk>,
    /// The disk of the snapshot of the same name this one replaces.
    replaced: Option<DiskRef>,
    writer: Option<Writer>,
}

impl Checkpoint {
    /// The snapshot name (state file `<name>.state` in the directory).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How long the VM had to stay paused for this checkpoint.
    pub fn pause(&self) -> Duration {
        self.pause
    }

    /// Pages the checkpoint's new layer holds (all of RAM for a base layer).
    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// The process writing this checkpoint's delta layer (`None` for a base layer, written
    /// before the checkpoint returned), for supervising it: placing it in a cgroup, or
    /// killing it. A killed writer fails [`Checkpoint::wait`], and the VM's next checkpoint
    /// writes a full base layer rather than extend a chain whose newest layer is missing.
    pub fn writer_pid(&self) -> Option<u32> {
        self.writer.as_ref().map(Writer::pid)
    }

    /// Waits until the layer's content is complete (not yet durable) and returns the
    /// snapshot, ready to fork or roll back to.
    pub fn ready(&mut self) -> Result<Snapshot> {
        if let Some(w) = &self.writer {
            w.ready()?;
        }
        Ok(self.snapshot())
    }

    /// Waits until the layer and the state file are durable and named (listed by
    /// [`Snapshot::list`]) and returns the snapshot.
    pub fn wait(self) -> Result<Snapshot> {
        if let Some(w) = &self.writer {
            w.wait()?;
        }
        if let Some(old) = &self.replaced {
            // The new state file is in place and no longer names the old frozen chain. A
            // failure leaves a chain no snapshot names: it only keeps its layers.
            if let Ok(store) = crate::disk::existing_store(&old.store) {
                let _ = store.remove_chain(&old.frozen);
            }
        }
        Ok(self.snapshot())
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot::from_parts(
            &self.dir,
            &self.name,
            self.state.clone(),
            Arc::clone(&self.chain),
            self.disk.clone(),
        )
    }
}

fn cstr(dir_relative: String) -> Result<CString> {
    CString::new(dir_relative).map_err(|_| Error::Config("a file name contains NUL".into()))
}

fn io(op: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Memory { op, source }
}

/// Joins runs whose gaps are at most `gap` pages: fewer `madvise` calls and VMA splits
/// around the writer's fork, for a few clean pages' page tables copied.
fn fork_ranges(runs: &[(u64, u64)], gap: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &(p, l) in runs {
        match out.last_mut() {
            Some((s, len)) if *s + *len + gap >= p => *len = p + l - *s,
            _ => out.push((p, l)),
        }
    }
    out
}

impl Vm {
    /// Takes a snapshot of this paused VM into the existing directory `dir` as its default
    /// snapshot (`vm.state`) and waits until it is durable. A VM with a disk has its disk
    /// frozen at the same instant (see [`checkpoint`](Vm::checkpoint)). The first snapshot of a VM
    /// writes a full memory layer; later ones into the same directory write a delta layer.
    /// Afterwards this VM's RAM is a copy-on-write view shared with every child.
    pub fn snapshot(&mut self, dir: &Path) -> Result<()> {
        self.checkpoint(dir, DEFAULT_NAME)?.wait().map(|_| ())
    }

    /// Freezes this paused VM into snapshot `name` in `dir` and returns as soon as the VM
    /// may run again. The VM's first checkpoint (or one into another directory than its
    /// layers) writes a full base layer before returning; later ones write only the pages
    /// dirtied since the previous checkpoint, in a delta layer written after the return
    /// from memory captured now. [`Checkpoint::wait`] makes it durable.
    ///
    /// A VM with a disk has its disk frozen at the same instant, after the CPU state is saved
    /// (which completes a pending guest access, possibly a queue notification): the top is
    /// flushed and becomes a delta, the VM goes on with a new top, and the frozen chain is
    /// recorded in the disk's store under a name the state file keeps. The disk's layers are
    /// durable when this returns.
    pub fn checkpoint(&mut self, dir: &Path, name: &str) -> Result<Checkpoint> {
        let start = Instant::now();
        if !valid_name(name) {
            return Err(Error::Config(format!("{name:?} is not a snapshot name (letters, digits, - and _)")));
        }
        // Held until the state file is in place (a delta's writer inherits it): garbage
        // collection waits for it (`snapshot::lifecycle`).
        let _lock = DirLock::shared(dir)?;
        let replaced = self.replaced_disk(dir, name);
        let mut checkpoint = match self.lineage.take() {
            Some(lineage) if lineage.dir == dir && lineage.chain_intact() => {
                self.checkpoint_delta(lineage, name, start)
            }
            other => {
                let logging = other.as_ref().is_some_and(|l| l.logging);
                self.lineage = other;
                self.checkpoint_full(dir, name, start, logging)
            }
        }?;
        checkpoint.replaced = replaced.filter(|old| checkpoint.state.disk.as_ref() != Some(old));
        Ok(checkpoint)
    }

    /// The disk of the snapshot `name` in `dir` that a checkpoint of that name replaces: its
    /// frozen chain is removed once the new state file is in place ([`Checkpoint::wait`]),
    /// or it would keep its layers with no snapshot naming it. Read only for a VM with a
    /// disk; an unreadable old state names nothing.
    fn replaced_disk(&self, dir: &Path, name: &str) -> Option<DiskRef> {
        self.disk()?;
        format::read_state_file(&dir.join(state_file_name(name))).ok()?.disk
    }

    fn checkpoint_full(
        &mut self,
        dir: &Path,
        name: &str,
        start: Instant,
        logging: bool,
    ) -> Result<Checkpoint> {
        let cpu = self.save_cpu()?;
        let disk = self.freeze_disk()?;
        let result = self.write_full(dir, name, start, logging, cpu, disk.clone());
        if let (Err(_), Some((r, _))) = (&result, &disk) {
            self.forget_frozen(r);
        }
        result
    }

    fn write_full(
        &mut self,
        dir: &Path,
        name: &str,
        start: Instant,
        logging: bool,
        cpu: CpuState,
        disk: Option<(DiskRef, branchbox_disk::FrozenChain)>,
    ) -> Result<Checkpoint> {
        let layer = new_layer_name("layer");
        let crc32 = self.ram().write_layer(dir, &layer)?;
        let path = dir.join(&layer);
        let file = File::open(&path).map_err(|source| Error::LayerMissing { path: path.clone(), source })?;
        let kind = LayerKind::Base { crc32 };
        let open = OpenLayer { name: layer, path, file, kind, data_page: 0 };
        let chain = Arc::new(Chain::base(self.config().mem_size, Arc::new(open)));
        self.ram_mut().map_chain(&chain)?;
        let mut lineage = Lineage::new(dir, &chain);
        lineage.logging = logging;
        self.lineage = Some(lineage);
        self.take_host_dirty();
        if logging {
            // The mapping now equals the new layer: start the next dirty set empty.
            self.take_dirty_log()?;
        }
        let state = MachineState {
            config: self.config(),
            vm: cpu.vm,
            vcpus: cpu.vcpus,
            devices: cpu.devices,
            memory: crate::memory::MemoryState { size: chain.size(), layers: chain.refs() },
            disk: disk.as_ref().map(|(r, _)| r.clone()),
        };
        let bytes = format::encode(&state)?;
        let state_name = state_file_name(name);
        write_atomic(dir, &state_name, &bytes).map_err(|source| Error::SnapshotIo {
            path: dir.join(&state_name),
            op: "write",
            source,
        })?;
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            name: name.to_string(),
            pause: start.elapsed(),
            pages: self.ram().pages(),
            state,
            chain,
            disk: self.snapshot_disk(disk),
            replaced: None,
            writer: None,
        })
    }

    /// Pages written since the head checkpoint: the dirty log, or while logging is off
    /// (head is still what is mapped) the private pages; then logging starts.
    /// Also returns the dirty bitmap read, for [`Vm::clear_dirty_log`] once the writer has
    /// been forked.
    fn dirty_since_head(&mut self, lineage: &mut Lineage) -> Result<(Vec<u64>, Vec<u64>)> {
        let host = dirty::union(&self.take_host_dirty(), &std::mem::take(&mut lineage.carry));
        if lineage.logging {
            let bitmap = self.dirty_bitmap()?;
            return Ok((dirty::union(&dirty::bitmap_pages(&bitmap), &host), bitmap));
        }
        let private = self.ram().private_pages()?;
        self.set_dirty_logging(true)?;
        lineage.logging = true;
        Ok((dirty::union(&private, &host), Vec::new()))
    }

    fn checkpoint_delta(&mut self, mut lineage: Lineage, name: &str, start: Instant) -> Result<Checkpoint> {
        let result = self.write_delta(&mut lineage, name, start);
        self.lineage = Some(lineage);
        result
    }

    fn write_delta(&mut self, lineage: &mut Lineage, name: &str, start: Instant) -> Result<Checkpoint> {
        let layer = new_layer_name("delta");
        let id = crate::random::random_id()?;
        let mut refs: Vec<LayerRef> = lineage.head.refs();
        refs.push(LayerRef { name: layer.clone(), kind: LayerKind::Delta { id } });
        // CPU state first: saving completes a pending guest access, which may write memory
        // or serve a disk request.
        let mut state = self.save(&mut refs)?;
        let disk = self.freeze_disk()?;
        state.disk = disk.as_ref().map(|(r, _)| r.clone());
        let result = self.write_delta_layer(lineage, name, start, state, (layer, id), disk.clone());
        if let (Err(_), Some((r, _))) = (&result, &disk) {
            self.forget_frozen(r);
        }
        result
    }

    /// The rest of [`write_delta`](Vm::write_delta): the new layer `(name, id)` and its
    /// writer, with `state` (saved, disk frozen) as its state file.
    fn write_delta_layer(
        &mut self,
        lineage: &mut Lineage,
        name: &str,
        start: Instant,
        state: MachineState,
        (layer, id): (String, u64),
        disk: Option<(DiskRef, branchbox_disk::FrozenChain)>,
    ) -> Result<Checkpoint> {
        let dir = lineage.dir.clone();
        let (pages, logged) = self.dirty_since_head(lineage)?;
        // Until the writer runs, nothing holds these pages: a failure below leaves them to
        // the next checkpoint.
        lineage.carry.clone_from(&pages);
        lineage.dirty = dirty::union(&lineage.dirty, &pages);
        let n = pages.len() as u64;
        let data_off = data_offset(n);
        let index = index_bytes(&pages);
        let raw_index = index.get(..pages.len() * 8).unwrap_or(&[]);
        let header = encode_header(&DeltaHeader {
            ram_size: self.config().mem_size,
            pages: n,
            data_off,
            id,
            index_crc: crc32fast::hash(raw_index),
            data_crc: 0,
        });
        let layer_tmp = format!(".{layer}.tmp");
        let delta = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(dir.join(&layer_tmp))
            .map_err(io("create delta layer temp file"))?;
        delta.set_len(data_off + n * PAGE_SIZE as u64).map_err(io("size delta layer temp file"))?;
        let bytes = format::encode(&state)?;
        let state_name = state_file_name(name);
        let state_tmp = format!(".{state_name}.tmp");
        let state_file = File::create(dir.join(&state_tmp)).map_err(io("create state temp file"))?;
        let runs = dirty::runs(&pages);
        let ram_runs = runs
            .iter()
            .map(|&(p, l)| {
                let addr = self
                    .ram()
                    .page_addr(p)
                    .ok_or_else(|| Error::Config(format!("dirty page {p} outside RAM")))?;
                Ok((addr, l as usize * PAGE_SIZE))
            })
            .collect::<Result<Vec<_>>>()?;
        let plan = WritePlan {
            dir: File::open(&dir).map_err(io("open snapshot directory"))?,
            delta: delta.try_clone().map_err(io("duplicate delta descriptor"))?,
            header,
            index,
            data_off,
            runs: ram_runs,
            delta_names: (cstr(layer_tmp)?, cstr(layer.clone())?),
            state: (state_file, bytes, cstr(state_tmp)?, cstr(state_name)?),
        };
        let shared = fork_ranges(&runs, 64);
        for &(p, l) in &shared {
            self.ram().set_forkable(p, l, true)?;
        }
        let writer = Writer::spawn(&plan);
        for &(p, l) in &shared {
            self.ram().set_forkable(p, l, false)?;
        }
        let writer = writer?;
        lineage.carry.clear();
        // The fork write-protected these pages, so KVM has dropped its mappings of them:
        // re-arming their dirty logging now costs little. A failure here leaves the bits set,
        // and the next checkpoint writes those pages again, which is correct: it does not fail
        // this checkpoint, whose writer already runs.
        if !logged.is_empty() {
            let _ = self.clear_dirty_log(&logged);
        }
        let open = OpenLayer {
            name: layer.clone(),
            path: dir.join(&layer),
            file: delta,
            kind: LayerKind::Delta { id },
            data_page: data_off / PAGE_SIZE as u64,
        };
        let chain = Arc::new(Chain::extend(&lineage.head, Arc::new(open), Arc::new(pages)));
        lineage.head = Arc::clone(&chain);
        lineage.writer = Some((writer.clone(), layer));
        Ok(Checkpoint {
            dir,
            name: name.to_string(),
            pause: start.elapsed(),
            pages: n,
            state,
            chain,
            disk: self.snapshot_disk(disk),
            replaced: None,
            writer: Some(writer),
        })
    }

    /// Returns this paused VM, in place, to snapshot `to` (one of its checkpoints, or any
    /// snapshot of the same shape): CPU, device and memory state. Memory work is
    /// proportional to the pages dirtied since the mapping was last re-pointed plus the
    /// delta pages of the two chains, not to RAM size. If KVM refuses the target's CPU or
    /// device state, the VM's own state is put back and the VM is unchanged.
    pub fn rollback(&mut self, to: &Snapshot) -> Result<()> {
        let target = to.state();
        if target.config != self.config() {
            return Err(Error::Config(format!(
                "snapshot is for a VM shaped {:?}, this VM is {:?}",
                target.config,
                self.config()
            )));
        }
        let now = self.save_cpu()?;
        // The device states were checked first: the target has a disk exactly when this VM
        // has one. The disk goes back after the devices, at the same pause.
        let restored = self.restore_cpu(&target.vm, &target.vcpus, &target.devices).and_then(|()| {
            match (self.disk(), to.disk()) {
                (Some(d), Some(frozen)) => d.rollback(&frozen.frozen).map_err(DiskError::at_restore),
                _ => Ok(()),
            }
        });
        if let Err(e) = restored {
            let undo = self.restore_cpu(&now.vm, &now.vcpus, &now.devices);
            return Err(match undo {
                Ok(()) => e,
                Err(u) => {
                    Error::Checkpoint(format!("rollback failed ({e}) and so did putting the VM back ({u})"))
                }
            });
        }
        let chain = to.chain();
        let mut lineage = self.lineage.take();
        let logging = lineage.as_ref().is_some_and(|l| l.logging);
        let writer = lineage.as_mut().and_then(|l| l.writer.take());
        let result = match lineage {
            Some(l) if l.mapped.base_layer().name == chain.base_layer().name => {
                let mut dirty = dirty::union(&l.dirty, &self.take_host_dirty());
                if l.logging {
                    dirty = dirty::union(&dirty, &self.take_dirty_log()?);
                } else {
                    dirty = dirty::union(&dirty, &self.ram().private_pages()?);
                }
                self.apply(&rollback_plan(&l.mapped, chain, &dirty), chain)
            }
            _ => {
                self.take_host_dirty();
                if logging {
                    self.take_dirty_log()?;
                }
                self.ram_mut().map_chain(chain)
            }
        };
        let mut lineage = Lineage::new(to.dir(), chain);
        lineage.logging = logging;
        // Rolled back to a checkpoint whose layer may still be being written: keep watching
        // its writer, so the next checkpoint may extend the target's chain meanwhile.
        lineage.writer = writer.filter(|(_, layer)| chain.layers().iter().any(|l| &l.name == layer));
        self.lineage = Some(lineage);
        result
    }

    /// The disk a checkpoint's snapshot restores from: the chain just frozen, in this VM's
    /// store.
    fn snapshot_disk(&self, disk: Option<(DiskRef, branchbox_disk::FrozenChain)>) -> Option<SnapshotDisk> {
        let store = self.disk()?.store().clone();
        disk.map(|(_, frozen)| SnapshotDisk { store, frozen })
    }

    fn apply(&self, ops: &[RemapOp], chain: &Chain) -> Result<()> {
        for op in ops {
            match *op {
                RemapOp::Drop { page, len } => self.ram().drop_pages(page, len)?,
                RemapOp::Map { page, len, layer, file_page } => {
                    let file = &chain
                        .layers()
                        .get(layer as usize)
                        .ok_or_else(|| Error::Config(format!("rollback plan names missing layer {layer}")))?
                        .file;
                    self.ram().map_pages(page, len, file, file_page)?;
                }
            }
        }
        Ok(())
    }
}

/// A branch of a running VM: the checkpoint taken of it and the children forked from it.
pub struct LiveFork {
    /// The checkpoint (call [`Checkpoint::wait`] to make it durable).
    pub checkpoint: Checkpoint,
    /// The snapshot the children came from.
    pub snapshot: Snapshot,
    /// Each child, or why it failed.
    pub children: Vec<Result<Vm>>,
}

/// Forks `n` children of `source` (paused by the caller) through checkpoint `name` in
/// `dir`. The source may run again once this returns; its pause is
/// `checkpoint.pause()`. A caller running the source on another thread resumes it right
/// after [`Vm::checkpoint`] and forks from [`Checkpoint::ready`] itself.
pub fn fork_live(
    source: &mut Vm,
    dir: &Path,
    name: &str,
    n: usize,
    pool: &mut ShellPool,
) -> Result<LiveFork> {
    let mut checkpoint = source.checkpoint(dir, name)?;
    let snapshot = checkpoint.ready()?;
    let children = fork(&snapshot, n, pool);
    Ok(LiveFork { checkpoint, snapshot, children })
}

#[cfg(test)]
mod tests {
    use super::fork_ranges;

    #[test]
    fn close_runs_share_a_fork_range() {
        assert_eq!(fork_ranges(&[(0, 2), (10, 1), (200, 3)], 64), vec![(0, 11), (200, 3)]);
    }
}
