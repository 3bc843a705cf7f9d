//! Differences between the files of two snapshots.
//!
//! A gVisor snapshot keeps its files inside the checkpoint's in-memory overlay, which only
//! gVisor can read. So the first diff of a snapshot starts it once, headless, walks its tree
//! through the agent and stores the listing as `manifest.json` beside the checkpoint; every
//! later diff reads the stored listings only. A file counts as changed when its type, size,
//! permissions or modification time differ; a directory when its type or permissions do. The identity files the after-fork hook writes
//! (`/etc/machine-id`, `/etc/hostname`, `/run/branchbox`) are left out.

use crate::engine::Engine;
use branchbox_model::{Error, Result, SnapshotId};
use branchbox_protocol::{FileKind, FileStat};
use serde::Serialize;
use std::collections::BTreeMap;

/// Directories never walked: kernel views, not files.
pub const NOT_WALKED: [&str; 3] = ["/proc", "/sys", "/dev"];
/// Paths the after-fork hook rewrites in every copy.
const IDENTITY: [&str; 4] =
    ["/etc/machine-id", "/etc/hostname", "/run/branchbox", "/run/branchbox/sandbox-id"];

/// What changed from one snapshot to another.
#[derive(Debug, Serialize)]
pub struct Diff {
    /// The older side.
    pub from: SnapshotId,
    /// The newer side.
    pub to: SnapshotId,
    /// Paths only in `to`.
    pub added: Vec<String>,
    /// Paths only in `from`.
    pub removed: Vec<String>,
    /// Paths in both whose type, size, mode or mtime differ.
    pub changed: Vec<String>,
}

fn index(entries: Vec<FileStat>) -> BTreeMap<String, FileStat> {
    entries
        .into_iter()
        .filter(|e| !IDENTITY.contains(&e.name.as_str()))
        .map(|e| (e.name.clone(), e))
        .collect()
}

/// A directory changes with every entry added or removed below it, which the listing already
/// shows; directories count as changed only when their type or permissions do.
fn differs(o: &FileStat, n: &FileStat) -> bool {
    if o.kind == FileKind::Dir && n.kind == FileKind::Dir {
        return o.mode != n.mode;
    }
    (o.kind, o.size, o.mode, o.mtime_ns) != (n.kind, n.size, n.mode, n.mtime_ns)
}

/// Compares the files of two snapshots (ids, names or refs).
pub fn diff(engine: &Engine, from: &str, to: &str) -> Result<Diff> {
    let (a, b) = (engine.find_snapshot(from)?, engine.find_snapshot(to)?);
    for s in [&a, &b] {
        if s.deleted_ms.is_some() {
            return Err(Error::Conflict(format!("snapshot {} was deleted; its files are gone", s.id)));
        }
    }
    let (old, new) = (index(engine.manifest(&a)?), index(engine.manifest(&b)?));
    let added = new.keys().filter(|k| !old.contains_key(*k)).cloned().collect();
    let removed = old.keys().filter(|k| !new.contains_key(*k)).cloned().collect();
    let changed = new
        .iter()
        .filter(|(k, n)| old.get(*k).is_some_and(|o| differs(o, n)))
        .map(|(k, _)| k.clone())
        .collect();
    Ok(Diff { from: a.id, to: b.id, added, removed, changed })
}
