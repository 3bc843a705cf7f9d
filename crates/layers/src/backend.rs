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
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

use branchbox_virtio::blk::{cluster_pieces, BlockBackend, CLUSTER_SIZE, SECTOR_SIZE};

use crate::chain::FrozenChain;
use crate::format::{encode_entry, slot_offset};
use crate::layer::{io_err, LayerFile};
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

/// How long [`lock`] waits for a holder that is letting go.
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_millis(250);

/// Takes the exclusive lock that says a process has this top open for writing. A lock that
/// is held is retried for [`LOCK_PATIENCE`]: a handle just closed releases it only once every
/// copy of its open file is gone (a child forked by another thread holds one until it execs),
/// while a real writer holds it for the life of its VM and is still refused.
pub(crate) fn lock(file: &File, path: &Path) -> Result<(), LayerError> {
    let deadline = std::time::Instant::now() + LOCK_PATIENCE;
    loop {
        // SAFETY: flock on a descriptor the caller owns; no memory is passed.
        let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(io_err("cannot lock top layer", path)(err));
        }
        if std::time::Instant::now() >= deadline {
            return Err(LayerError::TopInUse { path: path.display().to_string() });
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

fn unlock(layer: &LayerFile) {
    // SAFETY: as in `lock`. Failing to unlock only keeps a frozen layer locked until close.
    unsafe { libc::flock(layer.file.as_raw_fd(), libc::LOCK_UN) };
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
