//! Where everything lives in a Linux guest's physical address space.
//!
//! Below 1 MiB sit the structures the VMM writes before the first instruction (GDT, zero
//! page, page tables, command line) and, in a reserved window, the ACPI tables and the
//! VMGenID page. The kernel loads at its own physical address (16 MiB for x86_64 builds),
//! RAM runs from 1 MiB up to the MMIO gap below 4 GiB and continues above 4 GiB. Devices
//! live in the gap: virtio-mmio slots first, then the IOAPIC and local APIC at their
//! architectural addresses.

use crate::{Error, Result};
use vm_memory::GuestAddress;

/// The boot GDT (see [`crate::gdt`]).
pub const GDT_ADDR: u64 = 0x500;
/// An empty IDT: the kernel installs its own before enabling interrupts.
pub const IDT_ADDR: u64 = 0x540;
/// The zero page (`struct boot_params`); its address goes to the kernel in `rsi`.
pub const ZERO_PAGE_ADDR: u64 = 0x7000;
/// Initial stack pointer (the kernel switches to its own stack immediately).
pub const BOOT_STACK_TOP: u64 = 0x8ff0;
/// Page-map level 4 of the identity map (see [`crate::paging`]).
pub const PML4_ADDR: u64 = 0x9000;
/// The one page-directory-pointer table.
pub const PDPT_ADDR: u64 = 0xa000;
/// The one page directory: 512 entries of 2 MiB map the first 1 GiB.
pub const PD_ADDR: u64 = 0xb000;
/// The kernel command line, NUL-terminated.
pub const CMDLINE_ADDR: u64 = 0x20000;
/// The longest command line an x86_64 kernel keeps (`COMMAND_LINE_SIZE`), with its NUL.
pub const CMDLINE_MAX: usize = 2048;
/// Start of the reserved window below 1 MiB (where a PC's extended BIOS data area begins).
pub const EBDA_START: u64 = 0x9fc00;
/// The RSDP: the first place Linux scans for it, and given in the zero page as well.
pub const RSDP_ADDR: u64 = 0xe0000;
/// The other ACPI tables follow the RSDP's page.
pub const ACPI_TABLES_ADDR: u64 = 0xe1000;
/// End of the space the ACPI tables may use (the VMGenID page follows).
pub const ACPI_TABLES_END: u64 = VMGENID_ADDR;
/// The VMGenID page: its first 16 bytes are the generation id the guest reads. The DSDT's
/// VMGenID device points here; the vmgenid device (branchbox-virtio) writes the id.
pub const VMGENID_ADDR: u64 = 0xff000;
/// Bytes of the generation id at [`VMGENID_ADDR`].
pub const VMGENID_LEN: u64 = 16;
/// IOAPIC pin of the VMGenID change notification: the DSDT's generic event device turns an
/// interrupt here into `Notify(VGEN, 0x80)` (the first pin after the virtio-mmio slots).
pub const VMGENID_IRQ: u32 = VIRTIO_IRQ_BASE + VIRTIO_MMIO_MAX;
/// Start of high memory: RAM above the reserved window, where the kernel may place itself.
pub const HIMEM_START: u64 = 0x10_0000;
/// Start of the device gap below 4 GiB; RAM stops here and resumes at 4 GiB.
pub const MMIO_GAP_START: u64 = 0xc000_0000;
/// End of the device gap (4 GiB).
pub const MMIO_GAP_END: u64 = 0x1_0000_0000;
/// First virtio-mmio device's registers; each device has one [`VIRTIO_MMIO_SIZE`] slot.
pub const VIRTIO_MMIO_BASE: u64 = 0xd000_0000;
/// Bytes of one virtio-mmio device's register window.
pub const VIRTIO_MMIO_SIZE: u64 = 0x1000;
/// Most virtio-mmio devices a guest gets (one IOAPIC pin each, from [`VIRTIO_IRQ_BASE`]).
pub const VIRTIO_MMIO_MAX: u32 = 16;
/// IOAPIC pin of the first virtio-mmio device (0-4 belong to the PIT, keyboard, COM ports).
pub const VIRTIO_IRQ_BASE: u32 = 5;
/// The IOAPIC's registers.
pub const IOAPIC_ADDR: u64 = 0xfec0_0000;
/// The local APICs' registers.
pub const LAPIC_ADDR: u64 = 0xfee0_0000;
/// COM1: the 8250 UART's first port.
pub const SERIAL_PORT: u16 = 0x3f8;
/// Ports of the 8250 UART.
pub const SERIAL_PORT_LEN: u16 = 8;
/// COM1's interrupt line.
pub const SERIAL_IRQ: u32 = 4;
/// The i8042 keyboard controller's ports (data at 0x60, command/status at 0x64).
pub const I8042_PORT: u16 = 0x60;
/// Ports of the i8042 controller.
pub const I8042_PORT_LEN: u16 = 5;

