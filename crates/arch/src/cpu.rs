//! The register state a vCPU enters the kernel with, as plain KVM structures.
//!
//! The boot processor starts at `startup_64` in long mode: paging on with the identity map,
//! the boot GDT's segments, `rsi` pointing at the zero page. Every vCPU gets the host's
//! supported CPUID with its own APIC id, a sane FPU, boot MSR values, and a local APIC
//! whose LINT0 is the 8259's ExtINT line and LINT1 the NMI line.

use crate::gdt::{boot_segments, GDT_LIMIT, IDT_LIMIT};
use crate::layout::{BOOT_STACK_TOP, GDT_ADDR, IDT_ADDR, PML4_ADDR, ZERO_PAGE_ADDR};
use kvm_bindings::{kvm_fpu, kvm_lapic_state, kvm_msr_entry, kvm_regs, kvm_sregs, CpuId};

const CR0_PE: u64 = 1;
const CR0_ET: u64 = 1 << 4;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;

/// The general registers of the boot vCPU entering the kernel at `entry`.
pub fn boot_regs(entry: u64) -> kvm_regs {
    kvm_regs {
        rip: entry,
        rsp: BOOT_STACK_TOP,
        rbp: BOOT_STACK_TOP,
        rsi: ZERO_PAGE_ADDR,
        // Bit 1 of RFLAGS is always set; interrupts stay off until the kernel wants them.
        rflags: 0x2,
        ..Default::default()
    }
}

/// Puts `sregs` (as read from a fresh vCPU) into long mode with the boot GDT and page tables.
pub fn set_boot_sregs(sregs: &mut kvm_sregs) {
    let seg = boot_segments();
    sregs.cs = seg.code;
    sregs.ds = seg.data;
    sregs.es = seg.data;
    sregs.fs = seg.data;
    sregs.gs = seg.data;
    sregs.ss = seg.data;
    sregs.tr = seg.tss;
    sregs.gdt.base = GDT_ADDR;
    sregs.gdt.limit = GDT_LIMIT;
    sregs.idt.base = IDT_ADDR;
    sregs.idt.limit = IDT_LIMIT;
    sregs.cr0 = CR0_PE | CR0_ET | CR0_PG;
    sregs.cr3 = PML4_ADDR;
    sregs.cr4 = CR4_PAE;
    sregs.efer = EFER_LME | EFER_LMA;
}

/// The FPU as after `fninit`, with SSE exceptions masked.
pub fn boot_fpu() -> kvm_fpu {
    kvm_fpu { fcw: 0x37f, mxcsr: 0x1f80, ..Default::default() }
}

/// MSRs set at boot: SYSENTER/SYSCALL targets cleared, TSC at zero, fast strings on.
pub fn boot_msrs() -> Vec<kvm_msr_entry> {
    const IA32_SYSENTER_CS: u32 = 0x174;
    const IA32_SYSENTER_ESP: u32 = 0x175;
    const IA32_SYSENTER_EIP: u32 = 0x176;
    const STAR: u32 = 0xc000_0081;
    const LSTAR: u32 = 0xc000_0082;
    const CSTAR: u32 = 0xc000_0083;
    const SYSCALL_MASK: u32 = 0xc000_0084;
    const KERNEL_GS_BASE: u32 = 0xc000_0102;
    const IA32_TSC: u32 = 0x10;
    const IA32_MISC_ENABLE: u32 = 0x1a0;
    const MISC_ENABLE_FAST_STRING: u64 = 1;
    let zero = [
        IA32_SYSENTER_CS,
        IA32_SYSENTER_ESP,
        IA32_SYSENTER_EIP,
        STAR,
        LSTAR,
        CSTAR,
        SYSCALL_MASK,
        KERNEL_GS_BASE,
        IA32_TSC,
    ];
    let mut msrs: Vec<kvm_msr_entry> =
        zero.iter().map(|&index| kvm_msr_entry { index, data: 0, ..Default::default() }).collect();
    msrs.push(kvm_msr_entry { index: IA32_MISC_ENABLE, data: MISC_ENABLE_FAST_STRING, ..Default::default() });
    msrs
}

