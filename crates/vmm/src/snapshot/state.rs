//! What a snapshot holds: a tree that mirrors the VM, each part's state produced by that
//! part's `Snapshottable` impl. The snapshot format (`format`) encodes it; this module only
//! names the parts, so it depends on them and never the reverse.

use crate::config::VmConfig;
use crate::disk::DiskRef;
use crate::memory::MemoryState;
use crate::synthetic::devices::DeviceStates;
use crate::vstate::{VcpuState, VmState};
use serde::{Deserialize, Serialize};

/// Everything a snapshot holds about one VM.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MachineState {
    /// Shape of the VM (RAM size, vCPU count, in-kernel irqchip).
    pub config: VmConfig,
    /// VM-wide KVM state (clock, irqchip, PIT).
    pub vm: VmState,
    /// One state per vCPU, in vCPU id order.
    pub vcpus: Vec<VcpuState>,
    /// The memory layer holding guest RAM.
    pub memory: MemoryState,
    /// Every device's state, by kind.
    pub devices: DeviceStates,
    /// Where the disk's frozen chain is, for a VM with a disk (format version 4 on).
    pub disk: Option<DiskRef>,
}
