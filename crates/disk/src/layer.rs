//! One layer file on disk: created empty, opened as a frozen delta (read-only, every slot the
//! manifest records must be valid, exact size) or as a writable top (the valid slots are the
//! prefix before the first empty or torn one; whatever follows is cleared).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use crate::block::CLUSTER_SIZE;

use crate::format::{slot_offset, Header, IndexReader, ENTRY_LEN, HEADER_LEN};
use crate::LayerError;

/// Bytes of index read per `pread` when opening a layer.
const INDEX_CHUNK: usize = 256 << 10;

/// An open layer file.
pub(crate) struct LayerFile {
    pub(crate) file: File,
    pub(crate) header: Header,
    pub(crate) path: PathBuf,
}

pub(crate) fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> LayerError {
    let path = path.display().to_string();
    move |source| LayerError::Io { what, path, source }
}

impl LayerFile {
    /// Creates an empty layer for a disk of `disk_size` bytes with a fresh random id, its
    /// contents durable before it returns; its directory entry too when `entry_durable`
    /// (a caller making many syncs the directory once after them).
    pub(crate) fn create(dir: &Path, disk_size: u64, entry_durable: bool) -> Result<LayerFile, LayerError> {
        let id = loop {
            let id: u64 = rand::random();
            if id != 0 && !layer_path(dir, id).exists() {
                break id;
            }
        };
        let header = Header { disk_size, id };
        let path = layer_path(dir, id);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io_err("cannot create layer", &path))?;
        file.write_all_at(&header.encode(), 0).map_err(io_err("cannot write layer header", &path))?;
        // The index region is a hole until slots are written.
        file.set_len(header.data_offset()).map_err(io_err("cannot size layer", &path))?;
        file.sync_all().map_err(io_err("cannot sync layer", &path))?;
        if entry_durable {
            sync_dir(dir)?;
        }
        Ok(LayerFile { file, header, path })
    }

    /// Opens a frozen delta read-only: header, id and disk size as the manifest says, exactly
    /// `entries` valid slots, and exactly the file size they need. Returns the layer and the
    /// disk cluster of each slot.
    pub(crate) fn open_delta(
        dir: &Path,
        id: u64,
        entries: u64,
        disk_size: u64,
    ) -> Result<(LayerFile, Vec<u64>), LayerError> {
        let path = layer_path(dir, id);
        let file = File::open(&path).map_err(io_err("cannot open layer", &path))?;
        let layer = LayerFile::check(file, path, id, disk_size)?;
        let clusters = layer.read_index(Some(entries))?;
        let want = layer.header.data_offset() + entries * CLUSTER_SIZE;
        let have = layer.len()?;
        if have != want {
            return Err(LayerError::LayerSize { path: layer.path.display().to_string(), have, want });
        }
        Ok((layer, clusters))
    }

    /// Opens a writable top. A process killed mid-flush may have left slots past the valid
    /// prefix (a torn slot followed by whole ones, or slots of data never flushed): they are
    /// cleared, and data past the prefix's clusters cut off, before new writes reuse the
    /// space, so a stale slot can never describe a reused data cluster.
    pub(crate) fn open_top(dir: &Path, id: u64, disk_size: u64) -> Result<(LayerFile, Vec<u64>), LayerError> {
        let path = layer_path(dir, id);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_err("cannot open top layer", &path))?;
        let layer = LayerFile::check(file, path, id, disk_size)?;
        let clusters = layer.read_index(None)?;
        let n = clusters.len() as u64;
        let data_end = layer.header.data_offset() + n * CLUSTER_SIZE;
        if layer.len()? < data_end {
            return Err(LayerError::LayerSize {
                path: layer.path.display().to_string(),
                have: layer.len()?,
                want: data_end,
            });
        }
        layer.clear_index_from(n)?;
        layer.file.set_len(data_end).map_err(io_err("cannot cut top layer", &layer.path))?;
        layer.file.sync_all().map_err(io_err("cannot sync top layer", &layer.path))?;
        Ok((layer, clusters))
    }

    fn check(file: File, path: PathBuf, id: u64, disk_size: u64) -> Result<LayerFile, LayerError> {
        let mut head = vec![0u8; HEADER_LEN as usize];
        let got = read_up_to(&file, &mut head, 0).map_err(io_err("cannot read layer header", &path))?;
        let header = Header::decode(&head[..got])
            .map_err(|source| LayerError::Format { path: path.display().to_string(), source })?;
        if header.id != id {
            return Err(LayerError::WrongId { path: path.display().to_string(), found: header.id, want: id });
        }
        if header.disk_size != disk_size {
            return Err(LayerError::DiskSizeDisagrees {
                path: path.display().to_string(),
                layer: header.disk_size,
                chain: disk_size,
            });
        }
        Ok(LayerFile { file, header, path })
    }

    fn len(&self) -> Result<u64, LayerError> {
        Ok(self.file.metadata().map_err(io_err("cannot stat layer", &self.path))?.len())
    }

    fn read_index(&self, expected: Option<u64>) -> Result<Vec<u64>, LayerError> {
        let format = |source| LayerError::Format { path: self.path.display().to_string(), source };
        let mut reader = IndexReader::new(self.header, expected).map_err(format)?;
        let mut buf = vec![0u8; INDEX_CHUNK];
        let mut slot = 0u64;
        while reader.wanted() > 0 {
            let want = (reader.wanted() * ENTRY_LEN).min(INDEX_CHUNK as u64) as usize;
            let got = read_up_to(&self.file, &mut buf[..want], slot_offset(slot))
                .map_err(io_err("cannot read layer index", &self.path))?;
            let more = reader.feed(&buf[..got]).map_err(format)?;
            slot += (got as u64) / ENTRY_LEN;
            if !more || got < want {
                break;
            }
        }
        reader.finish().map_err(format)
    }

    /// Zeroes index slots `from..` (only the parts that hold data).
    fn clear_index_from(&self, from: u64) -> Result<(), LayerError> {
        let end = self.header.data_offset();
        let mut pos = slot_offset(from);
        let zeros = vec![0u8; INDEX_CHUNK];
        let mut buf = vec![0u8; INDEX_CHUNK];
        while pos < end {
            let n = ((end - pos) as usize).min(INDEX_CHUNK);
            let Some(data) =
                next_data(&self.file, pos).map_err(io_err("cannot scan top layer", &self.path))?
            else {
                break;
            };
            if data >= end {
                break;
            }
            if data > pos {
                pos = data;
                continue;
            }
            let got = read_up_to(&self.file, &mut buf[..n], pos)
                .map_err(io_err("cannot read top layer", &self.path))?;
            if buf[..got].iter().any(|&b| b != 0) {
                self.file
                    .write_all_at(&zeros[..got], pos)
                    .map_err(io_err("cannot clear top layer index", &self.path))?;
            }
            pos += n as u64;
        }
        Ok(())
    }

    /// File offset of data cluster `slot`.
    pub(crate) fn data_at(&self, slot: u64) -> u64 {
        self.header.data_offset() + slot * CLUSTER_SIZE
    }
}

