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

use super::layers::{Chain, LayerKind, LayerRef};
use super::page::PAGE_SIZE;
use crate::error::{mem, Error, Result};
use branchbox_persist::Snapshottable;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::Mutex;

/// Runs of at least this many pages are moved out of guest RAM to be freed off the VM's
/// path; freeing fewer in place costs less than the move's system call and mapping.
pub const MOVE_OUT_PAGES: u64 = 16;

/// One contiguous range of guest RAM starting at guest-physical address 0.
pub struct GuestRam {
    addr: *mut u8,
    size: usize,
    /// Pages the host wrote since the last [`take_host_dirty`](GuestRam::take_host_dirty):
    /// KVM's dirty log sees only the guest's writes.
    host_dirty: Mutex<Vec<u64>>,
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
        let ram = GuestRam { addr, size, host_dirty: Mutex::new(Vec::new()) };
        ram.set_forkable(0, ram.pages(), false)?;
        Ok(ram)
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
        self.set_forkable(0, self.pages(), false)
    }

    /// Replaces the whole RAM range, in place, with a private copy-on-write view of `chain`:
    /// the base layer, then one `MAP_FIXED` mapping per run of the merged index.
    pub fn map_chain(&mut self, chain: &Chain) -> Result<()> {
        if chain.size() != self.size as u64 {
            return Err(Error::Config(format!(
                "snapshot RAM is {} bytes, this VM has {}",
                chain.size(),
                self.size
            )));
        }
        self.map_pages_raw(0, self.pages(), &chain.base_layer().file, 0)?;
        for run in &chain.merged().runs {
            let layer = chain.layers().get(run.layer as usize).ok_or_else(|| {
                Error::Config(format!(
                    "merged index names layer {} of a {}-layer chain",
                    run.layer,
                    chain.layers().len()
                ))
            })?;
            self.map_pages_raw(run.page, run.len, &layer.file, run.file_page)?;
        }
        self.set_forkable(0, self.pages(), false)
    }

    /// Maps `len` pages of `file` from file page `file_page` over guest page `page`,
    /// private and copy-on-write, and keeps them out of forked writer processes.
    pub fn map_pages(&self, page: u64, len: u64, file: &File, file_page: u64) -> Result<()> {
        // MAP_FIXED would free the private copies it replaces right here; moved out first,
        // they are freed off the VM's path.
        if len >= MOVE_OUT_PAGES {
            self.move_out(page, len)?;
        }
        self.map_pages_raw(page, len, file, file_page)?;
        self.set_forkable(page, len, false)
    }

    fn map_pages_raw(&self, page: u64, len: u64, file: &File, file_page: u64) -> Result<()> {
        let start = self.page_range(page, len)?;
        // SAFETY: MAP_FIXED inside the range this value owns (checked above).
        let addr = unsafe {
            libc::mmap(
                self.addr.add(start).cast(),
                len as usize * PAGE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_NORESERVE,
                file.as_raw_fd(),
                (file_page as usize * PAGE_SIZE) as libc::off_t,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(mem("mmap layer pages MAP_FIXED|MAP_PRIVATE")(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Drops the private copies of `len` pages from guest page `page`: their next access
    /// sees the layer file again. Runs of at least [`MOVE_OUT_PAGES`] are moved out of the
    /// mapping and freed by the reaper thread (see [`super::reaper`]); shorter ones, and
    /// runs `mremap` cannot move (one spanning two mappings), are freed here
    /// (`MADV_DONTNEED`).
    pub fn drop_pages(&self, page: u64, len: u64) -> Result<()> {
        if len >= MOVE_OUT_PAGES && self.move_out(page, len)? {
            return Ok(());
        }
        self.advise(page, len, libc::MADV_DONTNEED, "madvise MADV_DONTNEED")
    }

    /// Moves the page table entries of `len` pages from guest page `page` to a new host
    /// range (`mremap` with `MREMAP_DONTUNMAP`): the guest range stays mapped as it was,
    /// empty, so it shows its file pages (zeros on anonymous RAM), and the moved range goes
    /// to the reaper. KVM's MMU notifier drops what it had mapped from the old pages. The
    /// destination has the source's offset within a 2 MiB block, so whole page tables move
    /// (one entry per 2 MiB) instead of one entry per page. `false` when the kernel refused
    /// the move (nothing changed).
    fn move_out(&self, page: u64, len: u64) -> Result<bool> {
        const BLOCK: usize = 2 << 20;
        let start = self.page_range(page, len)?;
        let bytes = len as usize * PAGE_SIZE;
        let span = bytes + BLOCK;
        // SAFETY: a new inaccessible mapping at an address the kernel chooses, owned here.
        let area = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if area == libc::MAP_FAILED {
            return Ok(false);
        }
        // SAFETY: a range inside the mapping this value owns (checked above).
        let old = unsafe { self.addr.add(start) };
        let mut dest = (area as usize & !(BLOCK - 1)) + (old as usize & (BLOCK - 1));
        if dest < area as usize {
            dest += BLOCK;
        }
        // SAFETY: moves our own pages into the area just reserved (dest..dest+bytes lies
        // inside it); the C library passes the fifth argument on, so it is always given.
        let moved = unsafe {
            let flags = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP;
            libc::mremap(old.cast(), bytes, bytes, flags, dest as *mut libc::c_void)
        };
        if moved == libc::MAP_FAILED {
            // SAFETY: the reservation made above, still untouched.
            unsafe { libc::munmap(area, span) };
            return Ok(false);
        }
        super::reaper::free(area as usize, span);
        Ok(true)
    }

    /// Whether a `fork` copies these pages into the child (`MADV_DOFORK`) or leaves them
    /// out (`MADV_DONTFORK`, the default for all guest RAM: only a checkpoint's writer
    /// process inherits RAM, and only the runs it writes).
    pub fn set_forkable(&self, page: u64, len: u64, forkable: bool) -> Result<()> {
        let advice = if forkable { libc::MADV_DOFORK } else { libc::MADV_DONTFORK };
        self.advise(page, len, advice, "madvise MADV_DOFORK/MADV_DONTFORK")
    }

    fn advise(&self, page: u64, len: u64, advice: libc::c_int, op: &'static str) -> Result<()> {
        let start = self.page_range(page, len)?;
        // SAFETY: inside the range this value owns (checked above).
        let r = unsafe { libc::madvise(self.addr.add(start).cast(), len as usize * PAGE_SIZE, advice) };
        if r != 0 {
            return Err(mem(op)(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    fn page_range(&self, page: u64, len: u64) -> Result<usize> {
        let bytes = len.checked_mul(PAGE_SIZE as u64).and_then(|b| usize::try_from(b).ok());
        let gpa = page.checked_mul(PAGE_SIZE as u64);
        match (gpa, bytes) {
            (Some(gpa), Some(bytes)) => self.check(gpa, bytes),
            _ => Err(out_of_range(page.saturating_mul(PAGE_SIZE as u64), usize::MAX, self.size)),
        }
    }

    /// Number of pages of RAM.
    pub fn pages(&self) -> u64 {
        (self.size / PAGE_SIZE) as u64
    }

    /// Host address of guest page `page` (for the checkpoint writer); `None` outside RAM.
    pub(crate) fn page_addr(&self, page: u64) -> Option<usize> {
        self.page_range(page, 1).ok().map(|off| self.addr as usize + off)
    }

    /// Takes the pages the host wrote since the last call (sorted, unique).
    pub fn take_host_dirty(&self) -> Vec<u64> {
        let mut pages = std::mem::take(&mut *self.host_dirty.lock().unwrap_or_else(|e| e.into_inner()));
        pages.sort_unstable();
        pages.dedup();
        pages
    }

    /// Guest pages that hold a private copy (written since the range was last mapped from
    /// its layers), sorted, from `/proc/self/pagemap`.
    pub fn private_pages(&self) -> Result<Vec<u64>> {
        super::dirty::private_pages(self.addr as usize, self.size)
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
        if !data.is_empty() {
            let first = (start / PAGE_SIZE) as u64;
            let last = ((start + data.len() - 1) / PAGE_SIZE) as u64;
            let mut dirty = self.host_dirty.lock().unwrap_or_else(|e| e.into_inner());
            for p in first..=last {
                if dirty.last() != Some(&p) {
                    dirty.push(p);
                }
            }
        }
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
    /// Returns the CRC-32 of the whole image, which the snapshot records for verification.
    pub fn write_layer(&self, dir: &Path, name: &str) -> Result<u32> {
        let final_path = dir.join(name);
        let tmp_path = dir.join(format!(".{name}.tmp"));
        let file = File::create(&tmp_path).map_err(mem("create memory layer temp file"))?;
        file.set_len(self.size as u64).map_err(mem("size memory layer temp file"))?;
        // SAFETY: the whole owned range, read while no vCPU runs.
        let ram = unsafe { std::slice::from_raw_parts(self.addr, self.size) };
        let mut crc = crc32fast::Hasher::new();
        for (i, page) in ram.chunks(PAGE_SIZE * 16).enumerate() {
            crc.update(page);
            if page.iter().all(|&b| b == 0) {
                continue;
            }
            file.write_all_at(page, (i * PAGE_SIZE * 16) as u64).map_err(mem("write memory layer"))?;
        }
        file.sync_all().map_err(mem("fsync memory layer"))?;
        drop(file);
        std::fs::rename(&tmp_path, &final_path).map_err(mem("rename memory layer"))?;
        sync_dir(dir)?;
        Ok(crc.finalize())
    }

    /// Maps `size` bytes of `layer` as a private copy-on-write view at a new address.
    pub fn from_layer(layer: &File, size: usize) -> Result<GuestRam> {
        let mut ram = GuestRam { addr: reserve(size)?, size, host_dirty: Mutex::new(Vec::new()) };
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

/// Saved state of guest RAM: the chain of layer files that holds it, by name relative to
/// the snapshot directory.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct MemoryState {
    /// RAM size in bytes.
    pub size: u64,
    /// The layers, base first, then deltas oldest first.
    pub layers: Vec<LayerRef>,
}

/// A fresh layer name with `ext`: unique per process and moment, never a path.
pub(crate) fn new_layer_name(ext: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    format!("mem-{nanos:x}-{:x}-{seq}.{ext}", std::process::id())
}

/// Saving RAM records the layers (base first) the checkpoint prepared for it: the checkpoint
/// code writes them, the base inline, deltas in a writer process. Restoring maps a chain of
/// opened layers.
impl Snapshottable for GuestRam {
    type State = MemoryState;
    type SaveCtx = [LayerRef];
    type RestoreCtx = Chain;
    type Error = Error;

    fn save(&mut self, layers: &mut [LayerRef]) -> Result<MemoryState> {
        let layers = layers.to_vec();
        match layers.first() {
            Some(LayerRef { kind: LayerKind::Base { .. }, .. }) => {
                Ok(MemoryState { size: self.size as u64, layers })
            }
            _ => Err(Error::Config("a snapshot was saved without a base memory layer".into())),
        }
    }

    fn restore(&mut self, state: &MemoryState, chain: &Chain) -> Result<()> {
        if state.size != self.size as u64 {
            return Err(Error::Config(format!(
                "snapshot RAM is {} bytes, this VM has {}",
                state.size, self.size
            )));
        }
        self.map_chain(chain)
    }
}

#[cfg(test)]
mod tests {
    use super::{GuestRam, MOVE_OUT_PAGES, PAGE_SIZE};
    use std::io::Write;

    /// A RAM of `pages` pages over a layer whose page `i` holds byte `i + 1` throughout.
    fn ram_over_layer(pages: u64) -> (GuestRam, tempfile::NamedTempFile) {
        let mut layer = tempfile::NamedTempFile::new().expect("layer file");
        for i in 0..pages {
            layer.write_all(&[(i + 1) as u8; PAGE_SIZE]).expect("write layer");
        }
        let ram = GuestRam::from_layer(layer.as_file(), pages as usize * PAGE_SIZE).expect("map layer");
        (ram, layer)
    }

    fn first_byte(ram: &GuestRam, page: u64) -> u8 {
        let mut b = [0u8; 1];
        ram.read(page * PAGE_SIZE as u64, &mut b).expect("read");
        b[0]
    }

    #[test]
    fn dropped_runs_long_and_short_show_the_layer_again() {
        let pages = 4 * MOVE_OUT_PAGES;
        let (ram, _layer) = ram_over_layer(pages);
        let long = (3, 2 * MOVE_OUT_PAGES);
        let short = (long.0 + long.1 + 1, MOVE_OUT_PAGES - 1);
        for p in 0..pages {
            ram.write(p * PAGE_SIZE as u64, &[0xee]).expect("write");
        }
        // The long run is moved out (asserted: a refused move would fall back silently).
        assert!(ram.move_out(long.0, long.1).expect("move out"), "mremap refused the move");
        ram.drop_pages(short.0, short.1).expect("drop");
        for p in 0..pages {
            let dropped = [long, short].iter().any(|&(s, l)| p >= s && p < s + l);
            let want = if dropped { (p + 1) as u8 } else { 0xee };
            assert_eq!(first_byte(&ram, p), want, "page {p} (dropped: {dropped})");
        }
        // Writing a dropped page copies it again; its neighbours keep the layer's content.
        ram.write(long.0 * PAGE_SIZE as u64, &[0x42]).expect("write again");
        assert_eq!(first_byte(&ram, long.0), 0x42);
        assert_eq!(first_byte(&ram, long.0 + 1), (long.0 + 2) as u8);
    }

    /// The host's record of written pages (`/proc/self/pagemap`) sees exactly the pages the
    /// VMM wrote into a private file mapping, and none once the mapping is replaced.
    #[test]
    fn written_pages_of_a_private_file_mapping_are_found() {
        let file = tempfile::tempfile().unwrap();
        file.set_len(64 * PAGE_SIZE as u64).unwrap();
        let mut ram = GuestRam::from_layer(&file, 64 * PAGE_SIZE).unwrap();
        let mut b = [0u8; 8];
        ram.read(0, &mut b).unwrap();
        for p in [3u64, 4, 40] {
            ram.write(p * PAGE_SIZE as u64, &[1]).unwrap();
        }
        assert_eq!(ram.private_pages().unwrap(), vec![3, 4, 40]);
        let addr = ram.host_addr() as usize;
        let pagemap = std::fs::File::open("/proc/self/pagemap").unwrap();
        assert_eq!(crate::memory::dirty::scan_read(&pagemap, addr, 64 * PAGE_SIZE).unwrap(), vec![3, 4, 40]);
        ram.map_layer(&file).unwrap();
        assert!(ram.private_pages().unwrap().is_empty());
    }
}
