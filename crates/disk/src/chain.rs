//! A frozen chain (base plus immutable deltas) opened once, with one merged index: for every
//! cluster of the disk, the newest layer holding it and where. A lookup is one array read at
//! any depth. The open chain is shared (`Arc`) by every top over it: a fork of N children
//! builds nothing.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::block::CLUSTER_SIZE;

use crate::format::MAX_DISK_SIZE;
use crate::layer::{io_err, LayerFile};
use crate::manifest::{id_text, DeltaRef, Manifest, MAX_DEPTH};
use crate::LayerError;

/// Bits of a merged-index entry that hold the slot; the layer number is above them.
const SLOT_BITS: u32 = 48;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;

struct Delta {
    layer: LayerFile,
    clusters: u64,
}

struct Layers {
    /// The store the layers live in (a chain is only used with its own store).
    store: PathBuf,
    base: Arc<File>,
    base_path: PathBuf,
    disk_size: u64,
    deltas: Vec<Arc<Delta>>,
    /// Per disk cluster: 0 for the base, else `(delta number, 1-based) << 48 | slot`.
    index: Vec<u64>,
}

/// A base with its frozen deltas, opened, with the merged index built. Cloning is cheap and
/// shares everything.
#[derive(Clone)]
pub struct FrozenChain(Arc<Layers>);

impl FrozenChain {
    /// Opens the base and the deltas `manifest` names from the store at `store` (layer files
    /// in `layers`), checking every layer against the manifest and the disk size.
    pub(crate) fn open(
        store: &Path,
        layers: &Path,
        manifest: &Manifest,
        path: &Path,
    ) -> Result<FrozenChain, LayerError> {
        let base_path = manifest.base.clone();
        let base = File::open(&base_path).map_err(io_err("cannot open base disk", &base_path))?;
        let size = base.metadata().map_err(io_err("cannot stat base disk", &base_path))?.len();
        if size != manifest.disk_size || size % CLUSTER_SIZE != 0 || size == 0 || size > MAX_DISK_SIZE {
            return Err(LayerError::BaseSize {
                path: base_path.display().to_string(),
                size,
                chain: manifest.disk_size,
            });
        }
        let mut chain = Layers {
            store: store.to_owned(),
            base: Arc::new(base),
            base_path,
            disk_size: size,
            deltas: Vec::new(),
            index: vec![0; (size / CLUSTER_SIZE) as usize],
        };
        for (id, clusters) in manifest.delta_ids(path)? {
            let (layer, held) = LayerFile::open_delta(layers, id, clusters, size)?;
            chain.push(layer, &held);
        }
        Ok(FrozenChain(Arc::new(chain)))
    }

    /// This chain with `layer` (holding `held`, slot by slot) frozen on top: the merged
    /// index is copied once and updated with the new layer's clusters.
    /// The caller checks the depth limit first ([`FrozenChain::check_room`]).
    pub(crate) fn with(&self, layer: LayerFile, held: &[u64]) -> FrozenChain {
        let old = &self.0;
        let mut chain = Layers {
            store: old.store.clone(),
            base: old.base.clone(),
            base_path: old.base_path.clone(),
            disk_size: old.disk_size,
            deltas: old.deltas.clone(),
            index: old.index.clone(),
        };
        chain.push(layer, held);
        FrozenChain(Arc::new(chain))
    }

    /// Whether one more delta fits under [`MAX_DEPTH`].
    pub(crate) fn check_room(&self) -> Result<(), LayerError> {
        let depth = self.0.deltas.len() + 1;
        if depth > MAX_DEPTH {
            return Err(LayerError::TooDeep { depth, limit: MAX_DEPTH });
        }
        Ok(())
    }

    /// Number of deltas over the base.
    pub fn depth(&self) -> usize {
        self.0.deltas.len()
    }

    /// The disk's size in bytes.
    pub fn disk_size(&self) -> u64 {
        self.0.disk_size
    }

    /// The deltas' layer ids, oldest first.
    pub fn layer_ids(&self) -> Vec<u64> {
        self.0.deltas.iter().map(|d| d.layer.header.id).collect()
    }

    pub(crate) fn store(&self) -> &Path {
        &self.0.store
    }

    pub(crate) fn base_path(&self) -> &Path {
        &self.0.base_path
    }

    /// The manifest entries of the deltas.
    pub(crate) fn refs(&self) -> Vec<DeltaRef> {
        self.0
            .deltas
            .iter()
            .map(|d| DeltaRef { id: id_text(d.layer.header.id), clusters: d.clusters })
            .collect()
    }

    /// Whether any delta holds disk cluster `cluster` (flatten copies only those).
    pub(crate) fn in_deltas(&self, cluster: u64) -> bool {
        self.0.index.get(cluster as usize).is_some_and(|&e| e != 0)
    }

    /// Reads `buf` from byte `within` of disk cluster `cluster` (the range stays in the
    /// cluster) from the newest layer that holds it.
    pub(crate) fn read(&self, cluster: u64, within: u64, buf: &mut [u8]) -> io::Result<()> {
        let entry = *self
            .0
            .index
            .get(cluster as usize)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        if entry == 0 {
            return self.0.base.read_exact_at(buf, cluster * CLUSTER_SIZE + within);
        }
        let delta = &self.0.deltas[(entry >> SLOT_BITS) as usize - 1];
        delta.layer.file.read_exact_at(buf, delta.layer.data_at(entry & SLOT_MASK) + within)
    }
}

impl Layers {
    fn push(&mut self, layer: LayerFile, held: &[u64]) {
        let number = self.deltas.len() as u64 + 1;
        for (slot, &cluster) in held.iter().enumerate() {
            // Every cluster was checked below the disk's size when the index was read.
            if let Some(e) = self.index.get_mut(cluster as usize) {
                *e = number << SLOT_BITS | slot as u64;
            }
        }
        self.deltas.push(Arc::new(Delta { layer, clusters: held.len() as u64 }));
    }
}
