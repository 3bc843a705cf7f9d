//! Guest RAM as a copy-on-write mapping over an immutable memory layer file.
//!
//! A VM's RAM is one host mapping. A fresh VM starts on anonymous memory; a snapshot writes
//! the RAM into a layer file and every VM restored or forked from it maps that file
//! `MAP_PRIVATE`: clean pages stay shared through the page cache, a guest write copies one
//! page into the writer's private memory, and the file never changes. The mapping is made
//! with raw `mmap` rather than `vm-memory` because the fast fork path re-maps a live range in
//! place (`MAP_FIXED`) under an already registered KVM slot, which `vm-memory`'s regions do
//! not model.
//!
//! Layer files are written once (temp file, fsync, rename) and never modified afterwards.

use crate::error::{mem, Error, Result};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// Host page size assumed for accounting and sparse writes.
pub const PAGE_SIZE: usize = 4096;

/// One contiguous range of guest RAM starting at guest-physical address 0.
pub struct GuestRam {
    addr: *mut u8,
    size: usize,
}

// SAFETY: the mapping is owned by this value and only reached through it; guest accesses
// from KVM are not Rust references.
unsafe impl Send for GuestRam {}

impl GuestRam {
    /// Maps `size` bytes of fresh, zeroed, lazily allocated anonymous RAM.
    pub fn anonymous(size: usize) -> Result<GuestRam> {
        if size == 0 || size % PAGE_SIZE != 0 {
            return Err(Error::Config(format!(
                "guest RAM size {size} must be a non-zero multiple of {PAGE_SIZE}"
            )));
        }
        let addr = reserve(size)?;
        // SAFETY: MAP_FIXED inside the reservation just made for this value.
        let mapped = unsafe {
            libc::mmap(
                addr.cast(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if mapped == libc::MAP_FAILED {
            let err = std::io::Error::last_os_error();
            release(addr, size);
            return Err(mem("mmap anonymous RAM")(err));
        }
        Ok(GuestRam { addr, size })
    }

    /// Replaces the whole RAM range, in place, with a private copy-on-write view of `layer`.
    ///
    /// The host address stays the same, so a KVM memory slot registered over it stays valid;
    /// KVM's MMU notifier drops whatever it had mapped from the old pages.
    pub fn map_layer(&mut self, layer: &File) -> Result<()> {
        // SAFETY: MAP_FIXED over exactly the range this value owns; nothing else aliases it.
        let addr = unsafe {
            libc::mmap(
                self.addr.cast(),
                self.size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_NORESERVE,
                layer.as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(mem("mmap memory layer MAP_PRIVATE")(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Host address of guest-physical address 0 (what the KVM slot is registered with).
    pub fn host_addr(&self) -> u64 {
        self.addr as u64
    }

    /// Size of the RAM in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    fn check(&self, gpa: u64, len: usize) -> Result<usize> {
        let start = usize::try_from(gpa).map_err(|_| out_of_range(gpa, len, self.size))?;
        match start.checked_add(len) {
            Some(end) if end <= self.size => Ok(start),
            _ => Err(out_of_range(gpa, len, self.size)),
        }
    }

    /// Copies `data` into guest RAM at `gpa`.
    pub fn write(&self, gpa: u64, data: &[u8]) -> Result<()> {
        let start = self.check(gpa, data.len())?;
        // SAFETY: bounds checked above; the guest is not running while the host writes
        // (vCPUs run only inside `Vm::run`, which borrows the VM mutably).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.addr.add(start), data.len()) };
        Ok(())
    }

    /// Copies guest RAM at `gpa` into `out`.
    pub fn read(&self, gpa: u64, out: &mut [u8]) -> Result<()> {
        let start = self.check(gpa, out.len())?;
        // SAFETY: bounds checked above.
        unsafe { std::ptr::copy_nonoverlapping(self.addr.add(start), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Writes a little-endian u64 at `gpa`.
    pub fn write_u64(&self, gpa: u64, value: u64) -> Result<()> {
        self.write(gpa, &value.to_le_bytes())
    }

    /// Reads a little-endian u64 at `gpa`.
    pub fn read_u64(&self, gpa: u64) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read(gpa, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Writes the whole RAM into a new layer file `dir/name`, atomically.
    ///
    /// All-zero 64 KiB runs are left as holes, so a mostly empty guest gives a sparse file.
    pub fn write_layer(&self, dir: &Path, name: &str) -> Result<()> {
        let final_path = dir.join(name);
        let tmp_path = dir.join(format!(".{name}.tmp"));
        let file = File::create(&tmp_path).map_err(mem("create memory layer temp file"))?;
        file.set_len(self.size as u64).map_err(mem("size memory layer temp file"))?;
        // SAFETY: the whole owned range, read while no vCPU runs.
        let ram = unsafe { std::slice::from_raw_parts(self.addr, self.size) };
        for (i, page) in ram.chunks(PAGE_SIZE * 16).enumerate() {
            if page.iter().all(|&b| b == 0) {
                continue;
            }
            file.write_all_at(page, (i * PAGE_SIZE * 16) as u64).map_err(mem("write memory layer"))?;
        }
        file.sync_all().map_err(mem("fsync memory layer"))?;
        drop(file);
        std::fs::rename(&tmp_path, &final_path).map_err(mem("rename memory layer"))?;
        sync_dir(dir)
    }

    /// Maps `size` bytes of `layer` as a private copy-on-write view at a new address.
    pub fn from_layer(layer: &File, size: usize) -> Result<GuestRam> {
        let mut ram = GuestRam { addr: reserve(size)?, size };
        ram.map_layer(layer)?;
        Ok(ram)
    }

    /// Host memory this RAM holds privately (copied-on-write or anonymous pages), in bytes,
    /// from the `Anonymous:` lines of `/proc/self/smaps` for the mappings inside its range.
    pub fn private_bytes(&self) -> Result<u64> {
        self.smaps_field("Anonymous:")
    }

    /// Host memory resident in this RAM's range (shared page-cache pages included), in bytes.
    pub fn resident_bytes(&self) -> Result<u64> {
        self.smaps_field("Rss:")
    }

    fn smaps_field(&self, field: &str) -> Result<u64> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").map_err(mem("read smaps"))?;
        let (lo, hi) = (self.addr as u64, self.addr as u64 + self.size as u64);
        let mut inside = false;
        let mut kib = 0u64;
        for line in smaps.lines() {
            if let Some(range) = line.split(' ').next() {
                if let Some((a, b)) = range.split_once('-') {
                    if let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                        inside = a >= lo && b <= hi;
                        continue;
                    }
                }
            }
            if inside {
                if let Some(v) = line.strip_prefix(field) {
                    kib += v.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap_or(0);
                }
            }
        }
        Ok(kib * 1024)
    }
}

impl Drop for GuestRam {
    fn drop(&mut self) {
        release(self.addr, self.size);
    }
}

/// Reserves `size` bytes plus one inaccessible guard page on each side and returns the
/// address after the first guard. The guards keep the kernel from merging the RAM mapping
/// with a neighbour, so `/proc/self/smaps` accounts for each VM's RAM on its own.
fn reserve(size: usize) -> Result<*mut u8> {
    // SAFETY: a new inaccessible mapping at an address the kernel chooses.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size + 2 * PAGE_SIZE,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(mem("reserve guest RAM address range")(std::io::Error::last_os_error()));
    }
    // SAFETY: stays inside the reservation.
    Ok(unsafe { base.cast::<u8>().add(PAGE_SIZE) })
}

/// Unmaps RAM made by [`reserve`], guards included.
fn release(addr: *mut u8, size: usize) {
    // SAFETY: `addr` came from `reserve(size)`; the KVM slot over it died with its VM, which
    // `Vm` drops first.
    unsafe { libc::munmap(addr.sub(PAGE_SIZE).cast(), size + 2 * PAGE_SIZE) };
}

fn out_of_range(gpa: u64, len: usize, size: usize) -> Error {
    Error::Config(format!("guest access {gpa:#x}+{len} is outside guest RAM of {size} bytes"))
}

/// Makes a rename inside `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(mem("fsync snapshot directory"))
}

/// Writes `bytes` to `dir/name` atomically: temp file, fsync, rename, fsync of the directory.
pub(crate) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, dir.join(name))?;
    File::open(dir)?.sync_all()
}

/// Saved state of guest RAM: the layer file that holds it, by name relative to the snapshot.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct MemoryState {
    /// File name of the memory layer inside the snapshot directory.
    pub layer: String,
    /// RAM size in bytes (the layer's size).
    pub size: u64,
}

/// A fresh layer name: unique per process and moment, never a path.
fn new_layer_name() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    format!("mem-{nanos:x}-{:x}-{seq}.layer", std::process::id())
}

impl crate::snapshot::Snapshottable for GuestRam {
    type State = MemoryState;

    /// Freezes RAM into a new layer and re-maps this VM's own RAM onto it, so the source and
    /// its children share every clean page from now on.
    fn save(&mut self, ctx: &mut crate::snapshot::SaveContext) -> Result<MemoryState> {
        let layer = new_layer_name();
        self.write_layer(ctx.dir(), &layer)?;
        let file = File::open(ctx.dir().join(&layer)).map_err(mem("open new memory layer"))?;
        self.map_layer(&file)?;
        Ok(MemoryState { layer, size: self.size as u64 })
    }

    fn restore(&mut self, state: &MemoryState, ctx: &crate::snapshot::RestoreContext) -> Result<()> {
        if state.size != self.size as u64 {
            return Err(Error::Config(format!(
                "snapshot RAM is {} bytes, this VM has {}",
                state.size, self.size
            )));
        }
        self.map_layer(ctx.layer())
    }
}
