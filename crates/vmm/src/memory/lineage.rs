//! What a VM's RAM is mapped from: the layer chain under it, the chain its next checkpoint
//! extends, and the pages it dirtied since. The VM holds it; checkpoints and rollbacks
//! (`checkpoint`) read and advance it.

use super::layers::writer::Writer;
use super::layers::Chain;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The layers under a VM's RAM and what it dirtied since they were mapped.
pub(crate) struct Lineage {
    /// Directory holding the chain's layers.
    pub(crate) dir: PathBuf,
    /// The chain the next checkpoint extends.
    pub(crate) head: Arc<Chain>,
    /// The chain the RAM mapping shows (apart from private copies).
    pub(crate) mapped: Arc<Chain>,
    /// Pages written since `mapped` was mapped that earlier checkpoints already harvested
    /// from the dirty log (sorted): they may hold private copies.
    pub(crate) dirty: Vec<u64>,
    /// Whether KVM dirty logging is on; off until the first delta checkpoint, which takes
    /// its dirty set from `/proc/self/pagemap` instead (valid while `head` is `mapped`).
    pub(crate) logging: bool,
    /// The writer of `head`'s newest layer (and that layer's name), while it may still run.
    pub(crate) writer: Option<(Writer, String)>,
    /// Pages taken from the dirty log (or the host's record) by a checkpoint that failed
    /// before its writer started: the next checkpoint must capture them.
    pub(crate) carry: Vec<u64>,
}

impl Lineage {
    /// A VM whose RAM was just mapped from `chain` in `dir`.
    pub(crate) fn new(dir: &Path, chain: &Arc<Chain>) -> Lineage {
        Lineage {
            dir: dir.to_path_buf(),
            head: Arc::clone(chain),
            mapped: Arc::clone(chain),
            dirty: Vec::new(),
            logging: false,
            writer: None,
            carry: Vec::new(),
        }
    }

    /// Whether the next checkpoint may extend `head` with a delta: every layer of it is in
    /// the directory under its name, apart from the newest one while its writer still runs.
    /// Not so when a writer failed (its layer never got its name) or garbage collection
    /// removed a layer no snapshot named any more (`snapshot::lifecycle`); the checkpoint
    /// then writes a full base layer instead of naming a missing one. Called under the
    /// directory's shared lock, so collection cannot run meanwhile.
    pub(crate) fn chain_intact(&self) -> bool {
        let pending = match &self.writer {
            Some((w, layer)) => match w.poll() {
                None => Some(layer.as_str()),
                Some(Ok(())) => None,
                Some(Err(_)) => return false,
            },
            None => None,
        };
        self.head.layers().iter().all(|l| Some(l.name.as_str()) == pending || self.dir.join(&l.name).exists())
    }
}
