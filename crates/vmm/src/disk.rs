//! A VM's disk: a virtio-blk device on the MMIO bus whose storage is a copy-on-write chain
//! in a `branchbox-disk` store (docs/disk-layers.md, "In the VMM").
//!
//! The device's top layer is this VM's alone. A snapshot freezes it at the pause instant and
//! records the frozen chain in the store under a name the state file keeps; a restored or
//! forked VM gets a new empty top over that frozen chain; a rollback discards the top and
//! starts a new one over the target's frozen chain.
//!
//! Nothing is in flight at a freeze or rollback: the transport serves a queue notification
//! synchronously, on the thread that delivered it (the vCPU's MMIO exit, or a host-side
//! driver's bus write), while holding the transport's lock, and answers every request it
//! took before it lets go. The VMM takes that same lock before freezing, so a notification
//! being served on another thread is waited out and no new one can start; with the vCPUs
//! stopped (the snapshot's precondition) none arrives afterwards.
//!
//! The device reaches guest RAM through a `vm-memory` view of the VM's own mapping, with a
//! dirty bitmap: what the device writes (read data, used rings) is a host write KVM's dirty
//! log does not see, so checkpoints take those pages from the bitmap.

use crate::error::Error;
use crate::memory::GuestRam;
use branchbox_devices::doorbell::{DOORBELL_BASE, DOORBELL_LEN};
use branchbox_disk::{BlockBackend, FrozenChain, LayerError, LayeredBackend, Store};
use branchbox_persist::RestoreError;
use branchbox_virtio::blk::Block;
use branchbox_virtio::mmio::{Interrupt, MmioTransport, MMIO_LEN};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use vm_memory::bitmap::AtomicBitmap;
use vm_memory::{GuestAddress, GuestMemoryMmap, GuestRegionMmap, MmapRegion};

/// Guest-physical address of the disk's virtio-mmio registers: the page after the doorbell.
pub const DISK_BASE: u64 = DOORBELL_BASE + DOORBELL_LEN;
/// Length of the disk's register window.
pub const DISK_LEN: u64 = MMIO_LEN;
/// The id the device answers `GET_ID` with.
const DISK_ID: &str = "branchbox-disk";

/// Guest RAM as the block device sees it: the VM's mapping, with a dirty bitmap.
pub type DiskMemory = Arc<GuestMemoryMmap<AtomicBitmap>>;
/// The disk's virtio-blk device on its transport.
pub type DiskTransport = MmioTransport<Block, DiskMemory>;

/// Why a disk could not be attached, frozen, rolled back or opened.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// The layer store refused or failed.
    #[error("disk store {store}: {source}")]
    Layers {
        /// The store's directory.
        store: PathBuf,
        /// What the store said.
        #[source]
        source: LayerError,
    },
    /// The VM has a disk already.
    #[error("the VM has a disk already (chain {chain}); a VM has one disk")]
    HasDisk {
        /// The chain of the disk it has.
        chain: String,
    },
    /// A snapshot names a store that is not one (no `layers` and `chains` directories).
    #[error(
        "disk store {store} named by the snapshot is not a layer store (an absolute directory \
         with layers/ and chains/); it was moved or removed"
    )]
    NoStore {
        /// The path the snapshot names.
        store: PathBuf,
    },
    /// The device could not be given a view of guest RAM.
    #[error("cannot give the block device a view of guest RAM: {0}")]
    Memory(String),
}

impl DiskError {
    fn layers(store: &Store) -> impl FnOnce(LayerError) -> DiskError + '_ {
        move |source| DiskError::Layers { store: store.root().to_owned(), source }
    }

    /// As a checkpoint's error.
    pub(crate) fn at_checkpoint(self) -> Error {
        Error::Checkpoint(format!("the disk could not be frozen with memory: {self}"))
    }

    /// As a restore's error.
    pub(crate) fn at_restore(self) -> Error {
        Error::Restore(RestoreError::new("disk", self.to_string()))
    }
}

