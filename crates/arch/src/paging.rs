//! The identity map a vCPU starts with in 64-bit mode.
//!
//! Entering the kernel in long mode needs paging on; the kernel replaces these tables within
//! its first instructions, so they only have to map what it touches before that: itself (at
//! 16 MiB), the zero page and the command line. The first 1 GiB is mapped with 2 MiB pages
//! (1 GiB pages fault on the PVM hosts we test on, see HOST.md).

use crate::layout::{PDPT_ADDR, PD_ADDR, PML4_ADDR};
use crate::{Error, Result};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

/// Present and writable.
const PRESENT_RW: u64 = 0x3;
/// Page-size bit: a page-directory entry maps a 2 MiB page.
const HUGE: u64 = 0x80;
/// Bytes a 2 MiB page maps.
const PAGE_2M: u64 = 2 << 20;
/// Bytes the identity map covers.
pub const IDENTITY_MAPPED: u64 = 512 * PAGE_2M;

/// The page-table entries, as `(address of the entry, value)`.
pub fn identity_map_entries() -> Vec<(u64, u64)> {
    let mut entries = Vec::with_capacity(514);
    entries.push((PML4_ADDR, PDPT_ADDR | PRESENT_RW));
    entries.push((PDPT_ADDR, PD_ADDR | PRESENT_RW));
    entries.extend((0..512u64).map(|i| (PD_ADDR + 8 * i, (i * PAGE_2M) | PRESENT_RW | HUGE)));
    entries
}

/// Writes the identity map; `cr3` is then [`PML4_ADDR`].
pub fn write_identity_map<M: GuestMemoryBackend>(mem: &M) -> Result<()> {
    for (addr, value) in identity_map_entries() {
        mem.write_obj(value, GuestAddress(addr))
            .map_err(|e| Error::Write { what: "page tables", error: e })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;

    /// Walks the tables in guest memory like the MMU would, for a 2 MiB-mapped address.
    fn translate(mem: &GuestMemoryMmap, va: u64) -> Option<u64> {
        let pml4e: u64 = mem.read_obj(GuestAddress(PML4_ADDR + 8 * ((va >> 39) & 0x1ff))).ok()?;
        if pml4e & 1 == 0 {
            return None;
        }
        let pdpte: u64 = mem.read_obj(GuestAddress((pml4e & !0xfff) + 8 * ((va >> 30) & 0x1ff))).ok()?;
        if pdpte & 1 == 0 || pdpte & HUGE != 0 {
            return None;
        }
        let pde: u64 = mem.read_obj(GuestAddress((pdpte & !0xfff) + 8 * ((va >> 21) & 0x1ff))).ok()?;
        if pde & 1 == 0 || pde & HUGE == 0 {
            return None;
        }
        Some((pde & !(PAGE_2M - 1) & 0x000f_ffff_ffff_ffff) | (va & (PAGE_2M - 1)))
    }

    #[test]
    fn the_first_gigabyte_maps_to_itself() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        write_identity_map(&mem).unwrap();
        for va in [0, 0x7000, 0x100_0000, 0x1234_5678, IDENTITY_MAPPED - 1] {
            assert_eq!(translate(&mem, va), Some(va), "{va:#x}");
        }
        assert_eq!(translate(&mem, IDENTITY_MAPPED), None, "past 1 GiB nothing is mapped");
        let pde: u64 = mem.read_obj(GuestAddress(PD_ADDR + 8)).unwrap();
        assert_eq!(pde, 0x20_0083, "present, writable, 2 MiB page at 2 MiB");
    }
}
