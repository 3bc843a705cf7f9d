//! The parsed manifests of the snapshots this node serves chunks of, kept between requests: a
//! pull asks for every chunk of a snapshot in turn, and each request would otherwise read and
//! parse the same manifest (up to 32 MiB) again. An entry is used only while the manifest file
//! is the one it was parsed from, so a snapshot pushed or pulled again is read again; at most
//! [`KEPT`] are kept, the least recently used going first.

use branchbox_model::SnapshotId;
use std::collections::VecDeque;
use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

/// Most manifests kept. Each holds one entry per distinct chunk: some 16 000 for a 16 GiB
/// snapshot at the average chunk size, a few MiB.
pub const KEPT: usize = 16;

/// What tells one manifest file from the next. A push or pull writes a new file into place (a
/// rename: a new inode), and any write in place moves the change time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileIdentity {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl FileIdentity {
    fn of(m: &Metadata) -> FileIdentity {
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        FileIdentity {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime_ns: ns(m.mtime(), m.mtime_nsec()),
            ctime_ns: ns(m.ctime(), m.ctime_nsec()),
        }
    }
}

/// Parsed manifests by snapshot, most recently used last.
pub struct Manifests<T> {
    kept: Mutex<VecDeque<(SnapshotId, FileIdentity, Arc<T>)>>,
}

impl<T> Default for Manifests<T> {
    fn default() -> Manifests<T> {
        Manifests { kept: Mutex::new(VecDeque::with_capacity(KEPT)) }
    }
}

impl<T> Manifests<T> {
    /// Snapshot `id`'s parsed manifest, whose file is `file`: the one kept while the file is
    /// the one it was parsed from, else `load`'s (kept for next time). The file is looked at
    /// before `load` reads it, so what is kept is never older than the identity it is kept
    /// under; a file that cannot be looked at (gone) is not kept, and `load` says why.
    pub fn get<E>(
        &self,
        id: &SnapshotId,
        file: &Path,
        load: impl FnOnce() -> Result<T, E>,
    ) -> Result<Arc<T>, E> {
        let Ok(meta) = std::fs::metadata(file) else {
            self.lock().retain(|(k, ..)| k != id);
            return load().map(Arc::new);
        };
        let identity = FileIdentity::of(&meta);
        {
            let mut kept = self.lock();
            if let Some(pos) = kept.iter().position(|(k, ..)| k == id) {
                if let Some(entry) = kept.remove(pos) {
                    if entry.1 == identity {
                        let parsed = entry.2.clone();
                        kept.push_back(entry);
                        return Ok(parsed);
                    }
                }
            }
        }
        // Parsed outside the lock: other snapshots' chunks are served meanwhile.
        let parsed = Arc::new(load()?);
        let mut kept = self.lock();
        kept.retain(|(k, ..)| k != id);
        while kept.len() >= KEPT {
            kept.pop_front();
        }
        kept.push_back((id.clone(), identity, parsed.clone()));
        Ok(parsed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(SnapshotId, FileIdentity, Arc<T>)>> {
        // An entry is whole or absent, so a panic elsewhere leaves nothing half-written.
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// Reads `file` as the test's "manifest", counting the reads.
    fn read(file: &Path, reads: &Cell<u32>) -> Result<String, std::io::Error> {
        reads.set(reads.get() + 1);
        std::fs::read_to_string(file)
    }

    /// Replaces `file` the way a push or pull does: a new file renamed into place.
    fn replace(file: &Path, text: &str) {
        let tmp = file.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, file).unwrap();
    }

    #[test]
    fn a_manifest_is_read_once_until_its_file_changes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("remote-manifest.json");
        let id = SnapshotId::parse("snap-0123456789abcdef").unwrap();
        let (cache, reads) = (Manifests::default(), Cell::new(0));
        replace(&file, "first");
        for _ in 0..3 {
            assert_eq!(*cache.get(&id, &file, || read(&file, &reads)).unwrap(), "first");
        }
        assert_eq!(reads.get(), 1, "the second and third requests did not read the manifest");

        replace(&file, "second, pushed again");
        assert_eq!(*cache.get(&id, &file, || read(&file, &reads)).unwrap(), "second, pushed again");
        assert_eq!(reads.get(), 2);
        // Rewritten in place at the same length: the change time still tells.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&file, "second, PUSHED again").unwrap();
        assert_eq!(*cache.get(&id, &file, || read(&file, &reads)).unwrap(), "second, PUSHED again");
        assert_eq!(reads.get(), 3);

        std::fs::remove_file(&file).unwrap();
        assert!(cache.get(&id, &file, || read(&file, &reads)).is_err(), "a deleted manifest is not served");
        assert!(cache.lock().is_empty(), "nor kept");
    }

    #[test]
    fn at_most_the_bound_is_kept_and_the_least_recently_used_goes_first() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, reads) = (Manifests::default(), Cell::new(0));
        let ids: Vec<SnapshotId> =
            (0..=KEPT).map(|i| SnapshotId::parse(&format!("snap-{i:016x}")).unwrap()).collect();
        let file = |i: usize| dir.path().join(format!("{i}.json"));
        for i in 0..=KEPT {
            replace(&file(i), &format!("manifest {i}"));
        }
        for (i, id) in ids.iter().enumerate().take(KEPT) {
            cache.get(id, &file(i), || read(&file(i), &reads)).unwrap();
        }
        // Snapshot 0 used again, then one more: snapshot 1 is the one dropped.
        cache.get(&ids[0], &file(0), || read(&file(0), &reads)).unwrap();
        cache.get(&ids[KEPT], &file(KEPT), || read(&file(KEPT), &reads)).unwrap();
        assert_eq!(reads.get(), KEPT as u32 + 1);
        assert_eq!(cache.lock().len(), KEPT);
        cache.get(&ids[0], &file(0), || read(&file(0), &reads)).unwrap();
        assert_eq!(reads.get(), KEPT as u32 + 1, "snapshot 0 was kept");
        cache.get(&ids[1], &file(1), || read(&file(1), &reads)).unwrap();
        assert_eq!(reads.get(), KEPT as u32 + 2, "snapshot 1 was dropped");
    }
}
