//! One vCPU of a Linux guest: its boot setup and its run loop.

use super::devices::lock;
use super::end::RunEnd;
use super::error::{kvm, LinuxError, LinuxResult};
use super::stop::Hold;
use crate::hypervisor::Hypervisor;
use crate::seccomp::{self, ThreadKind};
use crate::vstate::PauseHandle;
use branchbox_arch::cpu;
use branchbox_devices::{Action, Bus};
use kvm_bindings::{Msrs, KVM_SYSTEM_EVENT_RESET, KVM_SYSTEM_EVENT_SHUTDOWN};
use kvm_ioctls::{VcpuExit, VcpuFd};
use std::sync::Mutex;

/// `KVM_INTERNAL_ERROR_EMULATION`: the instruction emulator gave up.
const INTERNAL_ERROR_EMULATION: u32 = 1;
/// `KVM_INTERNAL_ERROR_EMULATION_FLAG_INSTRUCTION_BYTES`: the exit carries the instruction.
const EMULATION_FLAG_INSN_BYTES: u64 = 1;

/// Sets vCPU `id` of `count` up for a Linux boot: CPUID, boot MSRs, FPU, LAPIC lines, and,
/// for the boot vCPU (`entry` given), long mode at the kernel's entry point.
pub(super) fn configure(
    fd: &VcpuFd,
    hv: &Hypervisor,
    id: u8,
    count: u8,
    entry: Option<u64>,
) -> LinuxResult<()> {
    let mut cpuid = hv.supported_cpuid().clone();
    cpu::set_vcpu_cpuid(&mut cpuid, id, count);
    fd.set_cpuid2(&cpuid).map_err(kvm("KVM_SET_CPUID2"))?;

    // Only MSRs this host lets a vCPU have: KVM stops at the first one it refuses.
    let supported = hv.msr_indices();
    let wanted: Vec<_> = cpu::boot_msrs().into_iter().filter(|m| supported.contains(&m.index)).collect();
    let msrs = Msrs::from_entries(&wanted)
        .map_err(|e| LinuxError::Config(format!("cannot build the boot MSR list: {e:?}")))?;
    let set = fd.set_msrs(&msrs).map_err(kvm("KVM_SET_MSRS"))?;
    if set != wanted.len() {
        return Err(LinuxError::Config(format!(
            "KVM took {set} of {} boot MSRs (stopped at {:#x})",
            wanted.len(),
            wanted.get(set).map_or(0, |m| m.index)
        )));
    }

    fd.set_fpu(&cpu::boot_fpu()).map_err(kvm("KVM_SET_FPU"))?;
    let mut lapic = fd.get_lapic().map_err(kvm("KVM_GET_LAPIC"))?;
    cpu::set_lapic_lints(&mut lapic);
    fd.set_lapic(&lapic).map_err(kvm("KVM_SET_LAPIC"))?;

    if let Some(entry) = entry {
        fd.set_regs(&cpu::boot_regs(entry)).map_err(kvm("KVM_SET_REGS"))?;
        let mut sregs = fd.get_sregs().map_err(kvm("KVM_GET_SREGS"))?;
        cpu::set_boot_sregs(&mut sregs);
        fd.set_sregs(&sregs).map_err(kvm("KVM_SET_SREGS"))?;
    }
    Ok(())
}

/// Runs vCPU `id` until the guest resets, shuts down or fails, or a stop is requested.
/// Every guest action maps to a [`RunEnd`]; only a failing KVM call is an error. With
/// The thread is limited to the system calls of `confine` once it is set up.
pub(super) fn run(
    id: u8,
    slot: &Mutex<VcpuFd>,
    pause: &PauseHandle,
    hold: &Hold,
    mmio: &Bus,
    pio: &Bus,
    confine: ThreadKind,
) -> LinuxResult<RunEnd> {
    // The vCPU is this thread's while it runs; a parked vCPU lets go of it, so the VMM can
    // save or load its state while the guest is paused.
    let mut fd = lock(slot);
    let run_ptr: *mut kvm_bindings::kvm_run = fd.get_kvm_run();
    // Arming installs the kick signal's handler, a call the vCPU filter does not allow.
    let _armed = pause.arm(run_ptr);
    seccomp::apply(confine)?;
    loop {
        // A kick parks the vCPU while the guest is held (a pause) and ends the run when
        // it is a stop.
        if pause.take_request() {
            drop(fd);
            let back = hold.park();
            fd = lock(slot);
            if !back {
                return Ok(RunEnd::Stopped);
            }
        }
        let action = match fd.run() {
            Ok(VcpuExit::IoOut(port, data)) => pio.write(u64::from(port), data),
            Ok(VcpuExit::IoIn(port, data)) => pio.read(u64::from(port), data),
            Ok(VcpuExit::MmioWrite(addr, data)) => mmio.write(addr, data),
            Ok(VcpuExit::MmioRead(addr, data)) => mmio.read(addr, data),
            Ok(VcpuExit::Intr) => Action::Continue,
            Ok(VcpuExit::Hlt) => return Ok(RunEnd::Halted { vcpu: id }),
            Ok(VcpuExit::Shutdown) => return Ok(RunEnd::TripleFault { vcpu: id }),
            Ok(VcpuExit::SystemEvent(kind, _)) if kind == KVM_SYSTEM_EVENT_RESET => {
                return Ok(RunEnd::Reset { vcpu: id })
            }
            Ok(VcpuExit::SystemEvent(kind, _)) if kind == KVM_SYSTEM_EVENT_SHUTDOWN => {
                return Ok(RunEnd::PowerOff { vcpu: id })
            }
            Ok(VcpuExit::InternalError) => return Ok(internal_error(id, &mut fd)),
            Ok(VcpuExit::FailEntry(reason, _)) => return Ok(RunEnd::EntryFailure { vcpu: id, reason }),
            Ok(other) => return Ok(RunEnd::UnexpectedExit { vcpu: id, exit: format!("{other:?}") }),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                fd.set_kvm_immediate_exit(0);
                Action::Continue
            }
            Err(e) => return Err(kvm("KVM_RUN")(e)),
        };
        match action {
            Action::Reset => return Ok(RunEnd::Reset { vcpu: id }),
            Action::Continue => {}
            // A device with something for the caller (or a kind this loop does not know)
            // ends the run; the caller decides.
            _ => return Ok(RunEnd::Stopped),
        }
    }
}

/// Reads what KVM reported with an internal error: the suberror, and for an emulation
/// failure the instruction bytes, plus the guest's instruction pointer.
fn internal_error(id: u8, fd: &mut VcpuFd) -> RunEnd {
    let run = fd.get_kvm_run();
    // SAFETY: after KVM_EXIT_INTERNAL_ERROR the union holds `internal` / `emulation_failure`,
    // plain integers that any bit pattern makes valid.
    let (suberror, flags, insn) = unsafe {
        let ef = run.__bindgen_anon_1.emulation_failure;
        let bytes = ef.__bindgen_anon_1.__bindgen_anon_1;
        (ef.suberror, ef.flags, bytes)
    };
    let insn = if suberror == INTERNAL_ERROR_EMULATION && flags & EMULATION_FLAG_INSN_BYTES != 0 {
        insn.insn_bytes[..usize::from(insn.insn_size).min(insn.insn_bytes.len())].to_vec()
    } else {
        Vec::new()
    };
    let rip = fd.get_regs().map(|r| r.rip).unwrap_or(0);
    RunEnd::InternalError { vcpu: id, suberror, rip, insn }
}
