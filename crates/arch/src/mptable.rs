//! The Intel MultiProcessor table (MP spec 1.4), for kernels booted without ACPI
//! (`acpi=off`, or built without it): processors, the ISA bus, the IOAPIC and how the
//! interrupt lines reach it. With ACPI present Linux reads the MADT instead.
//!
//! The floating pointer sits at the start of the reserved window below 640 KiB, one of the
//! places Linux scans; the configuration table follows it.

use crate::layout::{EBDA_START, IOAPIC_ADDR, LAPIC_ADDR, MAX_VCPUS, RSDP_ADDR};
use crate::{Error, Result};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

/// Where the floating pointer goes.
pub const MPTABLE_ADDR: u64 = EBDA_START;
/// IOAPIC pins described (the KVM in-kernel IOAPIC has 24).
const IOAPIC_PINS: u8 = 24;
const SPEC_REV: u8 = 4;
const LAPIC_VERSION: u8 = 0x14;
const IOAPIC_VERSION: u8 = 0x11;
const CPU_ENABLED: u8 = 1;
const CPU_BSP: u8 = 2;
const INT_VECTORED: u8 = 0;
const INT_NMI: u8 = 1;
const INT_EXTINT: u8 = 3;
const ISA_BUS: u8 = 0;

/// The floating pointer and the configuration table for `vcpus` processors, as bytes to
/// place at [`MPTABLE_ADDR`].
pub fn mptable(vcpus: u8) -> Result<Vec<u8>> {
    if vcpus == 0 || vcpus > MAX_VCPUS {
        return Err(Error::Vcpus { given: vcpus, max: MAX_VCPUS });
    }
    let ioapic_id = vcpus; // after the local APIC ids 0..vcpus
    let mut entries = Vec::new();
    let mut count: u16 = 0;
    for id in 0..vcpus {
        let flags = CPU_ENABLED | if id == 0 { CPU_BSP } else { 0 };
        entries.extend_from_slice(&[0, id, LAPIC_VERSION, flags]);
        entries.extend_from_slice(&0x600u32.to_le_bytes()); // family 6 signature
        entries.extend_from_slice(&0x201u32.to_le_bytes()); // FPU, APIC
        entries.extend_from_slice(&[0; 8]);
        count += 1;
    }
    entries.extend_from_slice(&[1, ISA_BUS]);
    entries.extend_from_slice(b"ISA   ");
    entries.extend_from_slice(&[2, ioapic_id, IOAPIC_VERSION, 1]);
    entries.extend_from_slice(&(IOAPIC_ADDR as u32).to_le_bytes());
    count += 2;
    // ISA IRQ n on pin n; pin 0 is the 8259's ExtINT (the PIT's IRQ 0 also reaches pin 2).
    for pin in 0..IOAPIC_PINS {
        let kind = if pin == 0 { INT_EXTINT } else { INT_VECTORED };
        entries.extend_from_slice(&[3, kind, 0, 0, ISA_BUS, pin, ioapic_id, pin]);
        count += 1;
    }
    // Every local APIC's LINT0 is ExtINT, LINT1 NMI.
    entries.extend_from_slice(&[4, INT_EXTINT, 0, 0, ISA_BUS, 0, 0xff, 0]);
    entries.extend_from_slice(&[4, INT_NMI, 0, 0, ISA_BUS, 0, 0xff, 1]);
    count += 2;

    let config_addr = MPTABLE_ADDR + 16;
    let mut config = Vec::with_capacity(44 + entries.len());
    config.extend_from_slice(b"PCMP");
    let length =
        u16::try_from(44 + entries.len()).map_err(|_| Error::Vcpus { given: vcpus, max: MAX_VCPUS })?;
    config.extend_from_slice(&length.to_le_bytes());
    config.extend_from_slice(&[SPEC_REV, 0]); // checksum at offset 7
    config.extend_from_slice(b"BRBOX   ");
    config.extend_from_slice(b"MICROVM     ");
    config.extend_from_slice(&0u32.to_le_bytes()); // no OEM table
    config.extend_from_slice(&0u16.to_le_bytes());
    config.extend_from_slice(&count.to_le_bytes());
    config.extend_from_slice(&(LAPIC_ADDR as u32).to_le_bytes());
    config.extend_from_slice(&[0, 0, 0, 0]); // no extended table
    config.extend_from_slice(&entries);
    config[7] = checksum(&config);

    let mut fp = Vec::with_capacity(16);
    fp.extend_from_slice(b"_MP_");
    fp.extend_from_slice(&(config_addr as u32).to_le_bytes());
    fp.extend_from_slice(&[1, SPEC_REV, 0, 0, 0, 0, 0, 0]); // 16 bytes, checksum at 10
    fp[10] = checksum(&fp);
    fp.extend_from_slice(&config);
    Ok(fp)
}

