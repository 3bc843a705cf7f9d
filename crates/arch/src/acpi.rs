//! ACPI tables: how the guest finds its CPUs, interrupt controllers and the VMGenID device.
//!
//! RSDP -> XSDT -> {FADT -> DSDT, MADT}. The FADT declares a hardware-reduced platform (no
//! PM timer or SCI blocks to emulate). The MADT lists one local APIC per vCPU, the IOAPIC,
//! and the override that routes the PIT's IRQ 0 to IOAPIC pin 2 (where KVM's in-kernel
//! PIT delivers it). The DSDT holds the VMGenID device, whose `ADDR` names the page the
//! vmgenid device writes the generation id into, a generic event device (GED) that turns
//! an interrupt on [`VMGENID_IRQ`] into the `Notify` the guest's vmgenid driver waits for,
//! COM1 (`PNP0501`, its ports and IRQ 4), and one `LNRO0005` device per virtio-mmio slot with
//! its registers and interrupt in `_CRS`.
//!
//! The virtio-mmio devices must be described here, not on the command line: a hardware-reduced
//! ACPI platform has no legacy PIC, so Linux creates no interrupt for an IOAPIC pin until an
//! ACPI resource names it (`acpi_register_gsi`). A `virtio_mmio.device=...:5` entry hands the
//! driver a bare number 5 that no interrupt stands behind, and every probe fails with -EINVAL
//! (seen under nested KVM: no /dev/vda, no vsock, `VFS: Unable to mount root fs`). COM1 is the
//! same: the 8250 driver's built-in port names IRQ 4, which does not exist either, so the port
//! cannot be opened and init's `/dev/console` is missing (the agent, PID 1, lost its standard
//! error and its diagnostics); described in the DSDT, the 8250 PNP driver takes its interrupt
//! from `_CRS`.

use crate::layout::{
    ACPI_TABLES_ADDR, ACPI_TABLES_END, IOAPIC_ADDR, LAPIC_ADDR, MAX_VCPUS, RSDP_ADDR, SERIAL_IRQ,
    SERIAL_PORT, SERIAL_PORT_LEN, VIRTIO_MMIO_MAX, VMGENID_ADDR, VMGENID_IRQ,
};
use crate::{Error, Result};
use acpi_tables::aml::{
    Arg, Device, EISAName, Equal, If, Interrupt, Memory32Fixed, Method, Name, Notify, Package, Path,
    ResourceTemplate, Scope, IO,
};
use acpi_tables::fadt::{FADTBuilder, Flags};
use acpi_tables::madt::{EnabledStatus, IoApic, ProcessorLocalApic};
use acpi_tables::rsdp::Rsdp;
use acpi_tables::sdt::Sdt;
use acpi_tables::xsdt::XSDT;
use acpi_tables::{Aml, AmlSink};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

const OEM_ID: [u8; 6] = *b"BRBOX ";
const OEM_REVISION: u32 = 1;
/// MADT flag: the platform also has dual 8259 PICs (KVM's in-kernel irqchip does).
const MADT_PCAT_COMPAT: u32 = 1;
/// FADT IA-PC boot flags: no VGA, no MSI (devices are virtio-mmio with IOAPIC pins).
const IAPC_VGA_NOT_PRESENT: u16 = 1 << 2;
const IAPC_MSI_NOT_SUPPORTED: u16 = 1 << 3;

/// Where each table went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcpiTables {
    /// Root pointer (also given to the kernel in the zero page).
    pub rsdp: u64,
    /// Extended system description table.
    pub xsdt: u64,
    /// Fixed ACPI description table.
    pub fadt: u64,
    /// Multiple APIC description table.
    pub madt: u64,
    /// Differentiated system description table (AML).
    pub dsdt: u64,
}

/// A virtio-mmio device as the DSDT describes it: its register window and its IOAPIC pin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmioDevice {
    /// Guest-physical address of the registers (below 4 GiB).
    pub addr: u64,
    /// Bytes of the register window.
    pub len: u64,
    /// IOAPIC pin (GSI) of its interrupt.
    pub irq: u32,
}

/// Linux's ACPI id for a virtio-mmio device (drivers/virtio/virtio_mmio.c matches it).
const VIRTIO_MMIO_HID: &str = "LNRO0005";

