//! What every benchmark shares: the host facts its figures depend on, and a scratch
//! directory. A module of its own so that the benchmarks import it and never one another's
//! parent.

use branchbox_vmm::hypervisor::Hypervisor;
use branchbox_vmm::{Error, Result};
use serde_json::json;

/// Guest page size the benchmarks step by.
pub(super) const PAGE: u64 = 4096;

/// Host facts the figures depend on.
pub(super) fn host_facts(hv: &Hypervisor) -> serde_json::Value {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let pvm = std::path::Path::new("/sys/module/kvm_pvm").exists();
    json!({
        "kernel": kernel,
        "kvm": if pvm { "kvm_pvm (no hardware virtualization)" } else { "kvm" },
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "msrs_saved_per_vcpu": hv.msr_indices().len(),
        "xsave_bytes": hv.xsave_bytes(),
    })
}

/// A temporary directory removed on drop (benchmarks must not leave 512 MiB layers behind).
pub(super) struct TempDir(std::path::PathBuf);

impl TempDir {
    pub(super) fn new() -> Result<TempDir> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let path = std::env::temp_dir().join(format!("branchbox-vmm-bench-{}-{nanos:x}", std::process::id()));
        std::fs::create_dir(&path).map_err(mem("create bench directory"))?;
        Ok(TempDir(path))
    }

    pub(super) fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Wraps a KVM ioctl's error with the operation's name, as the monitor's own errors do.
pub(super) fn kvm(op: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
    move |source| Error::Kvm { op, source }
}

/// Wraps an OS error from a memory or file operation with the operation's name.
pub(super) fn mem(op: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Memory { op, source }
}
