//! The vhost-user back end over any [`ServedDevice`]: feature and config negotiation, the guest
//! memory the front end shares, and the event handling that turns kicks (and host-side events)
//! into branchbox-virtio's queue processing and interrupts to the guest.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackendMut, VringRwLock, VringT};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_INDIRECT_DESC;
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier};

use crate::device::{Memory, ServedDevice};

/// Largest config space read we answer; virtio config spaces are far smaller, and the size the
/// front end asks for is not ours to trust.
const MAX_CONFIG_READ: u32 = 256;

/// Extra passes over the queues a device reports work for, after one event's first pass.
const MAX_WORK_ROUNDS: usize = 4;

/// What the server did on one queue, as branchbox-virtio reported it.
#[derive(Debug, Default)]
pub struct QueueCounters {
    /// Descriptor chains put on the used ring.
    pub chains: AtomicU64,
    /// Bytes the device wrote into guest buffers (the used entries' lengths).
    pub bytes_to_guest: AtomicU64,
    /// Malformed chains the device refused.
    pub rejected: AtomicU64,
}

/// Counters of a served device, shared with whoever started the server.
#[derive(Debug)]
pub struct Counters {
    /// One entry per queue, in queue order.
    pub queues: Vec<QueueCounters>,
    /// Errors that stopped a pass over a queue or the host side (logged; serving went on).
    pub device_errors: AtomicU64,
}

impl Counters {
    fn new(num_queues: usize) -> Self {
        Counters {
            queues: (0..num_queues).map(|_| QueueCounters::default()).collect(),
            device_errors: AtomicU64::new(0),
        }
    }

    /// Chains used on queue `index` so far (0 for a queue the device does not have).
    pub fn chains(&self, index: usize) -> u64 {
        self.queues.get(index).map_or(0, |q| q.chains.load(Ordering::Relaxed))
    }

    /// Bytes written into guest buffers on queue `index` so far.
    pub fn bytes_to_guest(&self, index: usize) -> u64 {
        self.queues.get(index).map_or(0, |q| q.bytes_to_guest.load(Ordering::Relaxed))
    }

    /// Malformed chains refused on queue `index` so far.
    pub fn rejected(&self, index: usize) -> u64 {
        self.queues.get(index).map_or(0, |q| q.rejected.load(Ordering::Relaxed))
    }
}

/// A [`ServedDevice`] served over vhost-user.
pub struct Backend<D: ServedDevice> {
    // The library wants a `Sync` back end; device logic need only be `Send`.
    device: Mutex<D>,
    num_queues: usize,
    mem: Option<GuestMemoryAtomic<Memory>>,
    counters: Arc<Counters>,
}

impl<D: ServedDevice> Backend<D> {
    /// Wraps `device`; its counters start at zero.
    pub fn new(device: D) -> Self {
        let num_queues = device.queue_max_sizes().len();
        let counters = Arc::new(Counters::new(num_queues));
        Backend { device: Mutex::new(device), num_queues, mem: None, counters }
    }

