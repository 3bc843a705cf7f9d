//! The virtio-mmio transport (version 2, "modern") in the VMM process.
//!
//! [`MmioTransport`] owns the device's queues and registers and serves the guest's register
//! accesses as a [`BusDevice`]. A write to `QueueNotify` (or [`MmioTransport::kick`], for a
//! VMM that takes notifications through an ioeventfd) runs the device's
//! [`VirtioDevice::process_queue`] and raises the interrupt through the injected
//! [`Interrupt`] when the driver wants one.
//!
//! The status handshake follows the spec: bits are only ever added (writing 0 resets),
//! `DRIVER` needs `ACKNOWLEDGE`, `FEATURES_OK` needs `DRIVER` and is refused unless the
//! driver accepted `VIRTIO_F_VERSION_1` and nothing the device did not offer, `DRIVER_OK`
//! needs `FEATURES_OK`. Features can be written only between `DRIVER` and `FEATURES_OK`;
//! queue registers only before `DRIVER_OK`, and a queue's size and addresses only while it
//! is not ready. Register accesses that are not 4 bytes at a 4-byte aligned offset are
//! ignored (reads return zero), so no offset or size the guest picks can panic.

use branchbox_devices::{Action, BusDevice};
use branchbox_persist::{NoContext, RestoreError, Snapshottable};
use serde::{Deserialize, Serialize};
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK, VIRTIO_CONFIG_S_FAILED,
    VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
};
use virtio_bindings::virtio_mmio::{VIRTIO_MMIO_INT_CONFIG, VIRTIO_MMIO_INT_VRING};
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestAddressSpace;
use vmm_sys_util::eventfd::EventFd;

use crate::queue::QueueSnapshot;
use crate::{read_config_bytes, VirtioDevice, FEATURE_EVENT_IDX, FEATURE_VERSION_1};

/// Length of a virtio-mmio device's register window.
pub const MMIO_LEN: u64 = 0x1000;
/// "virt" in little-endian: the value of the `MagicValue` register.
pub const MAGIC: u32 = 0x7472_6976;
/// The transport version served (2: modern, no legacy page-based queues).
pub const VERSION: u32 = 2;
/// The `VendorID` register: "bbox".
pub const VENDOR_ID: u32 = 0x786f_6262;

// Register offsets (virtio 1.2, section 4.2.2).
const REG_MAGIC: u64 = 0x000;
const REG_VERSION: u64 = 0x004;
const REG_DEVICE_ID: u64 = 0x008;
const REG_VENDOR_ID: u64 = 0x00c;
const REG_DEVICE_FEATURES: u64 = 0x010;
const REG_DEVICE_FEATURES_SEL: u64 = 0x014;
const REG_DRIVER_FEATURES: u64 = 0x020;
const REG_DRIVER_FEATURES_SEL: u64 = 0x024;
const REG_QUEUE_SEL: u64 = 0x030;
const REG_QUEUE_NUM_MAX: u64 = 0x034;
const REG_QUEUE_NUM: u64 = 0x038;
const REG_QUEUE_READY: u64 = 0x044;
const REG_QUEUE_NOTIFY: u64 = 0x050;
const REG_INTERRUPT_STATUS: u64 = 0x060;
const REG_INTERRUPT_ACK: u64 = 0x064;
const REG_STATUS: u64 = 0x070;
const REG_QUEUE_DESC_LOW: u64 = 0x080;
const REG_QUEUE_DESC_HIGH: u64 = 0x084;
const REG_QUEUE_AVAIL_LOW: u64 = 0x090;
const REG_QUEUE_AVAIL_HIGH: u64 = 0x094;
const REG_QUEUE_USED_LOW: u64 = 0x0a0;
const REG_QUEUE_USED_HIGH: u64 = 0x0a4;
const REG_CONFIG_GENERATION: u64 = 0x0fc;
const REG_CONFIG: u64 = 0x100;

/// How the transport raises the device's interrupt line (in the VMM: an irqfd).
pub trait Interrupt: Send {
    /// Raises the interrupt once. A failure is reported by the transport's counters; the
    /// guest still finds the work when it next looks.
    fn trigger(&self) -> std::io::Result<()>;
}

/// An irqfd registered with KVM for the device's interrupt line.
impl Interrupt for EventFd {
    fn trigger(&self) -> std::io::Result<()> {
        self.write(1)
    }
}

/// Counters of what the transport refused or could not do, for the VMM's diagnostics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MmioCounters {
    /// Register accesses ignored: wrong size, misaligned, unknown offset, or not allowed in
    /// the current status.
    pub ignored_accesses: u64,
    /// Chains the device refused as malformed.
    pub rejected_chains: u64,
    /// Interrupts the injected [`Interrupt`] failed to raise.
    pub failed_interrupts: u64,
}

