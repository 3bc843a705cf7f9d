//! Helpers shared by the integration tests (each test file uses some of them).

#![allow(dead_code)]

use branchbox_vmm::synthetic::testguest::{self, Command, DATA_BASE};
use branchbox_vmm::{Hypervisor, Vm, VmConfig};
use std::sync::Arc;

/// Opens /dev/kvm, or prints one `skipped:` line and returns `None`.
pub fn kvm_or_skip() -> Option<Arc<Hypervisor>> {
    match Hypervisor::open() {
        Ok(hv) => Some(hv),
        Err(e) => {
            println!("skipped: {e}");
            None
        }
    }
}

/// A small VM shape for tests: 8 MiB of RAM, one vCPU, no irqchip.
pub fn small() -> VmConfig {
    VmConfig { mem_size: 8 << 20, vcpus: 1, irqchip: false }
}

/// A fresh VM running the test guest, which has answered one ping.
pub fn booted(hv: &Arc<Hypervisor>, config: VmConfig) -> Vm {
    let mut vm = Vm::boot(hv, config).expect("boot VM");
    testguest::install(&mut vm).expect("install test guest");
    let a = testguest::call(&mut vm, testguest::Command::Ping).expect("first ping");
    assert_eq!(a.seq, 1);
    vm
}

/// Guest page size.
pub const PAGE: u64 = 4096;

/// The guest writes `pages` pages of its data area from page `page`, one qword each, from
/// `seed`.
pub fn fill(page: u64, pages: u64, seed: u64) -> Command {
    Command::Fill { base: DATA_BASE + page * PAGE, count: pages, stride: PAGE, seed }
}

/// The guest checks what [`fill`] with the same arguments wrote.
pub fn check(page: u64, pages: u64, seed: u64) -> Command {
    Command::Check { base: DATA_BASE + page * PAGE, count: pages, stride: PAGE, seed }
}

/// Runs `cmd` in the guest, asserts it found nothing wrong, returns its answer counter.
pub fn ok(vm: &mut Vm, cmd: Command) -> u64 {
    let a = testguest::call(vm, cmd).unwrap();
    assert_eq!(a.status, 0, "{cmd:?} answered {a:?}");
    a.seq
}
