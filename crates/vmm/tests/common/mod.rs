//! Helpers shared by the integration tests.

use branchbox_vmm::testguest;
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
