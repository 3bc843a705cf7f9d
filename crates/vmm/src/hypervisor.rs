//! The process's handle on `/dev/kvm` and the host facts every VM needs (CPUID, MSR list).
//!
//! Probing which MSRs can be read costs a throwaway VM, so it is done once per handle and
//! shared by every VM built from it.

use crate::error::{kvm, Error, Result};
use kvm_bindings::{kvm_msr_entry, CpuId, Msrs, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::Kvm;
use std::sync::Arc;

/// `KVM_CAP_XSAVE2`: the size of the XSAVE area when it is larger than the legacy 4 KiB.
const CAP_XSAVE2: u64 = kvm_bindings::KVM_CAP_XSAVE2 as u64;

/// An open `/dev/kvm` plus what it supports on this host.
pub struct Hypervisor {
    kvm: Kvm,
    cpuid: CpuId,
    msrs: Vec<u32>,
    xsave_bytes: usize,
}

impl Hypervisor {
    /// Opens `/dev/kvm` and probes CPUID, the readable MSRs and the XSAVE size.
    pub fn open() -> Result<Arc<Hypervisor>> {
        let sys = Kvm::new().map_err(Error::KvmUnavailable)?;
        let cpuid = sys.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).map_err(kvm("KVM_GET_SUPPORTED_CPUID"))?;
        let listed = sys.get_msr_index_list().map_err(kvm("KVM_GET_MSR_INDEX_LIST"))?.as_slice().to_vec();
        let msrs = readable_msrs(&sys, &cpuid, &listed)?;
        // Below 4 KiB (or without the capability) the legacy KVM_GET_XSAVE buffer is exact.
        let xsave2 = usize::try_from(sys.check_extension_raw(CAP_XSAVE2)).unwrap_or(0);
        let xsave_bytes = xsave2.max(std::mem::size_of::<kvm_bindings::kvm_xsave>());
        Ok(Arc::new(Hypervisor { kvm: sys, cpuid, msrs, xsave_bytes }))
    }

    /// The underlying KVM system handle.
    pub fn kvm(&self) -> &Kvm {
        &self.kvm
    }

    /// CPUID that KVM supports on this host, given to every new vCPU.
    pub fn supported_cpuid(&self) -> &CpuId {
        &self.cpuid
    }

    /// MSR indices from `KVM_GET_MSR_INDEX_LIST` that a vCPU here can actually read.
    pub fn msr_indices(&self) -> &[u32] {
        &self.msrs
    }

    /// Size in bytes of a vCPU's XSAVE area on this host.
    pub fn xsave_bytes(&self) -> usize {
        self.xsave_bytes
    }
}

/// Keeps the listed MSRs that a fresh vCPU lets us read: KVM lists some that depend on
/// features this host lacks, and `KVM_GET_MSRS` stops at the first one it refuses.
fn readable_msrs(sys: &Kvm, cpuid: &CpuId, listed: &[u32]) -> Result<Vec<u32>> {
    let vm = sys.create_vm().map_err(kvm("KVM_CREATE_VM"))?;
    let vcpu = vm.create_vcpu(0).map_err(kvm("KVM_CREATE_VCPU"))?;
    vcpu.set_cpuid2(cpuid).map_err(kvm("KVM_SET_CPUID2"))?;
    let mut readable = Vec::with_capacity(listed.len());
    for &index in listed {
        let entry = kvm_msr_entry { index, ..Default::default() };
        let mut one = Msrs::from_entries(&[entry])
            .map_err(|e| Error::Config(format!("cannot build an MSR buffer: {e:?}")))?;
        if matches!(vcpu.get_msrs(&mut one), Ok(1)) {
            readable.push(index);
        }
    }
    Ok(readable)
}
