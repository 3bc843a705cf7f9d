//! The synthetic test guest: a few hundred bytes of x86-64 code that runs entirely in guest
//! user mode (CPL 3), so it runs at native speed even where `/dev/kvm` is PVM (HOST.md).
//!
//! The host puts the vCPU straight into 64-bit long mode at CPL 3: identity-mapped 2 MiB
//! pages with the U bit over the low 4 GiB, a GDT with 64-bit user code/data segments, a
//! TSS, no IDT (any exception triple-faults, which the run loop reports). The guest loops:
//! read a command from the mailbox page, execute it, write the answer to the mailbox, count
//! the answer in r15, and ring the doorbell (a user-mode write to an unbacked guest-physical
//! page gives `KVM_EXIT_MMIO`).
//!
//! Commands (mailbox words: 0 cmd, 1 base, 2 count, 3 stride or mask, 4 seed; answer words:
//! 5 status, 6 a, 7 b, 8 sequence number):
//! - 0 ping: answer (0, 0, 0).
//! - 1 fill: `count` qwords at `base`, `base+stride`, ... get `seed ^ address`.
//! - 2 check: count the qwords of such a range that differ from `seed ^ address`; answer
//!   (mismatches, first bad address, its value).
//! - 3 count: zero `mask+1` qwords at `base`, then `count` times: `x = x*A + C` (64-bit LCG
//!   from `seed`), add `x` to qword `i & mask` and to a register sum. At the end the guest sums
//!   the region itself and answers (0 if the memory sum equals the register sum else 1, x, i).
//!   A VM paused and restored mid-loop must still answer (0, lcg(seed, count), count).

mod code;

use crate::error::{Error, Result};
use crate::synthetic::devices::doorbell::DOORBELL_BASE;
use crate::synthetic::vcpu::RunOutcome;
use crate::synthetic::vm::Vm;
use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};
use serde::{Deserialize, Serialize};

/// Guest-physical address of the PML4.
const PML4: u64 = 0x1000;
/// Guest-physical address of the PDPT.
const PDPT: u64 = 0x2000;
/// Guest-physical address of the first of four page directories (4 GiB of 2 MiB pages).
const PD0: u64 = 0x3000;
/// Guest-physical address of the GDT.
const GDT: u64 = 0x7000;
/// Guest-physical address of the 64-bit TSS.
const TSS: u64 = 0x7800;
/// Guest-physical address of the mailbox page.
pub const MAILBOX: u64 = 0x8000;
/// Guest-physical address of the code.
pub const CODE: u64 = 0x10000;
/// First guest-physical address free for test data (everything below is the guest itself).
pub const DATA_BASE: u64 = 0x20_0000;
/// Smallest guest RAM the test guest fits in (code, tables and one data page).
pub const MIN_RAM: u64 = DATA_BASE + 0x20_0000;

/// Page-table entry bits: present, writable, user, accessed, dirty, 2 MiB page.
const P: u64 = 1;
const RW: u64 = 1 << 1;
const US: u64 = 1 << 2;
const A: u64 = 1 << 5;
const D: u64 = 1 << 6;
const PS: u64 = 1 << 7;

/// Selectors: user data (GDT index 5) and user code (index 6), both with RPL 3; TSS index 7.
const USER_DS: u16 = (5 << 3) | 3;
const USER_CS: u16 = (6 << 3) | 3;
const TSS_SEL: u16 = 7 << 3;

/// LCG multiplier and increment the `count` command uses.
pub const LCG_A: u64 = 6364136223846793005;
/// LCG increment.
pub const LCG_C: u64 = 1442695040888963407;

/// The value of the guest's LCG after `n` steps from `seed`, computed on the host in
/// O(log n) by squaring the affine step `x -> A*x + C`.
pub fn lcg(seed: u64, mut n: u64) -> u64 {
    let (mut mul, mut add) = (LCG_A, LCG_C);
    let mut x = seed;
    while n > 0 {
        if n & 1 == 1 {
            x = x.wrapping_mul(mul).wrapping_add(add);
        }
        add = add.wrapping_mul(mul).wrapping_add(add);
        mul = mul.wrapping_mul(mul);
        n >>= 1;
    }
    x
}

/// A command for the test guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Command {
    /// Answer at once.
    Ping,
    /// Write `seed ^ addr` to `count` qwords from `base`, `stride` bytes apart.
    Fill {
        /// First address.
        base: u64,
        /// Number of qwords.
        count: u64,
        /// Distance between qwords in bytes.
        stride: u64,
        /// Pattern seed.
        seed: u64,
    },
    /// Count qwords of such a range that differ from `seed ^ addr`.
    Check {
        /// First address.
        base: u64,
        /// Number of qwords.
        count: u64,
        /// Distance between qwords in bytes.
        stride: u64,
        /// Pattern seed.
        seed: u64,
    },
    /// Run the LCG `iterations` times over `mask + 1` qwords at `base` and self-check.
    Count {
        /// First address of the region.
        base: u64,
        /// LCG steps.
        iterations: u64,
        /// Region size in qwords minus one (a power of two minus one).
        mask: u64,
        /// LCG seed.
        seed: u64,
    },
}

/// The guest's answer to one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Answer {
    /// 0 for success; for `Check` the number of mismatches.
    pub status: u64,
    /// First extra word (first bad address; final LCG value).
    pub a: u64,
    /// Second extra word (bad value; iterations done).
    pub b: u64,
    /// How many answers this guest has given since boot (kept in a register: it survives a
    /// snapshot only if registers do).
    pub seq: u64,
}