/// The AML of virtio-mmio device number `index`: `\_SB.VRxx` with `_HID` LNRO0005, a `_UID`,
/// and in `_CRS` its registers (32-bit fixed memory, read-write) and its interrupt (edge,
/// active high, exclusive: the VMM raises it through an irqfd).
fn mmio_device_aml(index: usize, dev: &MmioDevice) -> Result<Vec<u8>> {
    let (Ok(base), Ok(len)) = (u32::try_from(dev.addr), u32::try_from(dev.len)) else {
        return Err(Error::DeviceAbove4G { index, addr: dev.addr, len: dev.len });
    };
    let uid = index as u32;
    let regs = Memory32Fixed::new(true, base, len);
    Ok(device_aml(&format!("VR{index:02X}"), &VIRTIO_MMIO_HID, &uid, &regs, dev.irq))
}

/// COM1 as `\_SB.COM1`: a 16550 (`PNP0501`) at its ports with its interrupt (edge, active
/// high: the VMM raises it through an irqfd).
fn com1_aml() -> Vec<u8> {
    let ports = IO::new(SERIAL_PORT, SERIAL_PORT, 1, SERIAL_PORT_LEN as u8);
    device_aml("COM1", &EISAName::new("PNP0501"), &0u8, &ports, SERIAL_IRQ)
}

/// `Device(name)` with `_HID`, `_UID` and a `_CRS` of `resource` and one interrupt on `irq`
/// (consumer, edge, active high, exclusive: the VMM raises it through an irqfd).
fn device_aml(name: &str, hid: &dyn Aml, uid: &dyn Aml, resource: &dyn Aml, irq: u32) -> Vec<u8> {
    let hid = Name::new(Path::new("_HID"), hid);
    let uid = Name::new(Path::new("_UID"), uid);
    let irq = Interrupt::new(true, true, false, false, irq);
    let crs_template = ResourceTemplate::new(vec![resource, &irq]);
    let crs = Name::new(Path::new("_CRS"), &crs_template);
    let mut aml = Vec::new();
    Device::new(Path::new(name), vec![&hid, &uid, &crs]).to_aml_bytes(&mut aml);
    aml
}

/// AML bytes already encoded, placed as they are.
struct Raw(Vec<u8>);

impl Aml for Raw {
    fn to_aml_bytes(&self, sink: &mut dyn AmlSink) {
        sink.vec(&self.0);
    }
}

/// The DSDT's AML under `\_SB`: the VMGenID device, the generic event device, COM1 and one
/// device per virtio-mmio slot in `devices` (at most [`VIRTIO_MMIO_MAX`]).
pub fn dsdt_aml(devices: &[MmioDevice]) -> Result<Vec<u8>> {
    if devices.len() > VIRTIO_MMIO_MAX as usize {
        return Err(Error::TooManyDevices { index: devices.len() as u32 - 1, max: VIRTIO_MMIO_MAX });
    }
    let low = (VMGENID_ADDR & 0xffff_ffff) as u32;
    let high = (VMGENID_ADDR >> 32) as u32;
    let addr = Package::new(vec![&low, &high]);
    let hid = Name::new(Path::new("_HID"), &"VMGENCTR");
    let cid = Name::new(Path::new("_CID"), &"VM_GEN_COUNTER");
    let ddn = Name::new(Path::new("_DDN"), &"VM_GEN_COUNTER");
    let addr = Name::new(Path::new("ADDR"), &addr);
    let vgen = Device::new(Path::new("VGEN"), vec![&hid, &cid, &ddn, &addr]);

    // GED (ACPI0013): on its interrupt the kernel runs _EVT with the GSI number.
    let ged_hid = Name::new(Path::new("_HID"), &"ACPI0013");
    let irq = Interrupt::new(true, true, false, false, VMGENID_IRQ);
    let crs_template = ResourceTemplate::new(vec![&irq]);
    let crs = Name::new(Path::new("_CRS"), &crs_template);
    let vgen_path = Path::new("\\_SB_.VGEN");
    let changed = 0x80u8;
    let notify = Notify::new(&vgen_path, &changed);
    let is_vmgenid = Equal::new(&Arg(0), &VMGENID_IRQ);
    let when = If::new(&is_vmgenid, vec![&notify]);
    let evt = Method::new(Path::new("_EVT"), 1, true, vec![&when]);
    let ged = Device::new(Path::new("GED_"), vec![&ged_hid, &crs, &evt]);

    let virtio = devices
        .iter()
        .enumerate()
        .map(|(i, d)| mmio_device_aml(i, d).map(Raw))
        .collect::<Result<Vec<Raw>>>()?;
    let com1 = Raw(com1_aml());
    let mut children: Vec<&dyn Aml> = vec![&vgen, &ged, &com1];
    children.extend(virtio.iter().map(|d| d as &dyn Aml));
    let mut aml = Vec::new();
    Scope::new(Path::new("\\_SB_"), children).to_aml_bytes(&mut aml);
    Ok(aml)
}

