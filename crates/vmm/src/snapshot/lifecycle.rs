//! The life of a snapshot directory's files: removing a snapshot, flattening its chain into
//! one base layer, and collecting what no snapshot names.
//!
//! Layers are shared: a state file names every layer of its chain, so a layer is in use
//! while any state file in the directory names it (its reference count is the number of
//! state files naming it). Removing a snapshot removes only its state file;
//! [`collect_garbage`] then removes the layers no state file names and the leftovers of
//! interrupted writes.
//!
//! Checkpoints and flattening hold a shared lock on the directory's [`LOCK_FILE`] from
//! before they create files until their state file is in place (a checkpoint's writer
//! process inherits it and holds it until it exits); collection holds it exclusively, so it
//! never takes a layer whose state file is still being written. A running VM keeps mapping
//! layers whose names were removed (the kernel keeps open files alive); their space is freed
//! when the last VM lets go.

use super::{format, state_file_name, valid_name, Snapshot, STATE_EXT};
use crate::error::{Error, Result};
use crate::memory::layers::{LayerKind, LayerRef};
use crate::memory::{new_layer_name, sync_dir, write_atomic, GuestRam};
use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// The lock file inside a snapshot directory.
pub const LOCK_FILE: &str = ".lock";

/// A `flock` on a snapshot directory's [`LOCK_FILE`], released when the last process holding
/// the open file (a forked writer inherits it) closes it.
pub(crate) struct DirLock {
    _file: File,
}

impl DirLock {
    /// Shared: files are being written into the directory.
    pub(crate) fn shared(dir: &Path) -> Result<DirLock> {
        DirLock::take(dir, libc::LOCK_SH)
    }

    /// Exclusive: no file is being written; waits for every shared holder.
    fn exclusive(dir: &Path) -> Result<DirLock> {
        DirLock::take(dir, libc::LOCK_EX)
    }

    fn take(dir: &Path, op: libc::c_int) -> Result<DirLock> {
        let path = dir.join(LOCK_FILE);
        let io = |op| {
            let path = path.clone();
            move |source| Error::SnapshotIo { path, op, source }
        };
        let file =
            OpenOptions::new().create(true).truncate(false).write(true).open(&path).map_err(io("open"))?;
        loop {
            // SAFETY: flock on a descriptor this function owns.
            if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
                return Ok(DirLock { _file: file });
            }
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EINTR) {
                return Err(io("lock")(err));
            }
        }
    }
}

/// What [`collect_garbage`] removed (or, on a dry run, would remove).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Collected {
    /// Memory layers no state file names, by file name, sorted.
    pub layers: Vec<String>,
    /// Temporary files of writes that never finished (a killed writer), sorted.
    pub leftovers: Vec<String>,
    /// Bytes those files held on disk.
    pub bytes: u64,
}

/// Whether `name` is a memory layer file this crate writes (`mem-*.layer` / `mem-*.delta`).
fn is_layer_name(name: &str) -> bool {
    name.starts_with("mem-") && (name.ends_with(".layer") || name.ends_with(".delta"))
}

/// Removes from `dir` the memory layers no state file names and the temporary files of
/// interrupted writes, after every checkpoint still being written into `dir` has finished
/// (and while none starts). With `dry_run` nothing is removed. A state file that cannot be
/// read stops the collection with its error: nobody could tell which layers it needs.
pub fn collect_garbage(dir: &Path, dry_run: bool) -> Result<Collected> {
    let _lock = DirLock::exclusive(dir)?;
    let entries = std::fs::read_dir(dir).map_err(|source| Error::SnapshotIo {
        path: dir.to_path_buf(),
        op: "list",
        source,
    })?;
    let mut named = BTreeSet::new();
    let mut layers = BTreeSet::new();
    let mut leftovers = BTreeSet::new();
    for entry in entries.flatten() {
        let Some(name) = entry.file_name().to_str().map(str::to_string) else { continue };
        if name.strip_suffix(&format!(".{STATE_EXT}")).is_some_and(valid_name) {
            let state = format::read_state_file(&entry.path())?;
            named.extend(state.memory.layers.into_iter().map(|l| l.name));
        } else if name.starts_with('.') && name.ends_with(".tmp") {
            leftovers.insert(name);
        } else if is_layer_name(&name) {
            layers.insert(name);
        }
    }
    let mut out = Collected {
        layers: layers.difference(&named).cloned().collect(),
        leftovers: leftovers.into_iter().collect(),
        bytes: 0,
    };
    for name in out.layers.iter().chain(&out.leftovers) {
        let path = dir.join(name);
        out.bytes += std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        if !dry_run {
            std::fs::remove_file(&path).map_err(|source| Error::SnapshotIo { path, op: "remove", source })?;
        }
    }
    let removed_any = !out.layers.is_empty() || !out.leftovers.is_empty();
    if !dry_run && removed_any {
        sync_dir(dir)?;
    }
    Ok(out)
}