/// Writes the guest (page tables, GDT, TSS, code) into RAM and points vCPU 0 at it.
pub fn install(vm: &mut Vm) -> Result<()> {
    let size = vm.ram().size() as u64;
    if !(MIN_RAM..=DOORBELL_BASE).contains(&size) {
        return Err(Error::Config(format!(
            "the test guest needs between {MIN_RAM} and {DOORBELL_BASE} bytes of RAM, got {size}"
        )));
    }
    let ram = vm.ram();
    ram.write_u64(PML4, PDPT | P | RW | US | A)?;
    for i in 0..4u64 {
        ram.write_u64(PDPT + i * 8, (PD0 + i * 0x1000) | P | RW | US | A)?;
        let mut pd = vec![0u8; 4096];
        for (j, e) in pd.chunks_exact_mut(8).enumerate() {
            let phys = (i << 30) | ((j as u64) << 21);
            e.copy_from_slice(&(phys | P | RW | US | A | D | PS).to_le_bytes());
        }
        ram.write(PD0 + i * 0x1000, &pd)?;
    }
    // GDT: null, kernel code/data (unused, for completeness), user data, user code, TSS.
    let gdt: [u64; 9] = [
        0,
        0x00af_9a00_0000_ffff,
        0x00cf_9200_0000_ffff,
        0,
        0,
        0x00cf_f200_0000_ffff,
        0x00af_fa00_0000_ffff,
        tss_low(TSS, 0x67),
        TSS >> 32,
    ];
    for (i, d) in gdt.iter().enumerate() {
        ram.write_u64(GDT + i as u64 * 8, *d)?;
    }
    ram.write(CODE, code::GUEST)?;
    let vcpu = vm.vcpu(0)?;
    let sregs = vcpu.fd().get_sregs().map_err(crate::error::kvm("KVM_GET_SREGS"))?;
    vcpu.fd().set_sregs(&user_mode_sregs(sregs)).map_err(crate::error::kvm("KVM_SET_SREGS"))?;
    vcpu.fd().set_regs(&initial_regs()).map_err(crate::error::kvm("KVM_SET_REGS"))?;
    Ok(())
}

/// Low 8 bytes of a 64-bit available-TSS descriptor.
fn tss_low(base: u64, limit: u64) -> u64 {
    (limit & 0xffff)
        | ((base & 0xff_ffff) << 16)
        | (0x89 << 40)
        | (((limit >> 16) & 0xf) << 48)
        | (((base >> 24) & 0xff) << 56)
}

/// Registers at boot: at the code's first instruction, interrupts off.
pub fn initial_regs() -> kvm_regs {
    kvm_regs { rip: CODE, rflags: 0x2, ..Default::default() }
}

/// Control and segment registers for 64-bit long mode at CPL 3 over the guest's tables.
pub fn user_mode_sregs(mut s: kvm_sregs) -> kvm_sregs {
    let data = kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector: USER_DS,
        type_: 3,
        present: 1,
        dpl: 3,
        db: 1,
        s: 1,
        l: 0,
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    };
    s.cs = kvm_segment { selector: USER_CS, type_: 0xb, db: 0, l: 1, ..data };
    s.ds = data;
    s.es = data;
    s.fs = data;
    s.gs = data;
    s.ss = data;
    s.tr = kvm_segment {
        base: TSS,
        limit: 0x67,
        selector: TSS_SEL,
        type_: 0xb,
        present: 1,
        dpl: 0,
        db: 0,
        s: 0,
        l: 0,
        g: 0,
        avl: 0,
        unusable: 0,
        padding: 0,
    };
    s.gdt.base = GDT;
    s.gdt.limit = 9 * 8 - 1;
    s.idt.base = 0;
    s.idt.limit = 0;
    // PE, MP, ET, NE, WP, PG.
    s.cr0 = 0x8005_0033;
    s.cr3 = PML4;
    // PAE, OSFXSR, OSXMMEXCPT.
    s.cr4 = 0x620;
    // LME, LMA.
    s.efer = 0x500;
    s
}

/// Writes `cmd` into the guest's mailbox (the guest reads it when it next runs).
pub fn post(vm: &Vm, cmd: Command) -> Result<()> {
    let words: [u64; 5] = match cmd {
        Command::Ping => [0; 5],
        Command::Fill { base, count, stride, seed } => [1, base, count, stride, seed],
        Command::Check { base, count, stride, seed } => [2, base, count, stride, seed],
        Command::Count { base, iterations, mask, seed } => [3, base, iterations, mask, seed],
    };
    for (i, w) in words.iter().enumerate() {
        vm.ram().write_u64(MAILBOX + i as u64 * 8, *w)?;
    }
    Ok(())
}

/// Reads the guest's last answer from the mailbox.
pub fn answer(vm: &Vm) -> Result<Answer> {
    let w = |i: u64| vm.ram().read_u64(MAILBOX + i * 8);
    Ok(Answer { status: w(5)?, a: w(6)?, b: w(7)?, seq: w(8)? })
}

/// Runs the guest until it rings the doorbell and returns its answer.
pub fn wait_answer(vm: &mut Vm) -> Result<Answer> {
    match vm.run()? {
        RunOutcome::Device => answer(vm),
        RunOutcome::Paused => Err(Error::Protocol("the guest was paused before it answered".into())),
    }
}

/// Posts `cmd`, runs the guest until it answers, and returns the answer.
pub fn call(vm: &mut Vm, cmd: Command) -> Result<Answer> {
    post(vm, cmd)?;
    wait_answer(vm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lcg_jump_ahead_matches_stepping() {
        for n in [0u64, 1, 2, 3, 7, 100, 1023] {
            let stepped = (0..n).fold(5u64, |x, _| x.wrapping_mul(LCG_A).wrapping_add(LCG_C));
            assert_eq!(lcg(5, n), stepped, "n = {n}");
        }
    }
}