/// The MADT for `vcpus` processors.
pub fn madt(vcpus: u8) -> Result<Vec<u8>> {
    check_vcpus(vcpus)?;
    let mut madt = Sdt::new(*b"APIC", 36, 6, OEM_ID, *b"BRBXMADT", OEM_REVISION);
    madt.append_slice(&(LAPIC_ADDR as u32).to_le_bytes());
    madt.append_slice(&MADT_PCAT_COMPAT.to_le_bytes());
    let mut entries = Vec::new();
    for id in 0..vcpus {
        ProcessorLocalApic::new(id, id, EnabledStatus::Enabled).to_aml_bytes(&mut entries);
    }
    IoApic::new(0, IOAPIC_ADDR as u32, 0).to_aml_bytes(&mut entries);
    // Interrupt source override (type 2): ISA IRQ 0 arrives on GSI 2, edge, active high.
    entries.extend_from_slice(&[2, 10, 0, 0]);
    entries.extend_from_slice(&2u32.to_le_bytes());
    entries.extend_from_slice(&0u16.to_le_bytes());
    // Local APIC NMI (type 4): every processor's LINT1 is the NMI line.
    entries.extend_from_slice(&[4, 6, 0xff, 0, 0, 1]);
    madt.append_slice(&entries);
    Ok(madt.as_slice().to_vec())
}

/// Writes all tables for `vcpus` processors and the virtio-mmio `devices`, the RSDP at
/// [`RSDP_ADDR`] and the rest from [`ACPI_TABLES_ADDR`].
pub fn write_acpi_tables<M: GuestMemoryBackend>(
    mem: &M,
    vcpus: u8,
    devices: &[MmioDevice],
) -> Result<AcpiTables> {
    let mut next = ACPI_TABLES_ADDR;
    let mut place = |bytes: &[u8]| -> Result<u64> {
        let at = next;
        let end = at + bytes.len() as u64;
        if end > ACPI_TABLES_END {
            return Err(Error::AcpiTooLarge { end, limit: ACPI_TABLES_END });
        }
        mem.write_slice(bytes, GuestAddress(at))
            .map_err(|e| Error::Write { what: "ACPI tables", error: e })?;
        // Keep every table 8-byte aligned.
        next = (end + 7) & !7;
        Ok(at)
    };

    let mut dsdt = Sdt::new(*b"DSDT", 36, 6, OEM_ID, *b"BRBXDSDT", OEM_REVISION);
    dsdt.append_slice(&dsdt_aml(devices)?);
    let dsdt_addr = place(dsdt.as_slice())?;

    let mut fadt = FADTBuilder::new(OEM_ID, *b"BRBXFACP", OEM_REVISION)
        .dsdt_64(dsdt_addr)
        .flag(Flags::HwReducedAcpi)
        .flag(Flags::PwrButton)
        .flag(Flags::SlpButton);
    fadt.iapc_boot_arch = (IAPC_VGA_NOT_PRESENT | IAPC_MSI_NOT_SUPPORTED).into();
    let mut fadt_bytes = Vec::new();
    fadt.finalize().to_aml_bytes(&mut fadt_bytes);
    let fadt_addr = place(&fadt_bytes)?;

    let madt_addr = place(&madt(vcpus)?)?;

    let mut xsdt = XSDT::new(OEM_ID, *b"BRBXXSDT", OEM_REVISION);
    xsdt.add_entry(fadt_addr);
    xsdt.add_entry(madt_addr);
    let mut xsdt_bytes = Vec::new();
    xsdt.to_aml_bytes(&mut xsdt_bytes);
    let xsdt_addr = place(&xsdt_bytes)?;

    let mut rsdp = Vec::new();
    Rsdp::new(OEM_ID, xsdt_addr).to_aml_bytes(&mut rsdp);
    mem.write_slice(&rsdp, GuestAddress(RSDP_ADDR)).map_err(|e| Error::Write { what: "RSDP", error: e })?;

    Ok(AcpiTables { rsdp: RSDP_ADDR, xsdt: xsdt_addr, fadt: fadt_addr, madt: madt_addr, dsdt: dsdt_addr })
}

