//! The zero page (`struct boot_params`) and the e820 memory map in it.

use crate::layout::{
    ram_end, CMDLINE_ADDR, EBDA_START, HIMEM_START, MMIO_GAP_END, MMIO_GAP_START, RSDP_ADDR, ZERO_PAGE_ADDR,
};
use crate::{Error, Result};
use linux_loader::configurator::linux::LinuxBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::bootparam::{boot_e820_entry, boot_params};
use vm_memory::{GuestAddress, GuestMemoryBackend};

/// e820 type of usable RAM.
pub const E820_RAM: u32 = 1;
/// e820 type of reserved memory.
pub const E820_RESERVED: u32 = 2;

/// `boot_flag`: the 0xAA55 signature of a valid setup header.
const BOOT_FLAG: u16 = 0xaa55;
/// `header`: "HdrS", the setup header's magic.
const HDR_MAGIC: u32 = 0x5372_6448;
/// `type_of_loader`: 0xFF, a boot loader without an assigned id.
const LOADER_UNDEFINED: u8 = 0xff;
/// `kernel_alignment`: x86_64 kernels are built for 2 MiB; 16 MiB is what they ask for.
const KERNEL_ALIGNMENT: u32 = 0x100_0000;

/// One range of the e820 map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct E820Entry {
    /// First byte.
    pub addr: u64,
    /// Length in bytes.
    pub size: u64,
    /// [`E820_RAM`] or [`E820_RESERVED`].
    pub kind: u32,
}

/// The e820 map of a guest with `mem_size` bytes of RAM: usable RAM below the reserved
/// window (EBDA up to 1 MiB, holding the ACPI tables and the VMGenID page), RAM from 1 MiB
/// to the device gap, and RAM above 4 GiB for what does not fit below it.
pub fn e820_map(mem_size: u64) -> Vec<E820Entry> {
    let mut map = vec![
        E820Entry { addr: 0, size: EBDA_START, kind: E820_RAM },
        E820Entry { addr: EBDA_START, size: HIMEM_START - EBDA_START, kind: E820_RESERVED },
        E820Entry { addr: HIMEM_START, size: mem_size.min(MMIO_GAP_START) - HIMEM_START, kind: E820_RAM },
    ];
    if mem_size > MMIO_GAP_START {
        map.push(E820Entry { addr: MMIO_GAP_END, size: ram_end(mem_size) - MMIO_GAP_END, kind: E820_RAM });
    }
    map
}

/// The zero page for a kernel entered directly in 64-bit mode: boot header magic, loader
/// type, the command line's place and length (`cmdline_len` bytes without the NUL), the
/// RSDP's address, and `e820`.
pub fn boot_params_for(cmdline_len: usize, e820: &[E820Entry]) -> Result<boot_params> {
    let mut params = boot_params::default();
    params.hdr.boot_flag = BOOT_FLAG;
    params.hdr.header = HDR_MAGIC;
    params.hdr.type_of_loader = LOADER_UNDEFINED;
    params.hdr.kernel_alignment = KERNEL_ALIGNMENT;
    params.hdr.cmd_line_ptr = CMDLINE_ADDR as u32;
    params.hdr.cmdline_size = u32::try_from(cmdline_len)
        .map_err(|_| Error::CmdlineTooLong { len: cmdline_len, max: u32::MAX as usize })?;
    params.acpi_rsdp_addr = RSDP_ADDR;
    if e820.len() > params.e820_table.len() {
        return Err(Error::E820Full { entries: e820.len(), max: params.e820_table.len() });
    }
    for (slot, entry) in params.e820_table.iter_mut().zip(e820) {
        *slot = boot_e820_entry { addr: entry.addr, size: entry.size, r#type: entry.kind };
    }
    params.e820_entries = e820.len() as u8;
    Ok(params)
}

/// Writes `params` at [`ZERO_PAGE_ADDR`].
pub fn write_zero_page<M: GuestMemoryBackend>(mem: &M, params: &boot_params) -> Result<()> {
    let boot = BootParams::new(params, GuestAddress(ZERO_PAGE_ADDR));
    LinuxBootConfigurator::write_bootparams(&boot, mem).map_err(|e| Error::ZeroPage(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestMemoryMmap};

    #[test]
    fn small_guest_map_has_low_ram_reserved_window_and_high_ram() {
        let map = e820_map(256 << 20);
        assert_eq!(
            map,
            vec![
                E820Entry { addr: 0, size: 0x9fc00, kind: E820_RAM },
                E820Entry { addr: 0x9fc00, size: 0x60400, kind: E820_RESERVED },
                E820Entry { addr: 0x10_0000, size: (256 << 20) - 0x10_0000, kind: E820_RAM },
            ]
        );
    }

    #[test]
    fn large_guest_map_skips_the_device_gap() {
        let map = e820_map(6 << 30);
        assert_eq!(map.len(), 4);
        assert_eq!(map[2].addr + map[2].size, MMIO_GAP_START);
        assert_eq!(map[3], E820Entry { addr: 1 << 32, size: (6 << 30) - MMIO_GAP_START, kind: E820_RAM });
        let ram: u64 = map.iter().filter(|e| e.kind == E820_RAM).map(|e| e.size).sum();
        assert_eq!(ram, (6 << 30) - (HIMEM_START - EBDA_START), "all RAM but the reserved window");
    }

    #[test]
    fn zero_page_carries_the_map_and_the_command_line() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let map = e820_map(128 << 20);
        write_zero_page(&mem, &boot_params_for(41, &map).unwrap()).unwrap();
        let read: boot_params = mem.read_obj(GuestAddress(ZERO_PAGE_ADDR)).unwrap();
        assert_eq!({ read.hdr.boot_flag }, 0xaa55);
        assert_eq!({ read.hdr.header }, 0x5372_6448);
        assert_eq!(read.hdr.type_of_loader, 0xff);
        assert_eq!(({ read.hdr.cmd_line_ptr }, { read.hdr.cmdline_size }), (CMDLINE_ADDR as u32, 41));
        assert_eq!({ read.acpi_rsdp_addr }, RSDP_ADDR);
        assert_eq!(read.e820_entries, 3);
        for (slot, entry) in read.e820_table.iter().zip(&map) {
            assert_eq!(({ slot.addr }, { slot.size }, { slot.r#type }), (entry.addr, entry.size, entry.kind));
        }
        // The boot_params fields sit where the x86 boot protocol says they do.
        let mut raw = [0u8; 4];
        mem.read_slice(&mut raw, GuestAddress(ZERO_PAGE_ADDR + 0x228)).unwrap();
        assert_eq!(u32::from_le_bytes(raw), CMDLINE_ADDR as u32, "cmd_line_ptr at 0x228");
        mem.read_slice(&mut raw[..1], GuestAddress(ZERO_PAGE_ADDR + 0x1e8)).unwrap();
        assert_eq!(raw[0], 3, "e820_entries at 0x1e8");
    }

    #[test]
    fn too_many_ranges_are_refused() {
        let many = vec![E820Entry { addr: 0, size: 4096, kind: E820_RAM }; 200];
        assert!(matches!(boot_params_for(1, &many), Err(Error::E820Full { entries: 200, max: 128 })));
    }
}
