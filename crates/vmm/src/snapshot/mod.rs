//! Snapshots: the files that hold a VM's state, opened for restoring.
//!
//! A snapshot directory (a store) holds state files (`<name>.state`, format in [`format`];
//! [`STATE_FILE`] is the default one) and the memory layer files they name by relative name;
//! checkpoints of one VM share the layers of their chain in one directory. The state is a tree that mirrors the VM:
//! [`MachineState`] holds the VM-wide KVM state, every vCPU's state, the memory's layer
//! reference and every device's state, each produced by that part's
//! [`Snapshottable`](branchbox_persist::Snapshottable) impl.
//! Removing snapshots, flattening chains and collecting unused layers: [`lifecycle`].
//! A VM with a disk also has the disk frozen at the snapshot's instant: a frozen chain in
//! the disk's layer store, which the state file names (`MachineState::disk`,
//! docs/disk-layers.md "In the VMM").

pub mod format;
pub mod lifecycle;
mod state;

pub use state::MachineState;

use crate::disk::{DiskError, SnapshotDisk};
use crate::error::{Error, Result};
use crate::memory::layers::Chain;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Name of the default state file inside a snapshot directory.
pub const STATE_FILE: &str = "vm.state";
/// Name of the snapshot [`STATE_FILE`] holds.
pub const DEFAULT_NAME: &str = "vm";
/// Extension of state files.
pub const STATE_EXT: &str = "state";

/// A snapshot opened for restoring: its state parsed and checked, its layer chain opened
/// and its merged page index built.
///
/// Opening is done once; every child forked from it reuses the parsed state, the open
/// layer files and the index, so the spawn path neither parses nor opens anything.
pub struct Snapshot {
    dir: PathBuf,
    name: String,
    state: MachineState,
    chain: Arc<Chain>,
    disk: Option<SnapshotDisk>,
}

/// Whether `name` can name a snapshot: letters, digits, `-` and `_`, 1 to 128 of them.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// File name of the state file of snapshot `name`.
pub fn state_file_name(name: &str) -> String {
    format!("{name}.{STATE_EXT}")
}

impl Snapshot {
    /// Reads and checks `dir/vm.state` and opens the memory layers it names.
    pub fn open(dir: &Path) -> Result<Snapshot> {
        Snapshot::open_named(dir, DEFAULT_NAME)
    }

    /// Reads and checks `dir/<name>.state` and opens the memory layers it names.
    pub fn open_named(dir: &Path, name: &str) -> Result<Snapshot> {
        if !valid_name(name) {
            return Err(Error::Config(format!("{name:?} is not a snapshot name (letters, digits, - and _)")));
        }
        let path = dir.join(state_file_name(name));
        let state = format::read_state_file(&path)?;
        let chain = Chain::open(dir, &state.memory.layers, state.memory.size)?;
        let disk = match &state.disk {
            Some(d) => Some(SnapshotDisk::open(d).map_err(|e: DiskError| Error::SnapshotCorrupt {
                path: path.clone(),
                reason: format!(
                    "its disk (frozen chain {} in {}) cannot be opened: {e}",
                    d.frozen,
                    d.store.display()
                ),
            })?),
            None => None,
        };
        Ok(Snapshot::from_parts(dir, name, state, Arc::new(chain), disk))
    }

    /// A snapshot whose state, chain and disk are already in memory (a checkpoint just
    /// taken).
    pub(crate) fn from_parts(
        dir: &Path,
        name: &str,
        state: MachineState,
        chain: Arc<Chain>,
        disk: Option<SnapshotDisk>,
    ) -> Snapshot {
        Snapshot { dir: dir.to_path_buf(), name: name.to_string(), state, chain, disk }
    }

    /// Names of the complete snapshots in `dir`, sorted: state files that parse and whose
    /// layers are all present and well-formed. Leftovers of an interrupted write (`.tmp`
    /// files, layers no state file names) are not snapshots and are not listed.
    pub fn list(dir: &Path) -> Result<Vec<String>> {
        let entries = std::fs::read_dir(dir).map_err(|source| Error::SnapshotIo {
            path: dir.to_path_buf(),
            op: "list",
            source,
        })?;
        let mut names = Vec::new();
        for entry in entries.flatten() {
            let file = entry.file_name();
            let Some(name) = file.to_str().and_then(|f| f.strip_suffix(&format!(".{STATE_EXT}"))) else {
                continue;
            };
            if valid_name(name) && Snapshot::open_named(dir, name).is_ok() {
                names.push(name.to_string());
            }
        }
        names.sort();
        Ok(names)
    }

    /// The snapshot directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The snapshot's name (its state file is `<name>.state`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The parsed machine state.
    pub fn state(&self) -> &MachineState {
        &self.state
    }

    /// The opened memory layer chain.
    pub fn chain(&self) -> &Arc<Chain> {
        &self.chain
    }

    /// The disk's frozen chain, opened, for a snapshot of a VM with a disk.
    pub(crate) fn disk(&self) -> Option<&SnapshotDisk> {
        self.disk.as_ref()
    }

    /// The disk's frozen chain: its store and its name there (`None` without a disk). Its
    /// layers are kept while this snapshot exists: [`Snapshot::remove`] removes the chain.
    pub fn disk_ref(&self) -> Option<&crate::disk::DiskRef> {
        self.state.disk.as_ref()
    }

    /// Reads every layer of the chain in full and checks its checksum (on demand; reads all
    /// of RAM, so never on the spawn path).
    pub fn verify(&self) -> Result<()> {
        self.chain.verify()
    }
}
