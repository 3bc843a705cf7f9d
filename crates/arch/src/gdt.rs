//! The boot GDT, in Linux's own layout, and the segment registers that match it.
//!
//! Linux's `startup_64` expects `__KERNEL_CS` = 0x10 and `__KERNEL_DS` = 0x18 (GDT entries 2
//! and 3; entry 1 is the 32-bit kernel code segment). Using the same selectors means the
//! kernel's first far return and segment reloads find what they expect.

use crate::layout::{GDT_ADDR, IDT_ADDR};
use crate::{Error, Result};
use kvm_bindings::kvm_segment;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

/// One segment descriptor's fields, before encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    /// Access byte: present, privilege level, system/code/data, type.
    pub access: u8,
    /// Flags nibble: granularity (8), 32-bit default size (4), 64-bit code (2), available (1).
    pub flags: u8,
    /// Segment base.
    pub base: u32,
    /// 20-bit limit, in 4 KiB units when granularity is set.
    pub limit: u32,
}

impl Descriptor {
    const fn flat(access: u8, flags: u8) -> Descriptor {
        Descriptor { access, flags, base: 0, limit: 0xf_ffff }
    }

    /// The 8-byte descriptor as the CPU reads it from the GDT.
    pub fn encode(&self) -> u64 {
        let base = u64::from(self.base);
        let limit = u64::from(self.limit);
        (limit & 0xffff)
            | (base & 0xff_ffff) << 16
            | u64::from(self.access) << 40
            | ((limit >> 16) & 0xf) << 48
            | u64::from(self.flags & 0xf) << 52
            | ((base >> 24) & 0xff) << 56
    }

    /// The same segment as KVM's register form, loaded with `selector`.
    pub fn segment(&self, selector: u16) -> kvm_segment {
        let granular = self.flags & 0x8 != 0;
        let present = self.access & 0x80 != 0;
        kvm_segment {
            base: u64::from(self.base),
            limit: if granular { (self.limit << 12) | 0xfff } else { self.limit },
            selector,
            type_: self.access & 0xf,
            present: u8::from(present),
            dpl: (self.access >> 5) & 0x3,
            db: (self.flags >> 2) & 0x1,
            s: (self.access >> 4) & 0x1,
            l: (self.flags >> 1) & 0x1,
            g: u8::from(granular),
            avl: self.flags & 0x1,
            unusable: u8::from(!present),
            padding: 0,
        }
    }
}

/// The boot GDT: null, 32-bit code, 64-bit kernel code (0x10), kernel data (0x18), TSS (0x20).
pub const GDT: [Descriptor; 5] = [
    Descriptor { access: 0, flags: 0, base: 0, limit: 0 },
    Descriptor::flat(0x9b, 0xc),
    Descriptor::flat(0x9b, 0xa),
    Descriptor::flat(0x93, 0xc),
    Descriptor::flat(0x8b, 0x8),
];

/// Selector of the 64-bit kernel code segment (`__KERNEL_CS`).
pub const KERNEL_CS: u16 = 0x10;
/// Selector of the kernel data segment (`__KERNEL_DS`).
pub const KERNEL_DS: u16 = 0x18;
/// Selector of the boot TSS.
pub const BOOT_TSS: u16 = 0x20;

/// The segment registers a vCPU entering the kernel in 64-bit mode starts with.
#[derive(Debug, Clone, Copy)]
pub struct BootSegments {
    /// Code segment (`KERNEL_CS`).
    pub code: kvm_segment,
    /// Data segment for DS, ES, FS, GS and SS (`KERNEL_DS`).
    pub data: kvm_segment,
    /// Task register.
    pub tss: kvm_segment,
}

/// The segments matching [`GDT`].
pub fn boot_segments() -> BootSegments {
    BootSegments {
        code: GDT[usize::from(KERNEL_CS / 8)].segment(KERNEL_CS),
        data: GDT[usize::from(KERNEL_DS / 8)].segment(KERNEL_DS),
        tss: GDT[usize::from(BOOT_TSS / 8)].segment(BOOT_TSS),
    }
}

/// Bytes of the GDT minus one, as the GDTR's limit wants it.
pub const GDT_LIMIT: u16 = (GDT.len() * 8 - 1) as u16;
/// The empty IDT's limit.
pub const IDT_LIMIT: u16 = 7;

/// Writes the GDT at [`GDT_ADDR`] and an empty IDT at [`IDT_ADDR`].
pub fn write_gdt<M: GuestMemoryBackend>(mem: &M) -> Result<()> {
    for (i, desc) in GDT.iter().enumerate() {
        let addr = GuestAddress(GDT_ADDR + 8 * i as u64);
        mem.write_obj(desc.encode(), addr).map_err(|e| Error::Write { what: "GDT", error: e })?;
    }
    mem.write_obj(0u64, GuestAddress(IDT_ADDR)).map_err(|e| Error::Write { what: "IDT", error: e })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_encode_like_the_architecture_manual() {
        // Well-known flat descriptors: 64-bit ring-0 code, ring-0 data, busy 64-bit TSS.
        assert_eq!(GDT[2].encode(), 0x00af_9b00_0000_ffff);
        assert_eq!(GDT[3].encode(), 0x00cf_9300_0000_ffff);
        assert_eq!(GDT[1].encode(), 0x00cf_9b00_0000_ffff);
        assert_eq!(GDT[4].encode(), 0x008f_8b00_0000_ffff);
        let odd = Descriptor { access: 0x93, flags: 0x4, base: 0x1234_5678, limit: 0xa_bcde };
        assert_eq!(odd.encode(), 0x124a_9334_5678_bcde);
    }

    #[test]
    fn segments_follow_linux_selectors() {
        let s = boot_segments();
        assert_eq!((s.code.selector, s.code.l, s.code.db, s.code.type_), (0x10, 1, 0, 0xb));
        assert_eq!((s.data.selector, s.data.l, s.data.db, s.data.type_), (0x18, 0, 1, 0x3));
        assert_eq!(s.code.limit, 0xffff_ffff);
        assert_eq!((s.code.present, s.code.s, s.code.g, s.code.unusable), (1, 1, 1, 0));
        assert_eq!((s.tss.selector, s.tss.s, s.tss.type_), (0x20, 0, 0xb));
    }
}
