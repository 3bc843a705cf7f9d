//! [`LayeredBackend`]: a writable top layer over a [`FrozenChain`], as a block device's
//! storage, with freeze and rollback.
//!
//! Write ordering (what makes a SIGKILL at any instant leave a top that reopens consistent):
//! a write to a cluster the top already holds overwrites that cluster in place, one `pwrite`
//! per cluster, so a cluster is wholly old or new. The first write to a cluster copies it up:
//! the whole new cluster is written to the next free data cluster of the top, and its index
//! slot is written only by the next flush, after an `fdatasync` has made the data durable,
//! then synced again. So a slot on disk never names data that is not there; a torn slot
//! fails its checksum and ends the valid prefix on reopen. A cluster first written after the
//! last flush reads back as its old content after a crash; everything flushed is there.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::block::{cluster_pieces, BlockBackend, CLUSTER_SIZE, SECTOR_SIZE};
use crate::chain::FrozenChain;
use crate::format::{encode_entry, slot_offset};
use crate::layer::{io_err, lock, unlock, LayerFile};
use crate::manifest::{id_text, DeltaRef, Manifest};
use crate::store::Store;
use crate::LayerError;

/// A disk: a frozen chain and this sandbox's own writable top layer.
pub struct LayeredBackend {
    store: Store,
    name: String,
    frozen: FrozenChain,
    top: LayerFile,
    /// Disk cluster of each of the top's data clusters, in slot order.
    held: Vec<u64>,
    /// Slot of each disk cluster the top holds.
    slots: HashMap<u64, u64>,
    /// Slots whose index entries are written (the rest are written by the next flush).
    durable: usize,
    scratch: Vec<u8>,
}

impl LayeredBackend {
    /// A backend over `frozen` with the already-locked top `top` holding `held`.
    pub(crate) fn new(
        store: Store,
        name: String,
        frozen: FrozenChain,
        top: LayerFile,
        held: Vec<u64>,
    ) -> Self {
        let slots = held.iter().enumerate().map(|(slot, &c)| (c, slot as u64)).collect();
        let durable = held.len();
        LayeredBackend {
            store,
            name,
            frozen,
            top,
            held,
            slots,
            durable,
            scratch: vec![0; CLUSTER_SIZE as usize],
        }
    }

    /// The chain's name in its store.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The frozen chain under the top.
    pub fn frozen(&self) -> &FrozenChain {
        &self.frozen
    }

    /// The top layer's id.
    pub fn top_id(&self) -> u64 {
        self.top.header.id
    }

    /// Clusters the top holds.
    pub fn top_clusters(&self) -> usize {
        self.held.len()
    }

    /// Freezes the disk at this instant: the top is flushed and becomes an immutable delta,
    /// and a fresh empty top is started over it; the chain's manifest names both before this
    /// returns. Returns the frozen chain, for a snapshot to record, fork or roll back to.
    ///
    /// The caller must have drained the device first (the VMM pauses the vCPUs and lets every
    /// in-flight block request complete): a request answered after the freeze lands in the
    /// new top, not in the snapshot.
    pub fn freeze(&mut self) -> Result<FrozenChain, LayerError> {
        self.frozen.check_room()?;
        self.flush().map_err(io_err("cannot flush top layer", &self.top.path))?;
        // A copy-up that failed part way may have left bytes past the last held cluster; a
        // delta has exactly the size its slots need.
        let end = self.top.data_at(self.held.len() as u64);
        self.top.file.set_len(end).map_err(io_err("cannot cut top layer", &self.top.path))?;
        let new_top = self.store.new_top(self.frozen.disk_size())?;
        let mut deltas = self.frozen.refs();
        deltas.push(DeltaRef { id: id_text(self.top.header.id), clusters: self.held.len() as u64 });
        let manifest = Manifest::new(
            self.frozen.base_path().to_owned(),
            self.frozen.disk_size(),
            deltas,
            Some(new_top.header.id),
        );
        if let Err(e) = self.store.write_manifest(&self.name, &manifest) {
            let _ = std::fs::remove_file(&new_top.path);
            return Err(e);
        }
        let old = std::mem::replace(&mut self.top, new_top);
        unlock(&old);
        let held = std::mem::take(&mut self.held);
        self.frozen = self.frozen.with(old, &held);
        self.slots.clear();
        self.durable = 0;
        Ok(self.frozen.clone())
    }

    /// Discards the top (every write since it was started) and starts a new empty top over
    /// `to`, which must come from the same store and have the same disk size. As with
    /// [`freeze`](Self::freeze), the device must be drained first.
    pub fn rollback(&mut self, to: &FrozenChain) -> Result<(), LayerError> {
        if to.store() != self.store.root() || to.disk_size() != self.frozen.disk_size() {
            return Err(LayerError::OtherChain {
                name: self.name.clone(),
                reason: format!(
                    "it is in {} with a {}-byte disk; this chain is in {} with a {}-byte disk",
                    to.store().display(),
                    to.disk_size(),
                    self.store.root().display(),
                    self.frozen.disk_size()
                ),
            });
        }
        let new_top = self.store.new_top(to.disk_size())?;
        let manifest =
            Manifest::new(to.base_path().to_owned(), to.disk_size(), to.refs(), Some(new_top.header.id));
        if let Err(e) = self.store.write_manifest(&self.name, &manifest) {
            let _ = std::fs::remove_file(&new_top.path);
            return Err(e);
        }
        let old = std::mem::replace(&mut self.top, new_top);
        // No manifest names the old top any more; were this removal lost to a crash, the
        // store's garbage list would name the file.
        let _ = std::fs::remove_file(&old.path);
        self.frozen = to.clone();
        self.held.clear();
        self.slots.clear();
        self.durable = 0;
        Ok(())
    }

