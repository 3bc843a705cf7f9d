//! The engine's file locks: the data directory's (`gc.lock`: operations in progress hold it
//! shared, `gc` exclusively) and each template's build lock, all taken through [`flock`].

use branchbox_model::{Error, Result};
use std::path::Path;

/// Takes `flock(op)` on `path` (created when missing); the lock lives as long as the file
/// returned. `None` when `op` has `LOCK_NB` and someone else holds the lock.
pub(super) fn flock(path: &Path, op: libc::c_int) -> Result<Option<std::fs::File>> {
    use std::os::fd::AsRawFd;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    // SAFETY: flock on a descriptor we own; released when the file closes.
    if unsafe { libc::flock(file.as_raw_fd(), op) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::WouldBlock {
            return Ok(None);
        }
        return Err(Error::io(path, e));
    }
    Ok(Some(file))
}

/// A lock on the data directory: operations that create sandbox or snapshot directories before
/// recording them hold it shared; `gc` holds it exclusively, so it never mistakes work in
/// progress for something interrupted.
pub struct DataLock {
    _file: std::fs::File,
}

impl DataLock {
    pub(super) fn take(data_dir: &Path, exclusive: bool) -> Result<DataLock> {
        let op = if exclusive { libc::LOCK_EX } else { libc::LOCK_SH };
        DataLock::flock(data_dir, op)?
            .ok_or_else(|| Error::Conflict("the data directory lock is busy".into()))
    }

    /// The exclusive lock if no one holds the lock now; `None` when someone does.
    pub(super) fn try_exclusive(data_dir: &Path) -> Result<Option<DataLock>> {
        DataLock::flock(data_dir, libc::LOCK_EX | libc::LOCK_NB)
    }

    fn flock(data_dir: &Path, op: libc::c_int) -> Result<Option<DataLock>> {
        Ok(flock(&data_dir.join("gc.lock"), op)?.map(|file| DataLock { _file: file }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_is_refused_without_waiting_and_free_again_once_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.lock");
        let held = flock(&path, libc::LOCK_EX | libc::LOCK_NB).unwrap();
        assert!(held.is_some());
        assert!(flock(&path, libc::LOCK_EX | libc::LOCK_NB).unwrap().is_none());
        assert!(DataLock::try_exclusive(dir.path()).unwrap().is_some(), "another file is another lock");
        drop(held);
        assert!(flock(&path, libc::LOCK_EX | libc::LOCK_NB).unwrap().is_some());
        let missing = dir.path().join("no-such-dir").join("t.lock");
        let err = flock(&missing, libc::LOCK_EX).unwrap_err();
        assert!(err.to_string().contains("no-such-dir"), "{err}");
    }
}