/// Adapts the host's supported CPUID for vCPU `id` of `count`: its APIC id in leaves 1 and
/// 0xB, the logical processor count, and the hypervisor bit so the kernel looks for KVM's
/// leaves (0x4000_0000 onwards, kvmclock among them), which KVM already reports.
pub fn set_vcpu_cpuid(cpuid: &mut CpuId, id: u8, count: u8) {
    const HYPERVISOR: u32 = 1 << 31;
    const HTT: u32 = 1 << 28;
    for entry in cpuid.as_mut_slice() {
        match entry.function {
            1 => {
                entry.ebx = (entry.ebx & 0x0000_ffff) | (u32::from(id) << 24) | (u32::from(count) << 16);
                entry.ecx |= HYPERVISOR;
                if count > 1 {
                    entry.edx |= HTT;
                }
            }
            0xb => entry.edx = u32::from(id),
            _ => {}
        }
    }
}

/// LVT0 and LVT1 register offsets in the local APIC page.
const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
/// Delivery modes in bits 8-10 of an LVT entry.
const DELIVERY_EXTINT: u32 = 0b111 << 8;
const DELIVERY_NMI: u32 = 0b100 << 8;

/// Wires LINT0 to the 8259 (ExtINT) and LINT1 to NMI, as a PC's firmware does.
pub fn set_lapic_lints(lapic: &mut kvm_lapic_state) {
    for (offset, mode) in [(APIC_LVT0, DELIVERY_EXTINT), (APIC_LVT1, DELIVERY_NMI)] {
        let v = read_apic_reg(lapic, offset);
        write_apic_reg(lapic, offset, (v & !(0b111 << 8)) | mode);
    }
}

/// Reads a 32-bit local APIC register at `offset`.
pub fn read_apic_reg(lapic: &kvm_lapic_state, offset: usize) -> u32 {
    let b = &lapic.regs[offset..offset + 4];
    u32::from_le_bytes([b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8])
}

fn write_apic_reg(lapic: &mut kvm_lapic_state, offset: usize, value: u32) {
    for (slot, byte) in lapic.regs[offset..offset + 4].iter_mut().zip(value.to_le_bytes()) {
        *slot = byte as _;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_bindings::kvm_cpuid_entry2;

    #[test]
    fn long_mode_with_our_tables() {
        let mut s = kvm_sregs::default();
        set_boot_sregs(&mut s);
        assert_eq!(s.cr3, PML4_ADDR);
        assert_ne!(s.cr0 & CR0_PG, 0);
        assert_ne!(s.cr4 & CR4_PAE, 0);
        assert_eq!(s.efer & (EFER_LME | EFER_LMA), EFER_LME | EFER_LMA);
        assert_eq!((s.cs.selector, s.ss.selector, s.cs.l), (0x10, 0x18, 1));
        assert_eq!((s.gdt.base, s.gdt.limit), (GDT_ADDR, 39));
        let r = boot_regs(0x100_0000);
        assert_eq!((r.rip, r.rsi, r.rflags), (0x100_0000, ZERO_PAGE_ADDR, 2));
    }

    #[test]
    fn cpuid_names_each_vcpu() {
        let leaf1 = kvm_cpuid_entry2 { function: 1, ebx: 0xff00_0800, ..Default::default() };
        let leafb = kvm_cpuid_entry2 { function: 0xb, edx: 9, ..Default::default() };
        let mut cpuid = CpuId::from_entries(&[leaf1, leafb]).unwrap();
        set_vcpu_cpuid(&mut cpuid, 3, 4);
        let e = cpuid.as_slice();
        assert_eq!(e[0].ebx, 0x0304_0800, "APIC id 3, 4 logical processors, CLFLUSH size kept");
        assert_ne!(e[0].ecx & (1 << 31), 0, "hypervisor bit");
        assert_ne!(e[0].edx & (1 << 28), 0);
        assert_eq!(e[1].edx, 3);
    }

    #[test]
    fn lints_are_extint_and_nmi() {
        let mut lapic = kvm_lapic_state::default();
        write_apic_reg(&mut lapic, APIC_LVT0, 0x0001_0700);
        set_lapic_lints(&mut lapic);
        assert_eq!(read_apic_reg(&lapic, APIC_LVT0), 0x0001_0700, "mask bit kept, ExtINT");
        assert_eq!(read_apic_reg(&lapic, APIC_LVT1) & 0x700, 0x400);
    }
}
