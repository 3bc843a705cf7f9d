//! KVM state wrappers both guests' VMs use: a vCPU's saved state, the VM-wide state, and
//! pausing a vCPU that is inside `KVM_RUN`.

mod kick;
mod vcpu;
mod vm;

pub use kick::PauseHandle;
pub use vcpu::{restore_vcpu, save_vcpu, VcpuState};
pub use vm::{restore_vm, save_vm, IrqchipState, VmCore, VmState};