/// What a snapshot records of the VM's disk: where its frozen chain is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskRef {
    /// The layer store's directory (absolute).
    pub store: PathBuf,
    /// The frozen chain in that store: the disk at the snapshot's instant.
    pub frozen: String,
}

/// A snapshot's disk, opened once and shared by every VM restored or forked from it.
#[derive(Clone)]
pub(crate) struct SnapshotDisk {
    pub store: Store,
    pub frozen: FrozenChain,
}

impl SnapshotDisk {
    /// Opens the frozen chain `disk` names.
    pub(crate) fn open(disk: &DiskRef) -> Result<SnapshotDisk, DiskError> {
        let store = existing_store(&disk.store)?;
        let frozen = store.open_frozen(&disk.frozen).map_err(DiskError::layers(&store))?;
        Ok(SnapshotDisk { store, frozen })
    }

    /// `n` new chains, each an empty top over this frozen chain, for `n` restored VMs: one
    /// `Store::fork`, so the store's directories are synced once for all of them.
    pub(crate) fn fork(&self, n: usize) -> Result<Vec<LayeredBackend>, Error> {
        let names = (0..n).map(|_| chain_name("vm")).collect::<Result<Vec<_>, Error>>()?;
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        LayeredBackend::fork(&self.store, &self.frozen, &names)
            .map_err(|e| DiskError::layers(&self.store)(e).at_restore())
    }
}

/// The VM's disk: the store, the backend the device writes through, and the device.
pub(crate) struct Disk {
    store: Store,
    name: String,
    backend: Arc<Mutex<LayeredBackend>>,
    transport: Arc<Mutex<DiskTransport>>,
    memory: DiskMemory,
    region: Arc<MmapRegion<AtomicBitmap>>,
}

/// The backend as the device holds it: the VMM keeps a second handle to freeze and roll it
/// back. The device locks it only while it serves a request.
pub(crate) struct Shared(pub(crate) Arc<Mutex<LayeredBackend>>);

impl BlockBackend for Shared {
    fn sectors(&self) -> u64 {
        lock(&self.0).sectors()
    }

    fn read(&mut self, sector: u64, buf: &mut [u8]) -> std::io::Result<()> {
        lock(&self.0).read(sector, buf)
    }

    fn write(&mut self, sector: u64, data: &[u8]) -> std::io::Result<()> {
        lock(&self.0).write(sector, data)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        lock(&self.0).flush()
    }
}

/// The device's interrupt. The VMs that carry a disk today (the synthetic guest, and a
/// host-side driver in tests) poll the used ring; the line is not wired to the guest.
struct Polled;

