//! A Linux guest's RAM as a snapshot file: written from the paused guest's mapping (all-zero
//! runs left as holes, so the file is sparse), and mapped back `MAP_PRIVATE` by a restore:
//! a booted guest's RAM is anonymous memory, whose pages the guest never wrote are neither
//! present nor swapped out in `/proc/self/pagemap`; those read as zeros, so the writer skips
//! them without reading (reading would fault every one of them in: most of a young guest's
//! RAM). A restored guest's RAM is the older file mapped privately, whose untouched pages
//! hold that file's data: it is read whole.
//!
//! clean pages come from the page cache, a guest write copies one page into the restored
//! VM's private memory, and the file never changes, so one file serves any number of
//! restores (the synthetic guest's memory layers work the same way, `docs/microvm.md`).

use super::error::{LinuxError, LinuxResult};
use crate::error::Error;
use crate::memory::PAGE_SIZE;
use branchbox_arch::layout;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{
    FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap,
    MemoryRegionAddress,
};

/// Runs of zeros this long are skipped rather than written.
const HOLE: usize = 64 << 10;

fn io<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(std::io::Error) -> LinuxError + 'a {
    move |source| LinuxError::Vmm(Error::SnapshotIo { path: path.to_path_buf(), op, source })
}

/// Writes guest RAM to `dir/name` atomically (temporary file, fsync, rename); returns its
/// size. The caller has paused the vCPUs and holds every device that writes guest memory.
pub(super) fn write(mem: &GuestMemoryMmap, dir: &Path, name: &str) -> LinuxResult<u64> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let file = File::create(&tmp).map_err(io(&tmp, "create"))?;
    let mut size = 0u64;
    for region in mem.iter() {
        let len = region.len() as usize;
        let host = region
            .get_host_address(MemoryRegionAddress(0))
            .map_err(|e| LinuxError::Memory { bytes: region.len(), detail: e.to_string() })?;
        // SAFETY: the region is a live mapping of `len` bytes owned by `mem`, which outlives
        // this call; the vCPUs are paused and the devices held, so nothing writes it now.
        let bytes = unsafe { std::slice::from_raw_parts(host as *const u8, len) };
        let runs = match region.file_offset() {
            None => written_runs(host as usize, len).unwrap_or_else(|_| vec![(0, len)]),
            Some(_) => vec![(0, len)],
        };
        for (start, run) in runs {
            for (i, chunk) in bytes[start..start + run].chunks(HOLE).enumerate() {
                if !chunk.iter().all(|&b| b == 0) {
                    let at = size + (start + i * HOLE) as u64;
                    file.write_all_at(chunk, at).map_err(io(&tmp, "write"))?;
                }
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

/// The runs `(offset, length)` of the anonymous mapping at `host` (`len` bytes, page-aligned)
/// whose pages are in memory or swapped out; the others were never touched and read as zeros.
fn written_runs(host: usize, len: usize) -> crate::error::Result<Vec<(usize, usize)>> {
    let pages = crate::memory::dirty::private_pages(host, len)?;
    Ok(crate::memory::dirty::runs(&pages)
        .into_iter()
        .map(|(first, n)| (first as usize * PAGE_SIZE, n as usize * PAGE_SIZE))
        .collect())
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

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::Bytes;

    const MIB: usize = 1 << 20;

    /// Anonymous guest RAM of `len` bytes in 4 KiB pages (a transparent huge page would make a
    /// one-byte write present 2 MiB, which these tests do not want to depend on).
    fn small_pages(len: usize) -> GuestMemoryMmap {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), len)]).unwrap();
        let host = mem.get_host_address(GuestAddress(0)).unwrap();
        // SAFETY: advice on the mapping `mem` owns; it changes no content.
        assert_eq!(unsafe { libc::madvise(host.cast(), len, libc::MADV_NOHUGEPAGE) }, 0);
        mem
    }

    /// Whether the page at guest address `at` is in memory (present or swapped).
    fn touched(mem: &GuestMemoryMmap, at: u64) -> bool {
        let host = mem.get_host_address(GuestAddress(at)).unwrap() as usize;
        let page = 4096;
        written_runs(host & !(page - 1), page).unwrap().iter().any(|(_, len)| *len > 0)
    }

    #[test]
    fn a_save_writes_what_the_guest_wrote_and_faults_in_nothing_else() {
        let mem = small_pages(16 * MIB);
        // Pages written: the first, one in the middle of a 64 KiB chunk, the last; and one
        // written with zeros only (present, but a hole in the file).
        let writes: [(u64, &[u8]); 4] = [
            (0, b"first page"),
            (5 * MIB as u64 + 12_345, b"middle of a chunk"),
            (16 * MIB as u64 - 3, b"end"),
            (9 * MIB as u64, &[0u8; 64]),
        ];
        for (at, bytes) in writes {
            mem.write_slice(bytes, GuestAddress(at)).unwrap();
        }
        let untouched = [2 * MIB as u64, 7 * MIB as u64 + 4096, 12 * MIB as u64];
        for at in untouched {
            assert!(!touched(&mem, at), "page at {at:#x} present before the save");
        }
        let dir = tempfile::tempdir().unwrap();
        let size = write(&mem, dir.path(), "memory.bin").unwrap();
        assert_eq!(size, 16 * MIB as u64);
        for at in untouched {
            assert!(!touched(&mem, at), "the save faulted in the untouched page at {at:#x}");
        }
        let file = std::fs::read(dir.path().join("memory.bin")).unwrap();
        assert_eq!(file.len(), 16 * MIB);
        let mut expected = vec![0u8; 16 * MIB];
        for (at, bytes) in writes {
            expected[at as usize..at as usize + bytes.len()].copy_from_slice(bytes);
        }
        assert!(file == expected, "the file differs from guest memory");
        use std::os::unix::fs::MetadataExt;
        let allocated = std::fs::metadata(dir.path().join("memory.bin")).unwrap().blocks() * 512;
        assert!(allocated <= 4 * HOLE as u64, "{allocated} bytes allocated for 3 written chunks");
    }

    #[test]
    fn runs_merge_adjacent_pages_and_stop_at_the_mapping_s_end() {
        let mem = small_pages(2 * MIB);
        mem.write_slice(&[1u8; 3 * 4096], GuestAddress(8192)).unwrap();
        mem.write_slice(&[1u8], GuestAddress(2 * MIB as u64 - 1)).unwrap();
        let host = mem.get_host_address(GuestAddress(0)).unwrap() as usize;
        let runs = written_runs(host, 2 * MIB).unwrap();
        assert_eq!(runs, [(8192, 3 * 4096), (2 * MIB - 4096, 4096)]);
    }
}
