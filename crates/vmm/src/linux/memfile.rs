//! A Linux guest's RAM as a snapshot file: written from the paused guest's mapping (all-zero
//! runs left as holes, so the file is sparse), and mapped back `MAP_PRIVATE` by a restore:
//! clean pages come from the page cache, a guest write copies one page into the restored
//! VM's private memory, and the file never changes, so one file serves any number of
//! restores (the synthetic guest's memory layers work the same way, `docs/microvm.md`).

use super::error::{LinuxError, LinuxResult};
use crate::error::Error;
use branchbox_arch::layout;
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{
    FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap,
    MemoryRegionAddress,
};

/// Runs of zeros this long (and aligned) are skipped rather than written.
const HOLE: usize = 64 << 10;

fn io<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(std::io::Error) -> LinuxError + 'a {
    move |source| LinuxError::Vmm(Error::SnapshotIo { path: path.to_path_buf(), op, source })
}

/// Writes guest RAM to `dir/name` atomically (temporary file, fsync, rename); returns its
/// size. The caller has paused the vCPUs and holds every device that writes guest memory.
pub(super) fn write(mem: &GuestMemoryMmap, dir: &Path, name: &str) -> LinuxResult<u64> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut file = File::create(&tmp).map_err(io(&tmp, "create"))?;
    let mut size = 0u64;
    for region in mem.iter() {
        let len = region.len() as usize;
        let host = region
            .get_host_address(MemoryRegionAddress(0))
            .map_err(|e| LinuxError::Memory { bytes: region.len(), detail: e.to_string() })?;
        // SAFETY: the region is a live mapping of `len` bytes owned by `mem`, which outlives
        // this call; the vCPUs are paused and the devices held, so nothing writes it now.
        let bytes = unsafe { std::slice::from_raw_parts(host as *const u8, len) };
        for chunk in bytes.chunks(HOLE) {
            if chunk.iter().all(|&b| b == 0) {
                file.seek(SeekFrom::Current(chunk.len() as i64)).map_err(io(&tmp, "seek"))?;
            } else {
                file.write_all(chunk).map_err(io(&tmp, "write"))?;
            }
        }
        size += region.len();
    }
    // A trailing hole has no bytes written: the length says where RAM ends.
    file.set_len(size).map_err(io(&tmp, "truncate"))?;
    file.sync_all().map_err(io(&tmp, "fsync"))?;
    drop(file);
    let path = dir.join(name);
    std::fs::rename(&tmp, &path).map_err(io(&path, "rename"))?;
    Ok(size)
}

/// Maps the memory file at `path` privately as guest RAM of `size` bytes, in the layout's
/// regions. A file of any other size is refused (a truncated file would fault the guest
/// with SIGBUS at its first access past the end).
pub(super) fn map(path: &Path, size: u64) -> LinuxResult<GuestMemoryMmap> {
    let file = File::open(path).map_err(io(path, "open"))?;
    let found = file.metadata().map_err(io(path, "stat"))?.len();
    if found != size {
        let err = if found < size {
            Error::SnapshotTruncated { path: path.to_path_buf(), found, expected: size }
        } else {
            Error::SnapshotCorrupt {
                path: path.to_path_buf(),
                reason: format!("memory file of {found} bytes for {size} bytes of guest RAM"),
            }
        };
        return Err(err.into());
    }
    let mut offset = 0u64;
    let mut regions = Vec::new();
    for (start, len) in layout::ram_regions(size)? {
        let fd = file.try_clone().map_err(io(path, "dup"))?;
        let region = MmapRegionBuilder::new(len)
            .with_file_offset(FileOffset::new(fd, offset))
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_NORESERVE)
            .build()
            .map_err(|e| LinuxError::Memory { bytes: len as u64, detail: e.to_string() })?;
        let region = GuestRegionMmap::new(region, GuestAddress(start.0))
            .ok_or_else(|| LinuxError::Memory { bytes: len as u64, detail: "region does not fit".into() })?;
        regions.push(region);
        offset += len as u64;
    }
    GuestMemoryMmap::from_regions(regions)
        .map_err(|e| LinuxError::Memory { bytes: size, detail: e.to_string() })
}
