//! KVM state wrappers: a vCPU with its run loop and saved state, and the VM-wide state.

mod kick;
mod vcpu;
mod vm;

pub use kick::PauseHandle;
pub use vcpu::{restore_vcpu, save_vcpu, RunOutcome, Vcpu, VcpuState};
pub use vm::{restore_vm, save_vm, IrqchipState, VmCore, VmState};
