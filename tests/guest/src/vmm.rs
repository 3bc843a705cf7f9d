//! The cached Linux guest in `branchbox-vmm` processes: the process configuration and the boot
//! request the VMM-level tests (`vmm_linux.rs`, `vmm_linux_snapshot.rs`) start it with.

use crate::artifacts::{root_disk, vmlinux};
use branchbox_vmm::process::protocol::BootLinux;
use branchbox_vmm::process::{default_program, VmmProcess};
use branchbox_vmm::VmConfig;
use std::path::{Path, PathBuf};

/// The smallest RAM the layout allows: under PVM less RAM reaches the kernel's end sooner.
pub const MEM: u64 = 64 << 20;

/// The configuration a VMM process for these tests starts with.
pub fn config() -> VmConfig {
    VmConfig { mem_size: MEM, vcpus: 1, irqchip: false }
}

/// A new VMM process with [`config`].
pub fn start_vmm() -> VmmProcess {
    VmmProcess::start(&default_program(), config()).expect("start a VMM process")
}

/// The cached kernel and root disk.
pub struct VmmGuest {
    /// The `vmlinux`.
    pub kernel: PathBuf,
    /// The root disk image.
    pub disk: PathBuf,
}

impl VmmGuest {
    /// The cached guest; panics naming the command that builds it. No silent skip: CI builds
    /// it before these tests, and a skip would hide a missing install step.
    pub fn cached() -> VmmGuest {
        match (vmlinux(), root_disk()) {
            (Ok(kernel), Ok(disk)) => VmmGuest { kernel, disk },
            (Err(why), _) | (_, Err(why)) => panic!("the guest is not cached: {why}"),
        }
    }

    /// A request booting the guest with [`MEM`] of RAM, its serial log, vsock socket and disk
    /// store in `work` (its disk's chain named `chain`), and `extra` on its command line after
    /// the early serial console.
    pub fn boot_request(&self, work: &Path, chain: &str, extra: &str) -> BootLinux {
        BootLinux {
            kernel: self.kernel.clone(),
            disk: self.disk.clone(),
            disk_store: work.join("disk"),
            disk_chain: chain.into(),
            cmdline_extra: format!("earlyprintk=serial,ttyS0,115200 {extra}").trim_end().into(),
            mem_size: MEM,
            vcpus: 1,
            vsock_socket: work.join("vsock.sock"),
            serial_log: work.join("serial.log"),
            net: None,
        }
    }
}