/// Where layer `id` lives in the store's layer directory.
pub(crate) fn layer_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:016x}.layer"))
}

/// Reads into `buf` from `offset` until it is full or the file ends; returns the bytes read.
pub(crate) fn read_up_to(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// The first offset at or after `pos` that holds data (`SEEK_DATA`), `None` past the last.
fn next_data(file: &File, pos: u64) -> io::Result<Option<u64>> {
    let offset = libc::off_t::try_from(pos).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: lseek on a descriptor this layer owns; no memory is passed.
    let r = unsafe { libc::lseek(file.as_raw_fd(), offset, libc::SEEK_DATA) };
    if r < 0 {
        let err = io::Error::last_os_error();
        return if err.raw_os_error() == Some(libc::ENXIO) { Ok(None) } else { Err(err) };
    }
    Ok(Some(r as u64))
}

/// Makes the directory entries in `dir` durable (a created or renamed file survives a crash).
pub(crate) fn sync_dir(dir: &Path) -> Result<(), LayerError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_err("cannot sync directory", dir))
}

/// How long [`lock`] waits for a holder that is letting go.
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_millis(250);

/// Takes the exclusive lock that says a process has this top open for writing. A lock that
/// is held is retried for [`LOCK_PATIENCE`]: a handle just closed releases it only once every
/// copy of its open file is gone (a child forked by another thread holds one until it execs),
/// while a real writer holds it for the life of its VM and is still refused.
pub(crate) fn lock(file: &File, path: &Path) -> Result<(), LayerError> {
    let deadline = std::time::Instant::now() + LOCK_PATIENCE;
    loop {
        // SAFETY: flock on a descriptor the caller owns; no memory is passed.
        let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(io_err("cannot lock top layer", path)(err));
        }
        if std::time::Instant::now() >= deadline {
            return Err(LayerError::TopInUse { path: path.display().to_string() });
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

pub(crate) fn unlock(layer: &LayerFile) {
    // SAFETY: as in `lock`. Failing to unlock only keeps a frozen layer locked until close.
    unsafe { libc::flock(layer.file.as_raw_fd(), libc::LOCK_UN) };
}
