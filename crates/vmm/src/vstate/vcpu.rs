//! One vCPU's complete x86_64 state, saved and restored: what both guests' vCPUs share (the
//! synthetic guest's `Vcpu` in `synthetic/vcpu.rs`, a Linux guest's in `linux/vcpu.rs`).

use crate::error::{kvm, Error, Result};
use crate::hypervisor::Hypervisor;
use kvm_bindings::{
    kvm_cpuid_entry2, kvm_debugregs, kvm_lapic_state, kvm_mp_state, kvm_msr_entry, kvm_regs, kvm_sregs,
    kvm_vcpu_events, kvm_xcrs, kvm_xsave, CpuId, Msrs, KVM_MAX_CPUID_ENTRIES, KVM_MAX_MSR_ENTRIES,
};
use kvm_ioctls::VcpuFd;
use serde::{Deserialize, Serialize};

/// Saved state of one x86_64 vCPU: everything KVM keeps for it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VcpuState {
    /// vCPU id (also its APIC id).
    pub id: u8,
    /// CPUID the vCPU was given.
    pub cpuid: Vec<kvm_cpuid_entry2>,
    /// Multiprocessing state (runnable, halted, ...).
    pub mp_state: kvm_mp_state,
    /// General-purpose registers, RIP, RFLAGS.
    pub regs: kvm_regs,
    /// Segment, control and descriptor-table registers, EFER, APIC base.
    pub sregs: kvm_sregs,
    /// The legacy 4 KiB XSAVE area (x87, SSE, AVX state), as 32-bit words.
    pub xsave: Vec<u32>,
    /// Extended control registers (XCR0).
    pub xcrs: kvm_xcrs,
    /// Debug registers.
    pub debugregs: kvm_debugregs,
    /// Local APIC registers, when the VM has an in-kernel irqchip.
    pub lapic: Option<kvm_lapic_state>,
    /// Every MSR KVM lists and lets us read, with its value.
    pub msrs: Vec<kvm_msr_entry>,
    /// Pending exceptions, interrupts, NMIs and interruptibility.
    pub events: kvm_vcpu_events,
}

fn msr_buffer(entries: &[kvm_msr_entry]) -> Result<Msrs> {
    Msrs::from_entries(entries).map_err(|e| Error::Config(format!("too many MSRs for one KVM call: {e:?}")))
}

/// Lets KVM finish an MMIO or PIO access the last exit left pending, without running guest
/// code, so the saved registers are those after the access.
fn complete_pending_io(fd: &mut VcpuFd) -> Result<()> {
    fd.set_kvm_immediate_exit(1);
    let result = fd.run().map(|_| ());
    fd.set_kvm_immediate_exit(0);
    match result {
        Err(e) if e.errno() == libc::EINTR => Ok(()),
        Err(e) => Err(kvm("KVM_RUN (complete pending I/O)")(e)),
        Ok(()) => Ok(()),
    }
}

fn get_msrs(fd: &VcpuFd, hv: &Hypervisor) -> Result<Vec<kvm_msr_entry>> {
    let indices = hv.msr_indices();
    let mut out = Vec::with_capacity(indices.len());
    for chunk in indices.chunks(KVM_MAX_MSR_ENTRIES) {
        let entries: Vec<kvm_msr_entry> =
            chunk.iter().map(|&index| kvm_msr_entry { index, ..Default::default() }).collect();
        let mut msrs = msr_buffer(&entries)?;
        let read = fd.get_msrs(&mut msrs).map_err(kvm("KVM_GET_MSRS"))?;
        if read != entries.len() {
            return Err(Error::Guest(format!(
                "KVM read only {read} of {} MSRs (stopped at {:#x})",
                entries.len(),
                entries.get(read).map_or(0, |e| e.index)
            )));
        }
        out.extend_from_slice(msrs.as_slice());
    }
    Ok(out)
}

/// Writes the saved MSRs back. KVM refuses some MSRs it lets us read when the VM lacks what
/// they configure (e.g. `MSR_KVM_ASYNC_PF_INT` without an in-kernel LAPIC); such an MSR is
/// skipped only when this vCPU already holds the saved value, so no state is lost.
fn set_msrs(fd: &VcpuFd, saved: &[kvm_msr_entry]) -> Result<()> {
    let mut rest = saved;
    while !rest.is_empty() {
        let chunk = &rest[..rest.len().min(KVM_MAX_MSR_ENTRIES)];
        let set = fd.set_msrs(&msr_buffer(chunk)?).map_err(kvm("KVM_SET_MSRS"))?;
        match chunk.get(set) {
            None => rest = &rest[set..],
            Some(refused) => {
                let mut probe = msr_buffer(&[kvm_msr_entry { index: refused.index, ..Default::default() }])?;
                let read = fd.get_msrs(&mut probe).map_err(kvm("KVM_GET_MSRS"))?;
                let current = probe.as_slice().first().map(|e| e.data);
                if read != 1 || current != Some(refused.data) {
                    return Err(Error::MsrRestore {
                        set: saved.len() - rest.len() + set,
                        total: saved.len(),
                        first_refused: refused.index,
                    });
                }
                rest = &rest[set + 1..];
            }
        }
    }
    Ok(())
}