impl Snapshot {
    /// Removes snapshot `name` from `dir`: its state file, then its disk's frozen chain (the
    /// manifest in the disk's store; a snapshot that cannot be read has its state file
    /// removed all the same). Its layers stay while other snapshots (or, for the disk, other
    /// chains: children forked from it) name them; [`collect_garbage`] frees the memory
    /// layers, `branchbox_disk::Store::unreferenced_layers` lists the disk's. VMs already
    /// restored from it are unaffected.
    pub fn remove(dir: &Path, name: &str) -> Result<()> {
        if !valid_name(name) {
            return Err(Error::Config(format!("{name:?} is not a snapshot name (letters, digits, - and _)")));
        }
        let path = dir.join(state_file_name(name));
        // A store that is not a directory (any more) holds nothing to remove.
        let disk = format::read_state_file(&path).ok().and_then(|s| s.disk);
        std::fs::remove_file(&path).map_err(|source| Error::SnapshotIo { path, op: "remove", source })?;
        sync_dir(dir)?;
        // After the state file: a crash in between leaves a frozen chain no snapshot names,
        // which only keeps its layers, never a snapshot whose disk is gone.
        if let Some(disk) = disk {
            // A store that is gone holds nothing to remove.
            let Ok(store) = crate::disk::existing_store(&disk.store) else { return Ok(()) };
            match store.remove_chain(&disk.frozen) {
                Ok(()) | Err(branchbox_disk::LayerError::NoChain { .. }) => {}
                Err(e) => {
                    return Err(Error::Checkpoint(format!(
                        "snapshot {name} is removed, but its disk's frozen chain {} in {} is not: {e}; \
                         remove it from the store",
                        disk.frozen,
                        disk.store.display()
                    )))
                }
            }
        }
        Ok(())
    }

    /// Rewrites this snapshot's memory as one base layer holding what its chain shows and
    /// points its state file at it (replaced atomically): spawning from it then maps one
    /// layer, and the deltas it named become garbage unless other snapshots name them. Reads
    /// and writes all of RAM, so it is work for a background thread, never for the spawn
    /// path; VMs already running from the old chain, and checkpoints extending it, are
    /// unaffected. Returns the snapshot reopened.
    pub fn flatten(&self) -> Result<Snapshot> {
        let _lock = DirLock::shared(&self.dir)?;
        let chain = self.chain();
        let size = usize::try_from(chain.size())
            .map_err(|_| Error::Config("snapshot RAM does not fit this host".into()))?;
        let mut ram = GuestRam::from_layer(&chain.base_layer().file, size)?;
        ram.map_chain(chain)?;
        let layer = new_layer_name("layer");
        let crc32 = ram.write_layer(&self.dir, &layer)?;
        drop(ram);
        let mut state = self.state.clone();
        state.memory.layers = vec![LayerRef { name: layer, kind: LayerKind::Base { crc32 } }];
        let bytes = format::encode(&state)?;
        let state_name = state_file_name(&self.name);
        write_atomic(&self.dir, &state_name, &bytes).map_err(|source| Error::SnapshotIo {
            path: self.dir.join(&state_name),
            op: "write",
            source,
        })?;
        Snapshot::open_named(&self.dir, &self.name)
    }
}