/// A virtio device on the virtio-mmio transport, with its queues and registers.
pub struct MmioTransport<D: VirtioDevice, S: GuestAddressSpace> {
    device: D,
    mem: S,
    interrupt: Box<dyn Interrupt>,
    queues: Vec<Queue>,
    regs: Registers,
    counters: MmioCounters,
}

/// The guest-visible registers that are not queue state.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registers {
    /// `DeviceFeaturesSel`.
    pub device_features_sel: u32,
    /// `DriverFeaturesSel`.
    pub driver_features_sel: u32,
    /// The features the driver wrote (both words).
    pub driver_features: u64,
    /// `QueueSel`.
    pub queue_sel: u32,
    /// `Status`.
    pub status: u32,
    /// `InterruptStatus`: interrupts raised and not yet acknowledged.
    pub interrupt_status: u32,
    /// `ConfigGeneration`.
    pub config_generation: u32,
}

/// Saved state of a device on the transport: registers, queues and the device's own state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmioState<T> {
    /// The transport's registers, including the pending interrupt status.
    pub regs: Registers,
    /// Each queue's state.
    pub queues: Vec<QueueSnapshot>,
    /// The device's own state.
    pub device: T,
}

impl<D: VirtioDevice, S: GuestAddressSpace> MmioTransport<D, S> {
    /// Puts `device` on the transport, reaching guest memory through `mem` and raising its
    /// interrupt through `interrupt`.
    pub fn new(device: D, mem: S, interrupt: Box<dyn Interrupt>) -> MmioTransport<D, S> {
        let queues = new_queues(&device);
        MmioTransport {
            device,
            mem,
            interrupt,
            queues,
            regs: Registers::default(),
            counters: MmioCounters::default(),
        }
    }

