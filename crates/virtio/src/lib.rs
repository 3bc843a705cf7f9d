//! Virtio devices of the branchbox microVM, written once.
//!
//! Each device ([`blk::Block`], [`net::Net`], [`rng::Rng`], [`vsock::Vsock`]) implements
//! [`VirtioDevice`]: given one `virtio_queue::Queue` and a `vm_memory::GuestMemory`, it processes the queue's
//! available descriptor chains, puts them on the used ring and says whether the guest wants an
//! interrupt. Two transports call that same code: [`mmio::MmioTransport`] in the VMM process
//! (virtio-mmio, version 2) and the vhost-user server in `branchbox-vhost`, which hands the
//! queue and memory that vhost-user-backend keeps for it.
//!
//! Everything the guest controls (MMIO offsets and sizes, queue sizes, descriptor addresses,
//! lengths, flags and chains) is parsed with bounds checks by [`chain`] and the devices; a bad
//! chain is returned to the guest with an error, never a panic, and the device stays usable.
//! [`vmgenid::VmGenId`] is not a virtio device: it is a 16-byte generation id in guest memory
//! that the VMM rewrites on restore or fork.

pub mod blk;
pub mod chain;
#[cfg(feature = "testing")]
pub mod fuzz;
pub mod mmio;
pub mod net;
pub mod queue;
pub mod rng;
#[cfg(feature = "testing")]
pub mod testing;
pub mod vmgenid;
pub mod vsock;

use virtio_queue::Queue;
use vm_memory::GuestMemory;

pub use queue::{QueueOutcome, QueueSnapshot, UsedChain};

/// Why a pass over a queue stopped. A malformed chain is not an error: it is returned to the
/// guest with an error status and counted in [`QueueOutcome::rejected`]. These errors mean the
/// queue itself is unusable (its rings lie outside guest memory, or it is not ready); the
/// transport marks the device as needing a reset.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The queue index is not one of the device's queues.
    #[error("queue {index} does not exist: the device has {count} queues")]
    NoSuchQueue {
        /// The index asked for.
        index: usize,
        /// How many queues the device has.
        count: usize,
    },
    /// The used ring or available ring could not be accessed.
    #[error("queue {index}: {source}; the driver must reset the device and set up the queue again")]
    Queue {
        /// The queue's index.
        index: usize,
        /// What virtio-queue reported.
        source: virtio_queue::Error,
    },
}

/// A virtio device's logic, independent of the transport that carries it.
pub trait VirtioDevice: Send {
    /// The virtio device id (`VIRTIO_ID_BLOCK`, `VIRTIO_ID_NET`, `VIRTIO_ID_RNG`, `VIRTIO_ID_VSOCK`).
    fn device_type(&self) -> u32;

    /// The largest size each queue accepts; the slice's length is the number of queues.
    fn queue_max_sizes(&self) -> &[u16];

    /// The feature bits the device offers, including `VIRTIO_F_VERSION_1`.
    fn features(&self) -> u64;

    /// The driver accepted `features` (a subset of [`features`](Self::features); the
    /// transport strips anything else before calling).
    fn ack_features(&mut self, features: u64);

    /// The device's configuration space as it is now.
    fn config(&self) -> Vec<u8>;

    /// Processes `queue`'s available chains (queue `index` of this device) in guest memory
    /// `mem`: each chain is answered and put on the used ring. Returns what was used and
    /// whether to signal the guest.
    fn process_queue<M: GuestMemory>(
        &mut self,
        index: usize,
        queue: &mut Queue,
        mem: &M,
    ) -> Result<QueueOutcome, DeviceError>;

    /// Queues (bit `i` for queue `i`) for which the device has work of its own, such as
    /// vsock packets for the guest after host events or after a TX packet asked for an
    /// answer. A transport processes them after each notification and host event.
    fn queues_with_work(&self) -> u64 {
        0
    }

    /// The driver reset the device: forget negotiated features and per-session state.
    fn reset(&mut self);
}

/// Copies the bytes of `config` at `offset` into `data`; bytes past the end of `config` read
/// as zero, as the virtio spec leaves reads beyond the device's config undefined and a guest
/// must not learn anything from them.
pub fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    data.fill(0);
    let Ok(start) = usize::try_from(offset) else {
        return;
    };
    if let Some(available) = config.get(start..) {
        let n = available.len().min(data.len());
        data[..n].copy_from_slice(&available[..n]);
    }
}

/// `VIRTIO_F_VERSION_1` as a feature mask: every device is a modern (version 1) device.
pub const FEATURE_VERSION_1: u64 = 1 << virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;

/// `VIRTIO_RING_F_EVENT_IDX` as a feature mask: every device supports used/avail event
/// suppression through virtio-queue.
pub const FEATURE_EVENT_IDX: u64 = 1 << virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_reads_are_bounded_and_zero_past_the_end() {
        let config = [1u8, 2, 3, 4];
        let mut data = [0xffu8; 4];
        read_config_bytes(&config, 2, &mut data);
        assert_eq!(data, [3, 4, 0, 0]);
        read_config_bytes(&config, u64::MAX, &mut data);
        assert_eq!(data, [0, 0, 0, 0]);
    }
}
