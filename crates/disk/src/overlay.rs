//! [`OverlayBackend`]: a read-only base file under a writable overlay file of the same size,
//! the simplest storage behind [`BlockBackend`]. Copy-on-write layers with fork and rollback
//! are another backend behind the same trait: [`LayeredBackend`](crate::LayeredBackend).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

use crate::block::{cluster_pieces, BlockBackend, CLUSTER_SIZE, SECTOR_SIZE};

/// Why an overlay backend cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// A file could not be opened or inspected.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: String,
        /// The system's error.
        source: io::Error,
    },
    /// The base is not a whole number of clusters.
    #[error(
        "base disk {path} is {size} bytes, not a multiple of {CLUSTER_SIZE}; pad it \
         (truncate -s) to a multiple"
    )]
    Unaligned {
        /// The base file.
        path: String,
        /// Its size.
        size: u64,
    },
    /// The overlay exists with another size than the base.
    #[error(
        "overlay {path} is {overlay} bytes but the base is {base}: an overlay belongs to one \
         base; remove it to start over"
    )]
    SizeMismatch {
        /// The overlay file.
        path: String,
        /// The overlay's size.
        overlay: u64,
        /// The base's size.
        base: u64,
    },
}

/// A read-only base file under a writable overlay file of the same size.
///
/// Reads: a cluster the guest has written is read from the overlay, any other from the base.
/// Writes: go to the overlay only; the first write to a cluster copies the base's cluster
/// into the overlay first, then applies the write. The base is never written and can be
/// shared by many sandboxes. Which clusters are written is kept in memory and rebuilt from
/// the overlay's allocated extents (`SEEK_DATA`) when it is reopened, so an overlay survives a
/// restart of the VMM; a new overlay is created sparse.
pub struct OverlayBackend {
    base: File,
    overlay: File,
    sectors: u64,
    written: Vec<u64>,
}

impl OverlayBackend {
    /// Opens `base` read-only and `overlay` read-write, creating the overlay (sparse, the
    /// base's size) if it does not exist.
    pub fn open(base: &Path, overlay: &Path) -> Result<OverlayBackend, BackendError> {
        let io_err = |what, path: &Path| {
            let path = path.display().to_string();
            move |source| BackendError::Io { what, path, source }
        };
        let base_file = File::open(base).map_err(io_err("cannot open base disk", base))?;
        let size = base_file.metadata().map_err(io_err("cannot stat base disk", base))?.len();
        if size % CLUSTER_SIZE != 0 {
            return Err(BackendError::Unaligned { path: base.display().to_string(), size });
        }
        let overlay_file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(overlay)
            .map_err(io_err("cannot open overlay", overlay))?;
        let overlay_size = overlay_file.metadata().map_err(io_err("cannot stat overlay", overlay))?.len();
        if overlay_size == 0 {
            overlay_file.set_len(size).map_err(io_err("cannot size overlay", overlay))?;
        } else if overlay_size != size {
            return Err(BackendError::SizeMismatch {
                path: overlay.display().to_string(),
                overlay: overlay_size,
                base: size,
            });
        }
        let clusters = size / CLUSTER_SIZE;
        let mut backend = OverlayBackend {
            base: base_file,
            overlay: overlay_file,
            sectors: size / SECTOR_SIZE,
            written: vec![0; clusters.div_ceil(64) as usize],
        };
        backend.load_written(size).map_err(io_err("cannot map overlay extents", overlay))?;
        Ok(backend)
    }

    /// Marks every cluster the overlay has allocated as written.
    fn load_written(&mut self, size: u64) -> io::Result<()> {
        let fd = self.overlay.as_raw_fd();
        let mut pos: u64 = 0;
        while pos < size {
            let data = seek(fd, pos, libc::SEEK_DATA)?;
            let Some(data) = data else { break };
            let hole = seek(fd, data, libc::SEEK_HOLE)?.unwrap_or(size);
            let mut c = data / CLUSTER_SIZE;
            while c * CLUSTER_SIZE < hole.min(size) {
                self.mark(c);
                c += 1;
            }
            pos = hole;
        }
        Ok(())
    }

    fn is_written(&self, cluster: u64) -> bool {
        self.written[(cluster / 64) as usize] & (1 << (cluster % 64)) != 0
    }

    fn mark(&mut self, cluster: u64) {
        self.written[(cluster / 64) as usize] |= 1 << (cluster % 64);
    }
}

/// `lseek` with `SEEK_DATA`/`SEEK_HOLE`; `None` when there is no more data (ENXIO).
fn seek(fd: i32, pos: u64, whence: i32) -> io::Result<Option<u64>> {
    let offset = libc::off_t::try_from(pos).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: lseek on a file descriptor this backend owns; no memory is passed.
    let r = unsafe { libc::lseek(fd, offset, whence) };
    if r < 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ENXIO) {
            return Ok(None);
        }
        return Err(err);
    }
    Ok(Some(r as u64))
}

impl BlockBackend for OverlayBackend {
    fn sectors(&self) -> u64 {
        self.sectors
    }

    fn read(&mut self, sector: u64, buf: &mut [u8]) -> io::Result<()> {
        let offset = sector * SECTOR_SIZE;
        for (cluster, _, at, len) in cluster_pieces(offset, buf.len()) {
            let file = if self.is_written(cluster) { &self.overlay } else { &self.base };
            file.read_exact_at(&mut buf[at..at + len], offset + at as u64)?;
        }
        Ok(())
    }

    fn write(&mut self, sector: u64, data: &[u8]) -> io::Result<()> {
        let offset = sector * SECTOR_SIZE;
        for (cluster, _, at, len) in cluster_pieces(offset, data.len()) {
            if !self.is_written(cluster) && len as u64 != CLUSTER_SIZE {
                let mut copy = vec![0u8; CLUSTER_SIZE as usize];
                self.base.read_exact_at(&mut copy, cluster * CLUSTER_SIZE)?;
                self.overlay.write_all_at(&copy, cluster * CLUSTER_SIZE)?;
            }
            self.overlay.write_all_at(&data[at..at + len], offset + at as u64)?;
            self.mark(cluster);
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.overlay.sync_data()
    }
}
