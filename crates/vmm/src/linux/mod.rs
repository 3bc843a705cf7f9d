//! Booting and running a Linux guest: the VM a real kernel needs, built in the order this
//! host measured fastest, with the boot structures from `branchbox-arch`, COM1 and the
//! i8042 on the port bus, virtio-mmio devices on the MMIO bus, and a run that ends with a
//! clear reason (reset, shutdown, triple fault, emulation failure, or a stop request).
//!
//! Layout and boot protocol: `docs/boot.md`.

mod builder;
mod devices;
mod end;
mod error;
mod import;
mod memfile;
mod run;
mod snapshot;
pub mod state;
mod stop;
mod vcpu;

pub use builder::{LinuxVm, LinuxVmConfig, VirtioSlot};
pub use devices::{connect_guest_port, NetAttach, Transport};
pub use end::RunEnd;
pub use error::{LinuxError, LinuxResult};
pub use snapshot::{LinuxRestore, Saved, Snapshotter, SNAPSHOT_DISK_STORE};
pub use stop::StopHandle;

/// Default cap of the serial log: enough for a verbose boot and a long session's console.
pub const DEFAULT_SERIAL_LOG_CAP: u64 = 8 << 20;