/// Writes the MP table for `vcpus` processors at [`MPTABLE_ADDR`].
pub fn write_mptable<M: GuestMemoryBackend>(mem: &M, vcpus: u8) -> Result<()> {
    let table = mptable(vcpus)?;
    let end = MPTABLE_ADDR + table.len() as u64;
    if end > RSDP_ADDR {
        return Err(Error::AcpiTooLarge { end, limit: RSDP_ADDR });
    }
    mem.write_slice(&table, GuestAddress(MPTABLE_ADDR))
        .map_err(|e| Error::Write { what: "MP table", error: e })
}

/// The byte that makes `bytes` sum to zero.
fn checksum(bytes: &[u8]) -> u8 {
    0u8.wrapping_sub(bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;

    fn sum(bytes: &[u8]) -> u8 {
        bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b))
    }

    #[test]
    fn floating_pointer_and_table_checksum_and_link() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        write_mptable(&mem, 4).unwrap();
        let mut fp = [0u8; 16];
        mem.read_slice(&mut fp, GuestAddress(MPTABLE_ADDR)).unwrap();
        assert_eq!(&fp[..4], b"_MP_");
        assert_eq!(sum(&fp), 0);
        let config_addr = u32::from_le_bytes(fp[4..8].try_into().unwrap()) as u64;
        let mut head = [0u8; 44];
        mem.read_slice(&mut head, GuestAddress(config_addr)).unwrap();
        assert_eq!(&head[..4], b"PCMP");
        let len = u16::from_le_bytes([head[4], head[5]]) as usize;
        let mut config = vec![0u8; len];
        mem.read_slice(&mut config, GuestAddress(config_addr)).unwrap();
        assert_eq!(sum(&config), 0);
        assert_eq!(u32::from_le_bytes(config[36..40].try_into().unwrap()), LAPIC_ADDR as u32);

        // Walk the entries: processors first (BSP only on the first), then bus, IOAPIC, pins.
        let (mut at, mut cpus, mut pins) = (44, Vec::new(), 0);
        let count = u16::from_le_bytes([config[34], config[35]]);
        for _ in 0..count {
            let kind = config[at];
            match kind {
                0 => {
                    cpus.push((config[at + 1], config[at + 3]));
                    at += 20;
                }
                3 => {
                    pins += 1;
                    at += 8;
                }
                1 | 2 | 4 => at += 8,
                other => panic!("unknown entry type {other}"),
            }
        }
        assert_eq!(at, len, "the entries fill the table exactly");
        assert_eq!(cpus, vec![(0, 3), (1, 1), (2, 1), (3, 1)], "APIC id, enabled (+ BSP)");
        assert_eq!(pins, 24);
    }

    #[test]
    fn fits_below_the_rsdp_at_the_most_vcpus() {
        let table = mptable(MAX_VCPUS).unwrap();
        assert!(MPTABLE_ADDR + table.len() as u64 <= RSDP_ADDR);
        assert!(mptable(0).is_err());
    }
}