    /// The counters this back end updates while it serves.
    pub fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    /// The device's short name.
    pub fn device_name(&self) -> &'static str {
        D::NAME
    }

    /// The event id under which the device's host side is polled: the library reserves the
    /// ids up to and including the number of queues.
    pub fn host_event_id(&self) -> u16 {
        u16::try_from(self.num_queues + 1).unwrap_or(u16::MAX)
    }

    /// The device's host-side descriptor, if it has one.
    pub fn host_event_fd(&self) -> Option<std::os::fd::RawFd> {
        self.device().host_event_fd()
    }

    fn device(&self) -> MutexGuard<'_, D> {
        // A panic while holding the lock cannot leave the device logic half-updated in a way
        // that matters more than stopping; keep serving with what is there.
        self.device.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Processes every enabled queue, then the queues the device says have work of its own
    /// (vsock: a request on tx is answered on rx, which comes first), interrupting the guest
    /// where the device says so. A queue with nothing available costs one ring read.
    fn process_all(&self, vrings: &[VringRwLock]) -> io::Result<()> {
        let Some(mem) = self.mem.as_ref().map(|m| m.memory()) else {
            return Ok(());
        };
        let mut device = self.device();
        let mut used = false;
        for index in 0..vrings.len() {
            used |= self.process(&mut device, vrings, index, &mem)?;
        }
        // Bounded: a device that keeps reporting work the guest gave no buffers for (rx full)
        // is retried on the guest's next kick, not spun on here.
        for _ in 0..MAX_WORK_ROUNDS {
            let work = device.queues_with_work();
            if work == 0 || !used {
                break;
            }
            used = false;
            for index in (0..vrings.len()).filter(|i| *i < 64 && work & (1 << i) != 0) {
                used |= self.process(&mut device, vrings, index, &mem)?;
            }
        }
        Ok(())
    }

    /// One pass over queue `index` if the front end enabled it; returns whether chains were
    /// used.
    fn process(
        &self,
        device: &mut D,
        vrings: &[VringRwLock],
        index: usize,
        mem: &Memory,
    ) -> io::Result<bool> {
        let Some(vring) = vrings.get(index) else { return Ok(false) };
        let mut state = vring.get_mut();
        if !state.is_enabled() {
            return Ok(false);
        }
        let outcome = match device.process_queue(index, state.get_queue_mut(), mem) {
            Ok(outcome) => outcome,
            Err(e) => {
                self.error(&e.to_string());
                return Ok(false);
            }
        };
        if let Some(c) = self.counters.queues.get(index) {
            c.chains.fetch_add(outcome.used.len() as u64, Ordering::Relaxed);
            let bytes: u64 = outcome.used.iter().map(|u| u64::from(u.len)).sum();
            c.bytes_to_guest.fetch_add(bytes, Ordering::Relaxed);
            c.rejected.fetch_add(u64::from(outcome.rejected), Ordering::Relaxed);
        }
        if outcome.signal {
            state.signal_used_queue()?;
        }
        Ok(!outcome.used.is_empty())
    }

    fn error(&self, message: &str) {
        self.counters.device_errors.fetch_add(1, Ordering::Relaxed);
        eprintln!("branchbox-vhost: {}: {message}", D::NAME);
    }
}

impl<D: ServedDevice> VhostUserBackendMut for Backend<D> {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        self.num_queues
    }

    fn max_queue_size(&self) -> usize {
        self.device().queue_max_sizes().iter().copied().max().map_or(0, usize::from)
    }

    fn features(&self) -> u64 {
        // Indirect descriptor tables are followed by virtio-queue's chain iterator, below any
        // device's logic, so every device handles them. QEMU 7.2's vhost-user-rng acks it
        // without asking (it passes the guest's features through unmasked), and
        // vhost-user-backend refuses a feature we did not offer, ending the session.
        self.device().features()
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            | 1 << VIRTIO_RING_F_INDIRECT_DESC
    }

    fn acked_features(&mut self, features: u64) {
        let mut device = self.device();
        let offered = device.features();
        device.ack_features(features & offered);
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        // MQ: vhost-user-blk asks for the queue count. CONFIG only for a device that has a
        // config space (block, vsock): QEMU warns about it on rng. The library adds REPLY_ACK.
        let mut features = VhostUserProtocolFeatures::MQ;
        if !self.device().config().is_empty() {
            features |= VhostUserProtocolFeatures::CONFIG;
        }
        features
    }

    fn reset_device(&mut self) {
        self.device().reset();
    }

    fn set_event_idx(&mut self, _enabled: bool) {
        // The library sets event-idx on the queues themselves; branchbox-virtio reads it there.
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        if size > MAX_CONFIG_READ {
            // An empty answer is how vhost-user reports a failed read.
            return Vec::new();
        }
        let mut data = vec![0u8; size as usize];
        branchbox_virtio::read_config_bytes(&self.device().config(), u64::from(offset), &mut data);
        data
    }

    fn update_memory(&mut self, mem: GuestMemoryAtomic<Memory>) -> io::Result<()> {
        self.mem = Some(mem);
        Ok(())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        // Without an exit event the library's worker thread would outlive the session.
        new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC).ok()
    }

    fn handle_event(
        &mut self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> io::Result<()> {
        if device_event == self.host_event_id() {
            self.device().handle_host_events();
        }
        self.process_all(vrings)
    }
}
