//! The devices this crate serves: branchbox-virtio's device logic ([`VirtioDevice`]) plus
//! what a vhost-user server needs on top of it, a name and, for devices with a host side (vsock, net),
//! a descriptor to poll next to the queues.

use std::os::fd::RawFd;

use branchbox_virtio::blk::Block;
use branchbox_virtio::net::Net;
use branchbox_virtio::rng::Rng;
use branchbox_virtio::vsock::Vsock;
use branchbox_virtio::VirtioDevice;

/// Guest memory as the vhost-user front end shares it with us (no dirty bitmap).
pub type Memory = vm_memory::GuestMemoryMmap<()>;

/// A branchbox-virtio device as the vhost-user server drives it.
pub trait ServedDevice: VirtioDevice + 'static {
    /// Short name, for logs and thread names (`blk`, `net`, `vsock`, `rng`).
    const NAME: &'static str;

    /// A descriptor that becomes readable when the device's host side has work (vsock: host
    /// connections with data for the guest; net: frames waiting on the tap). The server polls it next to the queues' kick
    /// events and then calls [`ServedDevice::handle_host_events`].
    fn host_event_fd(&self) -> Option<RawFd> {
        None
    }

    /// Handles what made [`ServedDevice::host_event_fd`] readable. The server then processes
    /// the queues with work, so data the host side queued reaches the guest.
    fn handle_host_events(&mut self) {}
}

impl ServedDevice for Block {
    const NAME: &'static str = "blk";
}

impl ServedDevice for Rng {
    const NAME: &'static str = "rng";
}

impl ServedDevice for Vsock {
    const NAME: &'static str = "vsock";

    fn host_event_fd(&self) -> Option<RawFd> {
        Some(Vsock::host_event_fd(self))
    }

    fn handle_host_events(&mut self) {
        Vsock::handle_host_events(self);
    }
}

impl ServedDevice for Net {
    const NAME: &'static str = "net";

    fn host_event_fd(&self) -> Option<RawFd> {
        Some(Net::host_event_fd(self))
    }

    fn handle_host_events(&mut self) {
        Net::handle_host_events(self);
    }
}
