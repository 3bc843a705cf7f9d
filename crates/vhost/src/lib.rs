//! vhost-user servers for branchbox's virtio device back ends.
//!
//! The device logic lives in branchbox-virtio and is written once: the microVM's in-process
//! virtio-mmio transport calls it, and so does this crate, which serves it over vhost-user to
//! any front end (QEMU in the end-to-end test), so real Linux drivers exercise our devices on
//! hosts without hardware virtualization. See docs/vhost-user.md.

mod backend;
mod device;
mod serve;

pub use backend::{Backend, Counters, QueueCounters};
pub use device::{Memory, ServedDevice};
pub use serve::{ServeError, VhostServer};
