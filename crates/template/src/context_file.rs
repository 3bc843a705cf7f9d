//! Files of a template's build context, opened without following a symlink anywhere below the
//! context, and reopened for upload only when they are still the file the scan hashed.
//!
//! The scan walks the context by descriptors (`openat` with `O_NOFOLLOW` from the directory
//! already open), so a symlink swapped in for a directory or a file during the walk is refused,
//! not followed, and the file that is hashed is the one that was checked to be a regular file
//! (by `fstat` of the same descriptor). The upload reopens each file later (holding ten thousand
//! descriptors across a build is not possible) and refuses it before a byte is read unless it is
//! the same inode, read only up to the length that was hashed; its hash is checked again as it
//! is sent, so a file edited in place fails the build instead of caching a key that does not
//! describe it.

use crate::{Error, Result};
use sha2::{Digest, Sha256};
use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::io::{AsRawFd, FromRawFd};
use std::path::Path;

/// Read-only, never through a symlink at the last component, never blocking on a FIFO (whose
/// open would wait for a writer), and not inherited by children.
const FLAGS: libc::c_int = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;

/// Which file the scan hashed: its device and inode (from the descriptor it read) and how many
/// bytes of it were hashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scanned {
    dev: u64,
    ino: u64,
    len: u64,
}

impl Scanned {
    /// Opens the scanned file at `local` to send it: refused, before anything is read, when a
    /// symlink or another file now stands there (or any directory above it leads elsewhere).
    /// The reader yields at most the bytes hashed and checks them ([`Verified::check`]).
    pub fn open(&self, local: &Path) -> Result<Verified<std::io::Take<File>>> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(local)
            .map_err(|e| refusal(local, e))?;
        let md = file.metadata().map_err(|e| Error::io(local, e))?;
        if !md.is_file() || md.dev() != self.dev || md.ino() != self.ino {
            return Err(Error::Invalid(format!(
                "{} was replaced after the scan (another file, directory or link stands there now); \
                 nothing of it was sent; build again once the context stops changing",
                local.display()
            )));
        }
        Ok(Verified::new(file.take(self.len)))
    }
}

/// Why opening `path` without following links failed, in words.
fn refusal(path: &Path, e: std::io::Error) -> Error {
    if e.raw_os_error() == Some(libc::ELOOP) {
        return Error::Invalid(format!(
            "{} is a symlink; symlinks are not followed (they could leave the context)",
            path.display()
        ));
    }
    Error::io(path, e)
}

/// The context directory itself, opened to walk below it.
pub(crate) fn open_context(ctx: &Path) -> Result<File> {
    File::open(ctx).map_err(|e| Error::io(ctx, e))
}

/// Opens `name`, one component, inside the open directory `dir`, never following a symlink;
/// `path` is its path for messages.
pub(crate) fn open_at(dir: &File, name: &OsStr, path: &Path) -> Result<File> {
    let c = CString::new(name.as_bytes())
        .map_err(|_| Error::Invalid(format!("{} has a NUL byte in its name", path.display())))?;
    // SAFETY: `dir` is an open descriptor for the call's duration and `c` is NUL-terminated;
    // openat returns a new descriptor or -1.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), FLAGS) };
    if fd < 0 {
        return Err(refusal(path, std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just returned by openat and nothing else owns it.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Hashes the first `len` bytes of the open regular file `file` (its length when checked) and
/// says which file it was.
pub(crate) fn hash_open(file: File, md: &std::fs::Metadata, path: &Path) -> Result<(String, Scanned)> {
    let scanned = Scanned { dev: md.dev(), ino: md.ino(), len: md.len() };
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut r = file.take(scanned.len);
    loop {
        let n = r.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            return Ok((hex::encode(h.finalize()), scanned));
        }
        h.update(&buf[..n]);
    }
}

/// A reader that hashes what it reads, so a file that changed between the scan and the upload
/// is caught (its cache key would not describe what was uploaded).
pub struct Verified<R> {
    inner: R,
    hash: Sha256,
}

impl<R: Read> Verified<R> {
    /// Wraps `inner`.
    pub fn new(inner: R) -> Self {
        Verified { inner, hash: Sha256::new() }
    }

    /// Checks what was read against `sha256`.
    pub fn check(self, sha256: &str, path: &Path) -> Result<()> {
        if hex::encode(self.hash.finalize()) != sha256 {
            return Err(Error::Invalid(format!(
                "{} changed during the build; build again once it stops changing",
                path.display()
            )));
        }
        Ok(())
    }
}

impl<R: Read> Read for Verified<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}