    fn check_range(&self, sector: u64, len: usize) -> io::Result<u64> {
        let offset = sector
            .checked_mul(SECTOR_SIZE)
            .filter(|o| o.checked_add(len as u64).is_some_and(|e| e <= self.frozen.disk_size()));
        offset.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "request past the end of the disk"))
    }
}

/// Opening a chain's disk: a new chain, an existing one, or children of a frozen chain.
impl LayeredBackend {
    /// Creates chain `name`: the read-only `base` disk under a new empty top.
    pub fn create(store: &Store, name: &str, base: &Path) -> Result<LayeredBackend, LayerError> {
        let base = std::fs::canonicalize(base).map_err(io_err("cannot find base disk", base))?;
        let size = std::fs::metadata(&base).map_err(io_err("cannot stat base disk", &base))?.len();
        let manifest = Manifest::new(base, size, Vec::new(), None);
        let frozen =
            FrozenChain::open(store.root(), &store.layers(), &manifest, &store.manifest_path(name)?)?;
        // A chain over a base alone is a fork of one from the bare base.
        Self::fork(store, &frozen, &[name])?
            .pop()
            .ok_or_else(|| LayerError::NoChain { name: name.to_string() })
    }

    /// Opens chain `name` for reading and writing: its frozen layers and its top, which this
    /// process then holds locked.
    pub fn open(store: &Store, name: &str) -> Result<LayeredBackend, LayerError> {
        let (manifest, path) = store.load(name)?;
        let top = manifest.top_id(&path)?.ok_or_else(|| LayerError::NoTop { name: name.to_string() })?;
        let frozen = FrozenChain::open(store.root(), &store.layers(), &manifest, &path)?;
        let (top, held) = LayerFile::open_top(&store.layers(), top, manifest.disk_size)?;
        lock(&top.file, &top.path)?;
        Ok(Self::new(store.clone(), name.to_string(), frozen, top, held))
    }

    /// Forks: one new chain per name, each a new empty top over `frozen`. The children share
    /// the frozen layers and their merged index, never a writable layer. All or none: a name
    /// already taken (or given twice) or a failure part way leaves no child behind.
    pub fn fork(
        store: &Store,
        frozen: &FrozenChain,
        names: &[&str],
    ) -> Result<Vec<LayeredBackend>, LayerError> {
        store.check_own(frozen)?;
        for (i, name) in names.iter().enumerate() {
            if store.has_chain(name)? || names[..i].contains(name) {
                return Err(LayerError::ChainExists { name: name.to_string() });
            }
        }
        let mut tops = Vec::with_capacity(names.len());
        let mut written = Vec::with_capacity(names.len());
        if let Err(e) = store.fork_files(frozen, names, &mut tops, &mut written) {
            for path in written.iter().chain(tops.iter().map(|t: &LayerFile| &t.path)) {
                let _ = std::fs::remove_file(path);
            }
            return Err(e);
        }
        Ok(tops
            .into_iter()
            .zip(names)
            .map(|(top, name)| Self::new(store.clone(), name.to_string(), frozen.clone(), top, Vec::new()))
            .collect())
    }
}

impl BlockBackend for LayeredBackend {
    fn sectors(&self) -> u64 {
        self.frozen.disk_size() / SECTOR_SIZE
    }

    fn read(&mut self, sector: u64, buf: &mut [u8]) -> io::Result<()> {
        let offset = self.check_range(sector, buf.len())?;
        for (cluster, within, at, len) in cluster_pieces(offset, buf.len()) {
            let part = &mut buf[at..at + len];
            match self.slots.get(&cluster) {
                Some(&slot) => self.top.file.read_exact_at(part, self.top.data_at(slot) + within)?,
                None => self.frozen.read(cluster, within, part)?,
            }
        }
        Ok(())
    }

    fn write(&mut self, sector: u64, data: &[u8]) -> io::Result<()> {
        let offset = self.check_range(sector, data.len())?;
        for (cluster, within, at, len) in cluster_pieces(offset, data.len()) {
            let part = &data[at..at + len];
            if let Some(&slot) = self.slots.get(&cluster) {
                self.top.file.write_all_at(part, self.top.data_at(slot) + within)?;
                continue;
            }
            if len as u64 != CLUSTER_SIZE {
                self.frozen.read(cluster, 0, &mut self.scratch)?;
            }
            self.scratch[within as usize..within as usize + len].copy_from_slice(part);
            let slot = self.held.len() as u64;
            self.top.file.write_all_at(&self.scratch, self.top.data_at(slot))?;
            self.held.push(cluster);
            self.slots.insert(cluster, slot);
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.top.file.sync_data()?;
        if self.durable == self.held.len() {
            return Ok(());
        }
        let id = self.top.header.id;
        let entries: Vec<u8> = (self.durable..self.held.len())
            .flat_map(|slot| encode_entry(id, slot as u64, self.held[slot]))
            .collect();
        self.top.file.write_all_at(&entries, slot_offset(self.durable as u64))?;
        self.top.file.sync_data()?;
        self.durable = self.held.len();
        Ok(())
    }
}

impl Drop for LayeredBackend {
    /// A backend closed without a crash keeps every write: its pending slots are written.
    fn drop(&mut self) {
        let _ = self.flush();
    }
}
