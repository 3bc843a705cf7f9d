//! Moving a frozen disk chain from one layer store to another, so that a snapshot and each
//! VM restored from it own the layers they need: removing the source sandbox (and its
//! store) then takes nothing a snapshot or a child still reads.
//!
//! Frozen layers never change, so they are shared by hard link (copied only across
//! filesystems); the chain's manifest is copied atomically, and the target store opens the
//! imported chain with all of its usual checks before anyone uses it.

use super::error::{LinuxError, LinuxResult};
use crate::disk::DiskError;
use branchbox_disk::Store;
use std::fs::File;
use std::io::Write;
use std::path::Path;

fn layers(store: &Path) -> impl FnOnce(branchbox_disk::LayerError) -> LinuxError + '_ {
    move |source| LinuxError::Vmm(DiskError::Layers { store: store.to_owned(), source }.at_restore())
}

fn io(path: &Path, what: &str, e: std::io::Error) -> LinuxError {
    LinuxError::Device { what: "the disk store", detail: format!("cannot {what} {}: {e}", path.display()) }
}

/// Records frozen chain `name` of `from` in the store at `to` (created if missing) under the
/// same name; returns that store. A chain of that name already in `to` is refused.
pub(super) fn import_frozen(from: &Store, name: &str, to: &Path) -> LinuxResult<Store> {
    let frozen = from.open_frozen(name).map_err(layers(from.root()))?;
    let target = Store::open(to).map_err(layers(to))?;
    if target.has_chain(name).map_err(layers(to))? {
        return Err(layers(to)(branchbox_disk::LayerError::ChainExists { name: name.to_string() }));
    }
    for id in frozen.layer_ids() {
        let file = format!("{id:016x}.layer");
        let (src, dst) = (from.root().join("layers").join(&file), to.join("layers").join(&file));
        if dst.exists() {
            continue;
        }
        if std::fs::hard_link(&src, &dst).is_err() {
            std::fs::copy(&src, &dst).map_err(|e| io(&dst, "copy a layer to", e))?;
            File::open(&dst).and_then(|f| f.sync_all()).map_err(|e| io(&dst, "fsync", e))?;
        }
    }
    let manifest = format!("{name}.json");
    let bytes = std::fs::read(from.root().join("chains").join(&manifest))
        .map_err(|e| io(from.root(), "read a manifest in", e))?;
    let chains = to.join("chains");
    let tmp = chains.join(format!(".{manifest}.tmp"));
    let write = || -> std::io::Result<()> {
        let mut f = File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, chains.join(&manifest))?;
        File::open(to.join("layers"))?.sync_all()?;
        File::open(&chains)?.sync_all()
    };
    write().map_err(|e| io(&chains, "write a manifest in", e))?;
    target.open_frozen(name).map_err(layers(to))?;
    Ok(target)
}
