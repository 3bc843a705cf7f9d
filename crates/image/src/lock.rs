//! An exclusive lock on a cache directory, so concurrent builds of the same thing wait for
//! each other instead of racing.

use branchbox_model::{Error, Result};
use std::os::fd::AsRawFd;
use std::path::Path;

/// Holds an exclusive lock on a directory while alive (closing the file releases it).
pub(crate) struct DirLock {
    _file: std::fs::File,
}

impl DirLock {
    /// Waits for the lock on `dir` (its `.lock` file).
    pub(crate) fn take(dir: &Path) -> Result<DirLock> {
        // A blocking flock does not report EWOULDBLOCK; should it, say so rather than panic.
        Self::lock(dir, libc::LOCK_EX)?
            .ok_or_else(|| Error::Backend(format!("{}: the lock stayed busy", dir.display())))
    }

    /// Takes the lock on `dir` if free: `None` when another process holds it.
    pub(crate) fn try_take(dir: &Path) -> Result<Option<DirLock>> {
        Self::lock(dir, libc::LOCK_EX | libc::LOCK_NB)
    }

    fn lock(dir: &Path, op: libc::c_int) -> Result<Option<DirLock>> {
        let path = dir.join(".lock");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        // SAFETY: flock on an fd we own; released when the file closes.
        if unsafe { libc::flock(f.as_raw_fd(), op) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Ok(None);
            }
            return Err(Error::io(&path, e));
        }
        Ok(Some(DirLock { _file: f }))
    }
}
