//! The synthetic guest's vCPU: creation and the run loop that hands its exits to the buses.
//! Its state is saved and restored by `vstate` (`save_vcpu`, `restore_vcpu`), as a Linux
//! guest's is.

use crate::error::{kvm, Error, Result};
use crate::hypervisor::Hypervisor;
use crate::vstate::{restore_vcpu, save_vcpu, PauseHandle, VcpuState};
use branchbox_devices::{Action, Bus};
use branchbox_persist::{NoContext, Snapshottable};
use kvm_ioctls::{VcpuExit, VcpuFd, VmFd};
use std::sync::Arc;

/// Why [`Vcpu::run`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunOutcome {
    /// A device asked the run loop to stop (the doorbell rang) or for something the loop
    /// leaves to its caller.
    Device,
    /// [`PauseHandle::request_pause`] stopped the vCPU.
    Paused,
}

/// A KVM vCPU of one VM.
pub struct Vcpu {
    fd: VcpuFd,
    id: u8,
    irqchip: bool,
    hv: Arc<Hypervisor>,
    pause: PauseHandle,
}

impl Vcpu {
    /// Creates vCPU `id` of `vm`; `irqchip` says whether the VM has an in-kernel LAPIC.
    /// CPUID is left unset: a fresh VM sets the host's, a restore sets the saved one.
    pub fn create(hv: &Arc<Hypervisor>, vm: &VmFd, id: u8, irqchip: bool) -> Result<Vcpu> {
        let fd = vm.create_vcpu(u64::from(id)).map_err(kvm("KVM_CREATE_VCPU"))?;
        Ok(Vcpu { fd, id, irqchip, hv: Arc::clone(hv), pause: PauseHandle::default() })
    }

    /// The raw KVM vCPU.
    pub fn fd(&self) -> &VcpuFd {
        &self.fd
    }

    /// A handle that pauses this vCPU from another thread.
    pub fn pause_handle(&self) -> PauseHandle {
        self.pause.clone()
    }

    /// Runs the guest until a device stops it or a pause is requested.
    pub fn run(&mut self, mmio: &Bus, pio: &Bus) -> Result<RunOutcome> {
        let run_ptr: *mut kvm_bindings::kvm_run = self.fd.get_kvm_run();
        let pause = self.pause.clone();
        let _armed = pause.arm(run_ptr);
        loop {
            if pause.take_request() {
                return Ok(RunOutcome::Paused);
            }
            let action = match self.fd.run() {
                Ok(VcpuExit::MmioWrite(addr, data)) => mmio.write(addr, data),
                Ok(VcpuExit::MmioRead(addr, data)) => mmio.read(addr, data),
                Ok(VcpuExit::IoOut(port, data)) => pio.write(u64::from(port), data),
                Ok(VcpuExit::IoIn(port, data)) => pio.read(u64::from(port), data),
                Ok(VcpuExit::Intr) => Action::Continue,
                Ok(VcpuExit::Hlt) => return Err(Error::Guest("the vCPU halted".into())),
                Ok(VcpuExit::Shutdown) => {
                    return Err(Error::Guest(
                        "shutdown (triple fault: the guest took an exception it cannot handle)".into(),
                    ))
                }
                Ok(VcpuExit::InternalError) => {
                    return Err(Error::Guest("KVM internal error (instruction emulation failed)".into()))
                }
                Ok(VcpuExit::FailEntry(reason, cpu)) => {
                    return Err(Error::Guest(format!(
                        "VM entry failed (hardware reason {reason:#x}, cpu {cpu})"
                    )))
                }
                Ok(other) => return Err(Error::Guest(format!("unhandled exit {other:?}"))),
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    self.fd.set_kvm_immediate_exit(0);
                    Action::Continue
                }
                Err(e) => return Err(kvm("KVM_RUN")(e)),
            };
            // Any request but to continue (a stop, or one this loop does not know, such as a
            // reset) is the caller's to handle.
            if action != Action::Continue {
                return Ok(RunOutcome::Device);
            }
        }
    }
}

impl Snapshottable for Vcpu {
    type State = VcpuState;
    type SaveCtx = NoContext;
    type RestoreCtx = NoContext;
    type Error = Error;

    fn save(&mut self, _ctx: &mut NoContext) -> Result<VcpuState> {
        save_vcpu(&mut self.fd, &self.hv, self.id, self.irqchip)
    }

    fn restore(&mut self, s: &VcpuState, _ctx: &NoContext) -> Result<()> {
        restore_vcpu(&self.fd, &self.hv, self.id, self.irqchip, s)
    }
}
