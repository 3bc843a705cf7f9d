//! Devices of a branchbox microVM that the guest reaches through MMIO or port I/O exits, and
//! the [`Bus`] that routes those accesses to them.
//!
//! A device knows two things: the guest accesses it serves ([`BusDevice`]) and how it is
//! saved ([`Snapshottable`](branchbox_persist::Snapshottable), with a state type of its
//! own). It knows nothing about the VM, the vCPUs or the snapshot file: the VMM that puts a
//! device on a bus keeps a typed handle to it (`Arc<Mutex<Device>>`) and collects each
//! device's state into its own snapshot format. Imports point one way: `branchbox-persist`
//! ← this crate ← the virtio devices and the VMM.

mod bus;
pub mod doorbell;
pub mod i8042;
pub mod serial;

pub use bus::{Bus, BusError};

/// What the vCPU run loop does after a device handled an access.
///
/// Non-exhaustive: devices may ask for more (a reset, a shutdown); a run loop that does not
/// know a variant returns to its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// Re-enter the guest.
    Continue,
    /// Return to the VMM's caller: the device has something for it.
    Stop,
    /// The guest asked for a CPU reset (i8042 command 0xFE): the run ends with a reset.
    Reset,
}

/// A device mapped at a range of guest-physical (MMIO) or port (PIO) addresses.
///
/// `offset` is relative to the start of the device's range and always inside it; `data` is
/// what the vCPU accessed (1 to 8 bytes from KVM, but a device must not rely on that and
/// must treat any length without panicking).
pub trait BusDevice: Send {
    /// The guest read `data.len()` bytes at `offset` into the device's range.
    fn read(&mut self, offset: u64, data: &mut [u8]) -> Action;
    /// The guest wrote `data` at `offset` into the device's range.
    fn write(&mut self, offset: u64, data: &[u8]) -> Action;
}
