//! The template directory's locks: one build (or removal) of a template at a time, and the
//! step cache held by running builds against a release of unnamed steps.

use branchbox_model::{Error, Result};
use std::path::Path;

/// Holds one template's build (and removal) at a time.
pub(super) struct BuildLock {
    _file: std::fs::File,
}

impl BuildLock {
    pub(super) fn take(dir: &Path, name: &str) -> Result<BuildLock> {
        // Build logs hold command output, which may hold secrets: the directory is private.
        crate::engine::private_dir(dir).map_err(|e| Error::io(dir, e))?;
        let path = dir.join(format!("{name}.lock"));
        match crate::engine::lock::flock(&path, libc::LOCK_EX | libc::LOCK_NB)? {
            Some(file) => Ok(BuildLock { _file: file }),
            None => Err(Error::Conflict(format!(
                "template {name} is being built or removed by another command; wait for it to finish"
            ))),
        }
    }
}

/// The lock on the step cache (`step cache.lock` in the template directory: no template name
/// holds a space, so no build lock is this file): builds hold it shared
/// while they run, a release of unnamed steps exclusively. `None` when `op` has `LOCK_NB` and it
/// is held.
pub(super) fn steps_lock(dir: &Path, op: libc::c_int) -> Result<Option<std::fs::File>> {
    crate::engine::private_dir(dir).map_err(|e| Error::io(dir, e))?;
    crate::engine::lock::flock(&dir.join("step cache.lock"), op)
}