    /// The device, for work the VMM does outside queue notifications (vsock host events).
    pub fn device_mut(&mut self) -> &mut D {
        &mut self.device
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// The registers as the guest sees them.
    pub fn registers(&self) -> Registers {
        self.regs
    }

    /// What was refused so far.
    pub fn counters(&self) -> MmioCounters {
        self.counters
    }

    /// Processes queue `index` as if the guest had notified it (the VMM calls this from an
    /// ioeventfd), then the queues the device says have work. Does nothing before the
    /// driver is ready.
    pub fn kick(&mut self, index: usize) {
        if self.queues.get(index).is_none() {
            self.counters.ignored_accesses += 1;
            return;
        }
        self.process(index);
        self.process_pending();
    }

    /// Processes the queues the device has work for, after host-side events (for vsock: call
    /// after `handle_host_events` on the device).
    pub fn process_pending(&mut self) {
        let work = self.device.queues_with_work();
        for index in 0..self.queues.len().min(64) {
            if work & (1 << index) != 0 {
                self.process(index);
            }
        }
    }

    fn process(&mut self, index: usize) {
        if self.regs.status & VIRTIO_CONFIG_S_DRIVER_OK == 0
            || self.regs.status & VIRTIO_CONFIG_S_NEEDS_RESET != 0
        {
            return;
        }
        let Some(queue) = self.queues.get_mut(index) else { return };
        let mem = self.mem.memory();
        if !queue.ready() {
            return;
        }
        if !queue.is_valid(&*mem) {
            self.needs_reset();
            return;
        }
        match self.device.process_queue(index, queue, &*mem) {
            Ok(outcome) => {
                self.counters.rejected_chains += u64::from(outcome.rejected);
                if outcome.signal {
                    self.raise(VIRTIO_MMIO_INT_VRING);
                }
            }
            Err(_) => self.needs_reset(),
        }
    }

    /// A queue became unusable: tell the driver through `DEVICE_NEEDS_RESET` and a
    /// configuration interrupt.
    fn needs_reset(&mut self) {
        self.regs.status |= VIRTIO_CONFIG_S_NEEDS_RESET;
        self.raise(VIRTIO_MMIO_INT_CONFIG);
    }

    fn raise(&mut self, bits: u32) {
        self.regs.interrupt_status |= bits;
        if self.interrupt.trigger().is_err() {
            self.counters.failed_interrupts += 1;
        }
    }

    fn reset(&mut self) {
        self.device.reset();
        self.queues = new_queues(&self.device);
        let generation = self.regs.config_generation;
        self.regs = Registers { config_generation: generation, ..Registers::default() };
    }

    fn selected_queue(&mut self) -> Option<&mut Queue> {
        self.queues.get_mut(self.regs.queue_sel as usize)
    }

    fn read_register(&mut self, offset: u64) -> Option<u32> {
        let word = |v: u64, sel: u32| match sel {
            0 => Some(v as u32),
            1 => Some((v >> 32) as u32),
            _ => Some(0),
        };
        match offset {
            REG_MAGIC => Some(MAGIC),
            REG_VERSION => Some(VERSION),
            REG_DEVICE_ID => Some(self.device.device_type()),
            REG_VENDOR_ID => Some(VENDOR_ID),
            REG_DEVICE_FEATURES => word(self.device.features(), self.regs.device_features_sel),
            REG_QUEUE_NUM_MAX => Some(self.selected_queue().map_or(0, |q| u32::from(q.max_size()))),
            REG_QUEUE_READY => Some(self.selected_queue().map_or(0, |q| u32::from(q.ready()))),
            REG_INTERRUPT_STATUS => Some(self.regs.interrupt_status),
            REG_STATUS => Some(self.regs.status),
            REG_CONFIG_GENERATION => Some(self.regs.config_generation),
            _ => None,
        }
    }

    fn write_register(&mut self, offset: u64, value: u32) -> bool {
        let status = self.regs.status;
        let features_open = status & VIRTIO_CONFIG_S_DRIVER != 0 && status & VIRTIO_CONFIG_S_FEATURES_OK == 0;
        let queues_open = status & VIRTIO_CONFIG_S_DRIVER_OK == 0;
        match offset {
            REG_DEVICE_FEATURES_SEL => self.regs.device_features_sel = value,
            REG_DRIVER_FEATURES_SEL => self.regs.driver_features_sel = value,
            REG_DRIVER_FEATURES if features_open => match self.regs.driver_features_sel {
                0 => {
                    self.regs.driver_features = (self.regs.driver_features & !0xffff_ffff) | u64::from(value)
                }
                1 => {
                    self.regs.driver_features =
                        (self.regs.driver_features & 0xffff_ffff) | (u64::from(value) << 32)
                }
                _ => return false,
            },
            REG_QUEUE_SEL => self.regs.queue_sel = value,
            REG_QUEUE_NUM if queues_open => {
                return self.with_idle_queue(|q| u16::try_from(value).map(|size| q.set_size(size)).is_ok())
            }
            REG_QUEUE_READY if queues_open => match self.selected_queue() {
                Some(q) => q.set_ready(value == 1),
                None => return false,
            },
            REG_QUEUE_DESC_LOW if queues_open => {
                return self.with_idle_queue(|q| {
                    q.set_desc_table_address(Some(value), None);
                    true
                })
            }
            REG_QUEUE_DESC_HIGH if queues_open => {
                return self.with_idle_queue(|q| {
                    q.set_desc_table_address(None, Some(value));
                    true
                })
            }
            REG_QUEUE_AVAIL_LOW if queues_open => {
                return self.with_idle_queue(|q| {
                    q.set_avail_ring_address(Some(value), None);
                    true
                })
            }
            REG_QUEUE_AVAIL_HIGH if queues_open => {
                return self.with_idle_queue(|q| {
                    q.set_avail_ring_address(None, Some(value));
                    true
                })
            }
            REG_QUEUE_USED_LOW if queues_open => {
                return self.with_idle_queue(|q| {
                    q.set_used_ring_address(Some(value), None);
                    true
                })
            }
            REG_QUEUE_USED_HIGH if queues_open => {
                return self.with_idle_queue(|q| {
                    q.set_used_ring_address(None, Some(value));
                    true
                })
            }
            REG_QUEUE_NOTIFY => self.kick(value as usize),
            REG_INTERRUPT_ACK => self.regs.interrupt_status &= !value,
            REG_STATUS => return self.write_status(value),
            _ => return false,
        }
        true
    }

    /// Applies `f` to the selected queue if it exists and is not ready.
    fn with_idle_queue(&mut self, f: impl FnOnce(&mut Queue) -> bool) -> bool {
        match self.selected_queue() {
            Some(q) if !q.ready() => f(q),
            _ => false,
        }
    }

    /// The status handshake; returns whether the write was accepted.
    fn write_status(&mut self, value: u32) -> bool {
        if value == 0 {
            self.reset();
            return true;
        }
        let old = self.regs.status;
        if value & old != old {
            // Bits are only cleared by a reset.
            return false;
        }
        let added = value & !old;
        let has = |bit: u32| value & bit != 0;
        let allowed = added
            & !(VIRTIO_CONFIG_S_ACKNOWLEDGE
                | VIRTIO_CONFIG_S_DRIVER
                | VIRTIO_CONFIG_S_FEATURES_OK
                | VIRTIO_CONFIG_S_DRIVER_OK
                | VIRTIO_CONFIG_S_FAILED)
            == 0
            && (!has(VIRTIO_CONFIG_S_DRIVER) || has(VIRTIO_CONFIG_S_ACKNOWLEDGE))
            && (!has(VIRTIO_CONFIG_S_FEATURES_OK) || has(VIRTIO_CONFIG_S_DRIVER))
            && (!has(VIRTIO_CONFIG_S_DRIVER_OK) || has(VIRTIO_CONFIG_S_FEATURES_OK));
        if !allowed {
            return false;
        }
        if added & VIRTIO_CONFIG_S_FEATURES_OK != 0 {
            let offered = self.device.features();
            let wanted = self.regs.driver_features;
            if wanted & !offered != 0 || wanted & FEATURE_VERSION_1 == 0 {
                // Left without FEATURES_OK (and so without DRIVER_OK, had both come in one
                // write): the driver reads it back and gives up.
                self.regs.status = value & !(VIRTIO_CONFIG_S_FEATURES_OK | VIRTIO_CONFIG_S_DRIVER_OK);
                return false;
            }
            self.device.ack_features(wanted);
            let event_idx = wanted & FEATURE_EVENT_IDX != 0;
            for q in &mut self.queues {
                q.set_event_idx(event_idx);
            }
        }
        self.regs.status = value;
        true
    }
}

fn new_queues<D: VirtioDevice>(device: &D) -> Vec<Queue> {
    device
        .queue_max_sizes()
        .iter()
        // Queue::new refuses only sizes that are zero, above 32768 or not a power of two; a
        // device offering such a size is a bug of ours, and a queue of 1 keeps it inert.
        .map(|&max| Queue::new(max).or_else(|_| Queue::new(1)))
        .collect::<Result<Vec<_>, _>>()
        .unwrap_or_default()
}

impl<D: VirtioDevice, S: GuestAddressSpace + Send> BusDevice for MmioTransport<D, S> {
    fn read(&mut self, offset: u64, data: &mut [u8]) -> Action {
        if offset >= REG_CONFIG {
            read_config_bytes(&self.device.config(), offset - REG_CONFIG, data);
            return Action::Continue;
        }
        data.fill(0);
        let value = if data.len() == 4 && offset % 4 == 0 { self.read_register(offset) } else { None };
        match value {
            Some(v) => data.copy_from_slice(&v.to_le_bytes()),
            None => self.counters.ignored_accesses += 1,
        }
        Action::Continue
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Action {
        let accepted = match <[u8; 4]>::try_from(data) {
            Ok(bytes) if offset < REG_CONFIG && offset % 4 == 0 => {
                self.write_register(offset, u32::from_le_bytes(bytes))
            }
            // The devices here have no writable configuration fields.
            _ => false,
        };
        if !accepted {
            self.counters.ignored_accesses += 1;
        }
        Action::Continue
    }
}

impl<D, S> Snapshottable for MmioTransport<D, S>
where
    D: VirtioDevice + Snapshottable<SaveCtx = NoContext, RestoreCtx = NoContext, Error = RestoreError>,
    S: GuestAddressSpace,
{
    type State = MmioState<D::State>;
    type SaveCtx = NoContext;
    type RestoreCtx = NoContext;
    type Error = RestoreError;

    fn save(&mut self, ctx: &mut NoContext) -> Result<Self::State, RestoreError> {
        Ok(MmioState {
            regs: self.regs,
            queues: self.queues.iter().map(QueueSnapshot::of).collect(),
            device: self.device.save(ctx)?,
        })
    }

    /// Restores registers, queues and the device, then raises the interrupt again if one was
    /// pending: a spurious interrupt only makes the driver look, a lost one stalls it.
    fn restore(&mut self, state: &Self::State, ctx: &NoContext) -> Result<(), RestoreError> {
        let maxima = self.device.queue_max_sizes();
        if state.queues.len() != maxima.len() {
            return Err(RestoreError::new(
                "virtio-mmio",
                format!("saved state has {} queues but the device has {}", state.queues.len(), maxima.len()),
            ));
        }
        let queues = state
            .queues
            .iter()
            .zip(maxima)
            .map(|(q, &max)| q.to_queue("virtio-mmio", max))
            .collect::<Result<Vec<_>, _>>()?;
        self.device.restore(&state.device, ctx)?;
        self.queues = queues;
        self.regs = state.regs;
        if self.regs.interrupt_status != 0 && self.interrupt.trigger().is_err() {
            self.counters.failed_interrupts += 1;
        }
        Ok(())
    }
}
