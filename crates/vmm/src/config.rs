//! The shape of a VM: what a snapshot records and the VM restored from it must match.

use serde::{Deserialize, Serialize};

/// The shape of a VM: what must match between a snapshot and the VM restored from it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct VmConfig {
    /// Guest RAM in bytes, mapped at guest-physical address 0.
    pub mem_size: u64,
    /// Number of vCPUs (the run loop runs vCPU 0; the others are created and saved).
    pub vcpus: u8,
    /// Whether the VM has the in-kernel PIC/IOAPIC/LAPIC and PIT (a Linux guest needs them;
    /// the test guest does not, and creating them costs ~2 ms per VM here).
    pub irqchip: bool,
}