impl Interrupt for Polled {
    fn trigger(&self) -> std::io::Result<()> {
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Disk {
    /// The device over `backend` (a chain of `store`), reaching `ram`.
    pub(crate) fn new(ram: &GuestRam, store: Store, backend: LayeredBackend) -> Result<Disk, DiskError> {
        // SAFETY: `ram` is one mapping of `ram.size()` bytes that stays at this address for
        // the VM's life (restores and rollbacks re-map inside it with MAP_FIXED, never move
        // it); the region built here does not own it and never unmaps it, and the VM drops
        // the device before its RAM.
        let region = unsafe {
            MmapRegion::<AtomicBitmap>::build_raw(
                ram.host_addr() as *mut u8,
                ram.size(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_NORESERVE,
            )
        }
        .map_err(|e| DiskError::Memory(e.to_string()))?;
        let region = Arc::new(region);
        let guest = GuestRegionMmap::with_arc(Arc::clone(&region), GuestAddress(0))
            .ok_or_else(|| DiskError::Memory("guest RAM does not fit the address space".into()))?;
        let memory =
            GuestMemoryMmap::from_regions(vec![guest]).map_err(|e| DiskError::Memory(e.to_string()))?;
        let name = backend.name().to_string();
        let backend = Arc::new(Mutex::new(backend));
        let block = Block::new(Box::new(Shared(Arc::clone(&backend))), DISK_ID);
        let memory = Arc::new(memory);
        let transport = MmioTransport::new(block, Arc::clone(&memory), Box::new(Polled));
        Ok(Disk { store, name, backend, transport: Arc::new(Mutex::new(transport)), memory, region })
    }

    /// The device, for the MMIO bus and the device states.
    pub(crate) fn transport(&self) -> &Arc<Mutex<DiskTransport>> {
        &self.transport
    }

    /// The chain's name in its store.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The store.
    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// Guest RAM as the device sees it (writes through it are tracked).
    pub(crate) fn memory(&self) -> &DiskMemory {
        &self.memory
    }

    /// Guest pages the device (or anything writing through [`memory`](Self::memory)) wrote
    /// since the last call, sorted.
    pub(crate) fn take_dirty(&self) -> Vec<u64> {
        crate::memory::dirty::bitmap_pages(&self.region.bitmap().get_and_reset())
    }

    /// Freezes the disk now and records the frozen chain as `frozen` in the store. The
    /// caller has stopped the vCPUs; holding the transport's lock drains the device (see the
    /// module's comment).
    pub(crate) fn freeze(&self, frozen: &str) -> Result<(DiskRef, FrozenChain), DiskError> {
        let _drained = lock(&self.transport);
        let chain = lock(&self.backend).freeze().map_err(DiskError::layers(&self.store))?;
        self.store.save_frozen(frozen, &chain).map_err(DiskError::layers(&self.store))?;
        Ok((DiskRef { store: self.store.root().to_owned(), frozen: frozen.to_string() }, chain))
    }

    /// Discards every write since the top was started and starts a new top over `to`.
    pub(crate) fn rollback(&self, to: &FrozenChain) -> Result<(), DiskError> {
        let _drained = lock(&self.transport);
        lock(&self.backend).rollback(to).map_err(DiskError::layers(&self.store))
    }

    /// Removes the frozen chain `frozen` from the store (a checkpoint that failed after
    /// freezing). Its layers stay while another chain names them.
    pub(crate) fn forget(&self, frozen: &str) {
        // Best effort: a leftover manifest only keeps layers alive, and names no snapshot.
        let _ = self.store.remove_chain(frozen);
    }
}

/// Opens the store at `path` (absolute), which must exist: a path read from a state file
/// must not make `Store::open` create directories wherever it points.
pub(crate) fn existing_store(path: &Path) -> Result<Store, DiskError> {
    let is_store = path.is_absolute() && path.join("layers").is_dir() && path.join("chains").is_dir();
    if !is_store {
        return Err(DiskError::NoStore { store: path.to_owned() });
    }
    Store::open(path).map_err(|source| DiskError::Layers { store: path.to_owned(), source })
}

/// A fresh name for a chain or frozen chain: `prefix` and 16 random hex digits.
pub(crate) fn chain_name(prefix: &str) -> Result<String, Error> {
    Ok(format!("{prefix}-{:016x}", crate::random::random_id()?))
}

/// Opens `store` (a directory) and its chain `chain`.
pub(crate) fn open_chain(store: &Path, chain: &str) -> Result<(Store, LayeredBackend), DiskError> {
    let opened =
        Store::open(store).map_err(|source| DiskError::Layers { store: store.to_owned(), source })?;
    let backend = LayeredBackend::open(&opened, chain).map_err(DiskError::layers(&opened))?;
    Ok((opened, backend))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_path_from_a_state_file_creates_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let err = existing_store(dir.path()).expect_err("an empty directory is no store");
        assert!(matches!(err, DiskError::NoStore { .. }), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing was created");
        assert!(matches!(existing_store(Path::new("relative/store")), Err(DiskError::NoStore { .. })));
        Store::open(dir.path()).unwrap();
        existing_store(dir.path()).unwrap();
    }
}