fn xsave_fits(hv: &Hypervisor, what: &str) -> Result<()> {
    if hv.xsave_bytes() > std::mem::size_of::<kvm_xsave>() {
        return Err(Error::Config(format!(
            "this host's XSAVE area is {} bytes; {what} areas over 4 KiB (AMX) is not supported yet",
            hv.xsave_bytes()
        )));
    }
    Ok(())
}

/// Saves everything KVM keeps for vCPU `id` (`irqchip`: the VM has an in-kernel LAPIC),
/// after completing an access the last exit left pending. The vCPU must not be running.
pub fn save_vcpu(fd: &mut VcpuFd, hv: &Hypervisor, id: u8, irqchip: bool) -> Result<VcpuState> {
    xsave_fits(hv, "saving")?;
    complete_pending_io(fd)?;
    let mp_state = fd.get_mp_state().map_err(kvm("KVM_GET_MP_STATE"))?;
    let regs = fd.get_regs().map_err(kvm("KVM_GET_REGS"))?;
    let sregs = fd.get_sregs().map_err(kvm("KVM_GET_SREGS"))?;
    let xsave = fd.get_xsave().map_err(kvm("KVM_GET_XSAVE"))?.region.to_vec();
    let xcrs = fd.get_xcrs().map_err(kvm("KVM_GET_XCRS"))?;
    let debugregs = fd.get_debug_regs().map_err(kvm("KVM_GET_DEBUGREGS"))?;
    let lapic = if irqchip { Some(fd.get_lapic().map_err(kvm("KVM_GET_LAPIC"))?) } else { None };
    let msrs = get_msrs(fd, hv)?;
    let events = fd.get_vcpu_events().map_err(kvm("KVM_GET_VCPU_EVENTS"))?;
    let cpuid = fd.get_cpuid2(KVM_MAX_CPUID_ENTRIES).map_err(kvm("KVM_GET_CPUID2"))?.as_slice().to_vec();
    Ok(VcpuState { id, cpuid, mp_state, regs, sregs, xsave, xcrs, debugregs, lapic, msrs, events })
}

/// Loads `s` into vCPU `id`, checking first that it is this vCPU's and fits the VM.
pub fn restore_vcpu(fd: &VcpuFd, hv: &Hypervisor, id: u8, irqchip: bool, s: &VcpuState) -> Result<()> {
    if s.id != id {
        return Err(Error::Config(format!("state of vCPU {} given to vCPU {id}", s.id)));
    }
    if s.lapic.is_some() != irqchip {
        return Err(Error::Config("snapshot and VM disagree on the in-kernel irqchip".into()));
    }
    xsave_fits(hv, "restoring into")?;
    let mut xsave = kvm_xsave::default();
    if s.xsave.len() != xsave.region.len() {
        return Err(Error::Config(format!(
            "XSAVE area of {} words, expected {}",
            s.xsave.len(),
            xsave.region.len()
        )));
    }
    xsave.region.copy_from_slice(&s.xsave);
    let cpuid = CpuId::from_entries(&s.cpuid)
        .map_err(|e| Error::Config(format!("saved CPUID does not fit KVM: {e:?}")))?;
    // CPUID first: KVM checks MSRs and XSAVE features against it.
    fd.set_cpuid2(&cpuid).map_err(kvm("KVM_SET_CPUID2"))?;
    fd.set_mp_state(s.mp_state).map_err(kvm("KVM_SET_MP_STATE"))?;
    fd.set_regs(&s.regs).map_err(kvm("KVM_SET_REGS"))?;
    fd.set_sregs(&s.sregs).map_err(kvm("KVM_SET_SREGS"))?;
    // SAFETY: `xsave` is the legacy 4 KiB buffer and the host's area is not larger (checked
    // above), so KVM reads no more than the buffer holds.
    unsafe { fd.set_xsave(&xsave) }.map_err(kvm("KVM_SET_XSAVE"))?;
    fd.set_xcrs(&s.xcrs).map_err(kvm("KVM_SET_XCRS"))?;
    fd.set_debug_regs(&s.debugregs).map_err(kvm("KVM_SET_DEBUGREGS"))?;
    if let Some(lapic) = &s.lapic {
        fd.set_lapic(lapic).map_err(kvm("KVM_SET_LAPIC"))?;
    }
    set_msrs(fd, &s.msrs)?;
    // Events last: they may reference state (pending exceptions) set above.
    fd.set_vcpu_events(&s.events).map_err(kvm("KVM_SET_VCPU_EVENTS"))?;
    Ok(())
}