fn check_vcpus(vcpus: u8) -> Result<()> {
    if vcpus == 0 || vcpus > MAX_VCPUS {
        return Err(Error::Vcpus { given: vcpus, max: MAX_VCPUS });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;

    fn read_table(mem: &GuestMemoryMmap, at: u64) -> Vec<u8> {
        let mut header = [0u8; 8];
        mem.read_slice(&mut header, GuestAddress(at)).unwrap();
        let len = u32::from_le_bytes(header[4..8].try_into().unwrap()) as usize;
        let mut table = vec![0u8; len];
        mem.read_slice(&mut table, GuestAddress(at)).unwrap();
        table
    }

    fn sum(bytes: &[u8]) -> u8 {
        bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b))
    }

    fn slots(n: u32) -> Vec<MmioDevice> {
        (0..n)
            .map(|i| {
                let (addr, irq) = crate::layout::virtio_mmio_slot(i).unwrap();
                MmioDevice { addr: addr.0, len: crate::layout::VIRTIO_MMIO_SIZE, irq }
            })
            .collect()
    }

    fn written(vcpus: u8) -> (GuestMemoryMmap, AcpiTables) {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let t = write_acpi_tables(&mem, vcpus, &slots(VIRTIO_MMIO_MAX)).unwrap();
        (mem, t)
    }

    #[test]
    fn every_table_checksums_to_zero_and_links_to_the_next() {
        let (mem, t) = written(4);
        let mut rsdp = [0u8; 36];
        mem.read_slice(&mut rsdp, GuestAddress(t.rsdp)).unwrap();
        assert_eq!(&rsdp[..8], b"RSD PTR ");
        assert_eq!(sum(&rsdp[..20]), 0, "ACPI 1.0 checksum");
        assert_eq!(sum(&rsdp), 0, "extended checksum");
        assert_eq!(u64::from_le_bytes(rsdp[24..32].try_into().unwrap()), t.xsdt);

        let xsdt = read_table(&mem, t.xsdt);
        assert_eq!(&xsdt[..4], b"XSDT");
        assert_eq!(sum(&xsdt), 0);
        let entries: Vec<u64> =
            xsdt[36..].chunks(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(entries, vec![t.fadt, t.madt]);

        let fadt = read_table(&mem, t.fadt);
        assert_eq!((&fadt[..4], sum(&fadt)), (&b"FACP"[..], 0));
        assert_eq!(u64::from_le_bytes(fadt[140..148].try_into().unwrap()), t.dsdt, "X_DSDT");
        let flags = u32::from_le_bytes(fadt[112..116].try_into().unwrap());
        assert_ne!(flags & (1 << 20), 0, "hardware-reduced");

        let dsdt = read_table(&mem, t.dsdt);
        assert_eq!((&dsdt[..4], sum(&dsdt)), (&b"DSDT"[..], 0));
        let madt = read_table(&mem, t.madt);
        assert_eq!((&madt[..4], sum(&madt)), (&b"APIC"[..], 0));
    }

    #[test]
    fn madt_lists_each_vcpu_the_ioapic_and_the_timer_override() {
        let table = madt(3).unwrap();
        assert_eq!(u32::from_le_bytes(table[36..40].try_into().unwrap()), LAPIC_ADDR as u32);
        let mut at = 44;
        let mut seen = Vec::new();
        while at < table.len() {
            let (kind, len) = (table[at], table[at + 1] as usize);
            seen.push((kind, table[at + 2..at + len].to_vec()));
            at += len;
        }
        assert_eq!(at, table.len(), "entries fill the table exactly");
        let lapics: Vec<_> = seen.iter().filter(|(k, _)| *k == 0).map(|(_, b)| (b[0], b[1], b[2])).collect();
        assert_eq!(lapics, vec![(0, 0, 1), (1, 1, 1), (2, 2, 1)], "uid, APIC id, enabled");
        let ioapic = &seen.iter().find(|(k, _)| *k == 1).unwrap().1;
        assert_eq!(u32::from_le_bytes(ioapic[2..6].try_into().unwrap()), IOAPIC_ADDR as u32);
        let iso = &seen.iter().find(|(k, _)| *k == 2).unwrap().1;
        assert_eq!((iso[0], iso[1], u32::from_le_bytes(iso[2..6].try_into().unwrap())), (0, 0, 2));
        assert!(madt(0).is_err());
        assert!(madt(255).is_err());
    }

    #[test]
    fn dsdt_carries_the_vmgenid_device_and_its_address() {
        let aml = dsdt_aml(&[]).unwrap();
        let has = |needle: &[u8]| aml.windows(needle.len()).any(|w| w == needle);
        assert!(has(b"VGEN"));
        assert!(has(b"VM_GEN_COUNTER\0"));
        assert!(has(b"VMGENCTR\0"));
        assert!(has(b"ADDR"));
        // DWordPrefix (0x0C) then the page's low 32 bits.
        let mut low = vec![0x0c];
        low.extend_from_slice(&(VMGENID_ADDR as u32).to_le_bytes());
        assert!(has(&low), "ADDR's low half");
        assert!(has(b"GED_") && has(b"ACPI0013\0") && has(b"_EVT"), "the generic event device");
        // Extended IRQ descriptor: consumer, edge, active high, one interrupt: VMGENID_IRQ.
        let mut irq = vec![0x89, 6, 0, 0x03, 1];
        irq.extend_from_slice(&VMGENID_IRQ.to_le_bytes());
        assert!(has(&irq), "the GED's interrupt");
        // Notify(\_SB.VGEN, 0x80): NotifyOp, root, dual name, then the value.
        assert!(has(b"\x86\\\x2e_SB_VGEN"), "the notification of VGEN");
    }

    #[test]
    fn dsdt_describes_each_virtio_mmio_slot_with_its_registers_and_interrupt() {
        let devices = slots(3);
        let aml = dsdt_aml(&devices).unwrap();
        let has = |needle: &[u8]| aml.windows(needle.len()).any(|w| w == needle);
        assert_eq!(aml.windows(9).filter(|w| w == b"LNRO0005\0").count(), 3, "one _HID per device");
        for (i, d) in devices.iter().enumerate() {
            assert!(has(format!("VR{i:02X}").as_bytes()), "device VR{i:02X}");
            // Memory32Fixed: tag 0x86, length 9, read-write, then base and length.
            let mut regs = vec![0x86, 9, 0, 1];
            regs.extend_from_slice(&(d.addr as u32).to_le_bytes());
            regs.extend_from_slice(&(d.len as u32).to_le_bytes());
            assert!(has(&regs), "device {i}'s registers");
            // Extended IRQ: consumer, edge, active high, exclusive, one interrupt: its pin.
            let mut irq = vec![0x89, 6, 0, 0x03, 1];
            irq.extend_from_slice(&d.irq.to_le_bytes());
            assert!(has(&irq), "device {i}'s interrupt");
        }
        assert_eq!(devices.iter().map(|d| d.irq).collect::<Vec<_>>(), vec![5, 6, 7]);
        assert!(!has(b"VR03"), "no device past the ones given");
        // The whole table is valid AML: the scope's length covers every device.
        let (mem, t) = {
            let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
            let t = write_acpi_tables(&mem, 1, &devices).unwrap();
            (mem, t)
        };
        let dsdt = read_table(&mem, t.dsdt);
        assert_eq!(sum(&dsdt), 0);
        assert_eq!(&dsdt[36..], &aml[..], "the DSDT carries the AML as built");
    }

    #[test]
    fn dsdt_describes_com1_with_its_ports_and_interrupt() {
        let aml = dsdt_aml(&[]).unwrap();
        let has = |needle: &[u8]| aml.windows(needle.len()).any(|w| w == needle);
        assert!(has(b"COM1"));
        // EISAID("PNP0501") as a DWord: 0x0105d041.
        assert!(has(&[0x0c, 0x41, 0xd0, 0x05, 0x01]), "_HID PNP0501");
        // IO descriptor: tag 0x47, 16-bit decode, min and max 0x3f8, alignment 1, 8 ports.
        assert!(has(&[0x47, 1, 0xf8, 0x03, 0xf8, 0x03, 1, 8]), "COM1's ports");
        let mut irq = vec![0x89, 6, 0, 0x03, 1];
        irq.extend_from_slice(&SERIAL_IRQ.to_le_bytes());
        assert!(has(&irq), "COM1's interrupt");
    }

    #[test]
    fn devices_past_the_slots_or_above_4g_are_refused() {
        let mut too_many = slots(VIRTIO_MMIO_MAX);
        too_many.push(too_many[0]);
        assert!(matches!(dsdt_aml(&too_many), Err(Error::TooManyDevices { .. })));
        let high = MmioDevice { addr: 1 << 32, len: 0x1000, irq: 5 };
        match dsdt_aml(&[high]) {
            Err(e @ Error::DeviceAbove4G { .. }) => assert!(e.to_string().contains("0x100000000"), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn tables_stay_inside_their_window_even_at_the_most_vcpus() {
        let (_, t) = written(MAX_VCPUS);
        assert!(t.xsdt < ACPI_TABLES_END);
        assert!(t.dsdt >= ACPI_TABLES_ADDR);
    }
}
