//! Finding the guest pages written since a point: from `/proc/self/pagemap` (a page of a
//! `MAP_PRIVATE` file mapping that is anonymous has been written since it was mapped) or
//! from KVM's dirty log (`KVM_GET_DIRTY_LOG`, see `Vm`). Both are measured by
//! `bench_checkpoint`; `docs/microvm.md` says which is used where and why.

use super::page::PAGE_SIZE;
use crate::error::{mem, Result};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;

/// `struct page_region` of the `PAGEMAP_SCAN` ioctl (Linux 6.7+).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

/// `struct pm_scan_arg` of the `PAGEMAP_SCAN` ioctl.
#[repr(C)]
#[derive(Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// `_IOWR('f', 16, struct pm_scan_arg)`.
const PAGEMAP_SCAN: libc::c_ulong = 0xC060_6610;
const PAGE_IS_FILE: u64 = 1 << 2;
const PAGE_IS_PRESENT: u64 = 1 << 3;
const PAGE_IS_SWAPPED: u64 = 1 << 4;
/// pagemap entry bits: present, swapped out, and "file page or shared anonymous".
const PM_PRESENT: u64 = 1 << 63;
const PM_SWAP: u64 = 1 << 62;
const PM_FILE: u64 = 1 << 61;

/// Pages of `[addr, addr+size)` the process holds privately, sorted: anonymous and in memory
/// or swapped out (a swapped-out page was written as surely as a present one). In a private
/// file mapping these are the pages written since it was mapped; in an anonymous mapping,
/// every page ever touched (the others read as zeros).
pub(crate) fn private_pages(addr: usize, size: usize) -> Result<Vec<u64>> {
    let pagemap = File::open("/proc/self/pagemap").map_err(mem("open /proc/self/pagemap"))?;
    match scan_ioctl(&pagemap, addr, size) {
        Some(pages) => Ok(pages),
        None => scan_read(&pagemap, addr, size),
    }
}

/// `PAGEMAP_SCAN`: the kernel walks the page tables and returns only matching runs.
/// `None` when the kernel lacks the ioctl.
fn scan_ioctl(pagemap: &File, addr: usize, size: usize) -> Option<Vec<u64>> {
    let mut regions = vec![PageRegion::default(); 512];
    let mut out = Vec::new();
    let end = (addr + size) as u64;
    let mut start = addr as u64;
    while start < end {
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            start,
            end,
            vec: regions.as_mut_ptr() as u64,
            vec_len: regions.len() as u64,
            // Not file-backed (inverting FILE makes "is file" a required zero), and present
            // or swapped out.
            category_inverted: PAGE_IS_FILE,
            category_mask: PAGE_IS_FILE,
            category_anyof_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
            return_mask: PAGE_IS_FILE | PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
            ..Default::default()
        };
        // SAFETY: `arg` points at `regions`, which has `vec_len` entries.
        let n = unsafe { libc::ioctl(pagemap.as_raw_fd(), PAGEMAP_SCAN, &mut arg) };
        if n < 0 {
            return None;
        }
        for r in regions.iter().take(n as usize) {
            let first = (r.start - addr as u64) / PAGE_SIZE as u64;
            let last = (r.end - addr as u64) / PAGE_SIZE as u64;
            out.extend(first..last);
        }
        if arg.walk_end <= start {
            return None;
        }
        start = arg.walk_end;
    }
    Some(out)
}

/// The portable way: one 8-byte pagemap entry per page.
pub(crate) fn scan_read(pagemap: &File, addr: usize, size: usize) -> Result<Vec<u64>> {
    let pages = size / PAGE_SIZE;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 8 * 4096];
    let mut done = 0usize;
    while done < pages {
        let n = (buf.len() / 8).min(pages - done);
        let off = ((addr / PAGE_SIZE + done) * 8) as u64;
        pagemap.read_exact_at(&mut buf[..n * 8], off).map_err(mem("read /proc/self/pagemap"))?;
        for (i, e) in buf[..n * 8].chunks_exact(8).enumerate() {
            let entry = e.iter().rev().fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
            if entry & (PM_PRESENT | PM_SWAP) != 0 && entry & PM_FILE == 0 {
                out.push((done + i) as u64);
            }
        }
        done += n;
    }
    Ok(out)
}

/// Page numbers of the set bits of a KVM dirty bitmap (bit i of word w is page 64w + i).
pub(crate) fn bitmap_pages(bitmap: &[u64]) -> Vec<u64> {
    let mut out = Vec::new();
    for (w, &word) in bitmap.iter().enumerate() {
        let mut bits = word;
        while bits != 0 {
            out.push(w as u64 * 64 + u64::from(bits.trailing_zeros()));
            bits &= bits - 1;
        }
    }
    out
}

/// Union of two sorted, unique page lists.
pub(crate) fn union(a: &[u64], b: &[u64]) -> Vec<u64> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        match (a.get(i), b.get(j)) {
            (Some(&x), Some(&y)) if x == y => {
                out.push(x);
                i += 1;
                j += 1;
            }
            (Some(&x), Some(&y)) if x < y => {
                out.push(x);
                i += 1;
            }
            (Some(&x), None) => {
                out.push(x);
                i += 1;
            }
            (_, Some(&y)) => {
                out.push(y);
                j += 1;
            }
            (None, None) => break,
        }
    }
    out
}

/// Runs `(first page, pages)` of a sorted page list.
pub(crate) fn runs(pages: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &p in pages {
        match out.last_mut() {
            Some((start, len)) if *start + *len == p => *len += 1,
            _ => out.push((p, 1)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmap_union_and_runs() {
        assert_eq!(bitmap_pages(&[0b1011, 1 << 63]), vec![0, 1, 3, 127]);
        assert_eq!(union(&[1, 3, 5], &[2, 3, 9]), vec![1, 2, 3, 5, 9]);
        assert_eq!(runs(&[1, 2, 3, 7, 8]), vec![(1, 3), (7, 2)]);
    }
}