/// Smallest guest RAM: the structures below 1 MiB, a kernel at 16 MiB and room to run.
pub const MIN_MEM: u64 = 64 << 20;
/// Largest guest RAM this layout describes.
pub const MAX_MEM: u64 = 64 << 30;
/// Most vCPUs: the ACPI MADT's processor ids and APIC ids are one byte each.
pub const MAX_VCPUS: u8 = 254;

/// Guest RAM of `mem_size` bytes as regions `(start, len)`: one below the device gap and,
/// past the gap's start, one from 4 GiB on.
pub fn ram_regions(mem_size: u64) -> Result<Vec<(GuestAddress, usize)>> {
    check_mem_size(mem_size)?;
    let low = mem_size.min(MMIO_GAP_START);
    let mut regions = vec![(GuestAddress(0), to_usize(low)?)];
    if mem_size > MMIO_GAP_START {
        regions.push((GuestAddress(MMIO_GAP_END), to_usize(mem_size - MMIO_GAP_START)?));
    }
    Ok(regions)
}

/// The guest-physical address one past the last byte of RAM.
pub fn ram_end(mem_size: u64) -> u64 {
    if mem_size > MMIO_GAP_START {
        MMIO_GAP_END + (mem_size - MMIO_GAP_START)
    } else {
        mem_size
    }
}

/// Checks that `mem_size` is a RAM size this layout can describe.
pub fn check_mem_size(mem_size: u64) -> Result<()> {
    if !(MIN_MEM..=MAX_MEM).contains(&mem_size) || mem_size % (2 << 20) != 0 {
        return Err(Error::MemSize { given: mem_size, min: MIN_MEM, max: MAX_MEM });
    }
    Ok(())
}

/// The register window and interrupt line of virtio-mmio device number `index`.
pub fn virtio_mmio_slot(index: u32) -> Result<(GuestAddress, u32)> {
    if index >= VIRTIO_MMIO_MAX {
        return Err(Error::TooManyDevices { index, max: VIRTIO_MMIO_MAX });
    }
    Ok((GuestAddress(VIRTIO_MMIO_BASE + u64::from(index) * VIRTIO_MMIO_SIZE), VIRTIO_IRQ_BASE + index))
}

// The device window lies inside the gap, and the VMGenID page is the last one below 1 MiB.
const _: () = assert!(VIRTIO_MMIO_BASE >= MMIO_GAP_START && VMGENID_ADDR + 4096 == HIMEM_START);

fn to_usize(v: u64) -> Result<usize> {
    usize::try_from(v).map_err(|_| Error::MemSize { given: v, min: MIN_MEM, max: MAX_MEM })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ram_splits_around_the_device_gap() {
        assert_eq!(ram_regions(256 << 20).unwrap(), vec![(GuestAddress(0), 256 << 20)]);
        let big = 4u64 << 30;
        let regions = ram_regions(big).unwrap();
        assert_eq!(regions[0], (GuestAddress(0), MMIO_GAP_START as usize));
        assert_eq!(regions[1], (GuestAddress(MMIO_GAP_END), (big - MMIO_GAP_START) as usize));
        assert_eq!(ram_end(big), MMIO_GAP_END + big - MMIO_GAP_START);
    }

    #[test]
    fn sizes_outside_the_layout_are_refused() {
        for bad in [0, MIN_MEM - (2 << 20), MAX_MEM + (2 << 20), MIN_MEM + 4096] {
            let err = ram_regions(bad).unwrap_err();
            assert!(matches!(err, Error::MemSize { given, .. } if given == bad), "{bad}: {err}");
        }
    }

    #[test]
    fn virtio_slots_do_not_overlap_the_apics() {
        let (last, irq) = virtio_mmio_slot(VIRTIO_MMIO_MAX - 1).unwrap();
        assert!(last.0 + VIRTIO_MMIO_SIZE <= IOAPIC_ADDR);
        assert!(irq < VMGENID_IRQ && VMGENID_IRQ < 24, "the IOAPIC has 24 pins");
        assert!(virtio_mmio_slot(VIRTIO_MMIO_MAX).is_err());
    }

    #[test]
    fn low_structures_do_not_overlap() {
        let mut spans = [
            (GDT_ADDR, 5 * 8),
            (IDT_ADDR, 8),
            (ZERO_PAGE_ADDR, 4096),
            (PML4_ADDR, 4096),
            (PDPT_ADDR, 4096),
            (PD_ADDR, 4096),
            (CMDLINE_ADDR, CMDLINE_MAX as u64),
            (EBDA_START, RSDP_ADDR - EBDA_START),
            (RSDP_ADDR, ACPI_TABLES_ADDR - RSDP_ADDR),
            (ACPI_TABLES_ADDR, ACPI_TABLES_END - ACPI_TABLES_ADDR),
            (VMGENID_ADDR, 4096),
        ];
        spans.sort();
        for w in spans.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "{:#x?} overlaps {:#x?}", w[0], w[1]);
        }
    }
}
