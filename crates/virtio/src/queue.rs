//! The one loop over a queue's available chains that every device uses, what it reports, and
//! the saved form of a queue.

use branchbox_persist::RestoreError;
use serde::{Deserialize, Serialize};
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueState, QueueT};
use vm_memory::GuestMemory;

use crate::DeviceError;

/// One chain put on the used ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsedChain {
    /// The chain's head descriptor index.
    pub head: u16,
    /// Bytes the device wrote into the chain's writable buffers.
    pub len: u32,
}

/// What one pass over a queue did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct QueueOutcome {
    /// Chains put on the used ring, in order.
    pub used: Vec<UsedChain>,
    /// How many of the chains were malformed (answered with an error, or dropped when even
    /// their head index was out of range).
    pub rejected: u32,
    /// Whether the driver wants an interrupt for this pass (event-idx or flags permitting).
    pub signal: bool,
}

/// How a device answered one chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The request was served; the device wrote this many bytes into the chain.
    Done(u32),
    /// The chain was malformed or the request refused; the device wrote this many bytes (an
    /// error status where the chain had room for it).
    Rejected(u32),
}

/// Pops every available chain of `queue` (queue `index`), hands it to `answer` and puts it on
/// the used ring. Re-checks for chains after re-enabling notifications, so a chain the driver
/// adds while notifications were off is not left behind.
pub fn process_chains<M, F>(
    index: usize,
    queue: &mut Queue,
    mem: &M,
    mut answer: F,
) -> Result<QueueOutcome, DeviceError>
where
    M: GuestMemory,
    F: FnMut(DescriptorChain<&M>) -> Answer,
{
    let mut outcome = QueueOutcome::default();
    if !queue.ready() {
        return Ok(outcome);
    }
    let queue_err = |source| DeviceError::Queue { index, source };
    loop {
        queue.disable_notification(mem).map_err(queue_err)?;
        let mut progressed = false;
        while let Some(chain) = queue.pop_descriptor_chain(mem) {
            progressed = true;
            let head = chain.head_index();
            let len = match answer(chain) {
                Answer::Done(len) => len,
                Answer::Rejected(len) => {
                    outcome.rejected += 1;
                    len
                }
            };
            if head >= queue.size() {
                // A head index past the queue names no descriptor the driver could get back;
                // there is nothing to return.
                continue;
            }
            queue.add_used(mem, head, len).map_err(queue_err)?;
            outcome.used.push(UsedChain { head, len });
        }
        if !queue.enable_notification(mem).map_err(queue_err)? {
            break;
        }
        if !progressed {
            return Err(broken_avail_ring(index));
        }
    }
    if !outcome.used.is_empty() {
        outcome.signal = queue.needs_notification(mem).map_err(queue_err)?;
    }
    Ok(outcome)
}

/// How a device filled one chain of a queue it writes on its own initiative (RX).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// Filled: the device wrote this many bytes.
    Used(u32),
    /// The chain was malformed or could not be written: returned with this many bytes and
    /// counted in [`QueueOutcome::rejected`].
    Rejected(u32),
    /// Nothing fits after all: the chain stays the driver's, unused, and the pass ends.
    PutBack,
}

/// Pops a chain of `queue` (queue `index` of `device`) while `has_work` says the device has
/// something for the guest, hands it to `fill` and puts it on the used ring. Out of chains,
/// it asks to be notified when the driver adds some and looks once more, so none added
/// meanwhile is left behind.
pub fn fill_chains<M: GuestMemory, D>(
    index: usize,
    queue: &mut Queue,
    mem: &M,
    device: &mut D,
    has_work: fn(&D) -> bool,
    fill: fn(&mut D, &M, DescriptorChain<&M>) -> Fill,
) -> Result<QueueOutcome, DeviceError> {
    let queue_err = |source| DeviceError::Queue { index, source };
    let mut out = QueueOutcome::default();
    if !queue.ready() {
        return Ok(out);
    }
    let mut looked_again = false;
    while has_work(device) {
        let Some(chain) = queue.pop_descriptor_chain(mem) else {
            if !queue.enable_notification(mem).map_err(queue_err)? {
                break;
            }
            if looked_again {
                return Err(broken_avail_ring(index));
            }
            looked_again = true;
            continue;
        };
        looked_again = false;
        let head = chain.head_index();
        let len = match fill(device, mem, chain) {
            Fill::Used(len) => len,
            Fill::Rejected(len) => {
                out.rejected += 1;
                len
            }
            Fill::PutBack => {
                queue.go_to_previous_position();
                break;
            }
        };
        if head < queue.size() {
            queue.add_used(mem, head, len).map_err(queue_err)?;
            out.used.push(UsedChain { head, len });
        }
    }
    if !out.used.is_empty() {
        out.signal = queue.needs_notification(mem).map_err(queue_err)?;
    }
    Ok(out)
}

/// The driver's available index says there are chains, yet none can be popped: the index is
/// more than a queue ahead of the device or the ring cannot be read. Looping on it would
/// spin forever, so the queue is reported broken.
pub(crate) fn broken_avail_ring(index: usize) -> DeviceError {
    DeviceError::Queue { index, source: virtio_queue::Error::InvalidAvailRingIndex }
}

/// A queue's saved state: the fields of virtio-queue's `QueueState`, which has no serde.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSnapshot {
    /// The largest size the device offered.
    pub max_size: u16,
    /// Next available-ring entry the device will read.
    pub next_avail: u16,
    /// Next used-ring entry the device will write.
    pub next_used: u16,
    /// Whether `VIRTIO_RING_F_EVENT_IDX` was negotiated.
    pub event_idx_enabled: bool,
    /// The size the driver chose.
    pub size: u16,
    /// Whether the driver marked the queue ready.
    pub ready: bool,
    /// Guest address of the descriptor table.
    pub desc_table: u64,
    /// Guest address of the available ring.
    pub avail_ring: u64,
    /// Guest address of the used ring.
    pub used_ring: u64,
}

impl QueueSnapshot {
    /// The saved form of `queue`.
    pub fn of(queue: &Queue) -> QueueSnapshot {
        let s = queue.state();
        QueueSnapshot {
            max_size: s.max_size,
            next_avail: s.next_avail,
            next_used: s.next_used,
            event_idx_enabled: s.event_idx_enabled,
            size: s.size,
            ready: s.ready,
            desc_table: s.desc_table,
            avail_ring: s.avail_ring,
            used_ring: s.used_ring,
        }
    }

    /// Rebuilds the queue for a device whose queue offers `max_size`; refuses a saved state
    /// made for another maximum or one virtio-queue finds invalid (size not a power of two,
    /// misaligned rings).
    pub fn to_queue(&self, part: &'static str, max_size: u16) -> Result<Queue, RestoreError> {
        if self.max_size != max_size {
            return Err(RestoreError::new(
                part,
                format!("saved queue maximum {} differs from this device's {max_size}", self.max_size),
            ));
        }
        let state = QueueState {
            max_size: self.max_size,
            next_avail: self.next_avail,
            next_used: self.next_used,
            event_idx_enabled: self.event_idx_enabled,
            size: self.size,
            ready: self.ready,
            desc_table: self.desc_table,
            avail_ring: self.avail_ring,
            used_ring: self.used_ring,
        };
        Queue::try_from(state).map_err(|e| RestoreError::new(part, format!("saved queue is invalid: {e}")))
    }
}
