//! Devices the guest reaches through MMIO or port I/O exits, and the bus that routes them.
//!
//! Every device is also [`Snapshottable`](crate::snapshot::Snapshottable) with
//! [`DeviceState`] as its state, so the bus can save and restore all of them in order.

pub mod doorbell;

use crate::error::{Error, Result};
use crate::snapshot::{RestoreContext, SaveContext, Snapshottable};
use serde::{Deserialize, Serialize};

/// What the vCPU run loop does after a device handled an access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Re-enter the guest.
    Continue,
    /// Return to the VMM's caller: the device has something for it.
    Stop,
}

/// A device mapped at a range of guest-physical (MMIO) or port (PIO) addresses.
pub trait BusDevice: Snapshottable<State = DeviceState> + Send {
    /// The guest read `data.len()` bytes at `offset` into the device's range.
    fn read(&mut self, offset: u64, data: &mut [u8]) -> Action;
    /// The guest wrote `data` at `offset` into the device's range.
    fn write(&mut self, offset: u64, data: &[u8]) -> Action;
}

/// Saved state of one device on a bus; one variant per device kind.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum DeviceState {
    /// The test guest's doorbell.
    Doorbell(doorbell::DoorbellState),
}

/// Address ranges mapped to devices. Accesses nobody claims read as all ones and are
/// counted, like a bus with nothing behind it.
#[derive(Default)]
pub struct Bus {
    slots: Vec<(u64, u64, Box<dyn BusDevice>)>,
    unclaimed: u64,
}

impl Bus {
    /// Maps `device` at `[base, base + len)`; ranges must not overlap.
    pub fn insert(&mut self, base: u64, len: u64, device: Box<dyn BusDevice>) -> Result<()> {
        let end = base
            .checked_add(len)
            .ok_or_else(|| Error::Config(format!("device range {base:#x}+{len:#x} overflows")))?;
        if self.slots.iter().any(|(b, l, _)| base < b + l && *b < end) {
            return Err(Error::Config(format!("device range {base:#x}+{len:#x} overlaps another device")));
        }
        self.slots.push((base, len, device));
        Ok(())
    }

    fn find(&mut self, addr: u64) -> Option<(u64, &mut Box<dyn BusDevice>)> {
        self.slots.iter_mut().find(|(b, l, _)| addr >= *b && addr - *b < *l).map(|(b, _, d)| (addr - *b, d))
    }

    /// Routes a guest read at `addr`.
    pub fn read(&mut self, addr: u64, data: &mut [u8]) -> Action {
        match self.find(addr) {
            Some((offset, dev)) => dev.read(offset, data),
            None => {
                self.unclaimed += 1;
                data.fill(0xff);
                Action::Continue
            }
        }
    }

    /// Routes a guest write at `addr`.
    pub fn write(&mut self, addr: u64, data: &[u8]) -> Action {
        match self.find(addr) {
            Some((offset, dev)) => dev.write(offset, data),
            None => {
                self.unclaimed += 1;
                Action::Continue
            }
        }
    }

    /// Guest accesses that hit no device since this bus was built.
    pub fn unclaimed(&self) -> u64 {
        self.unclaimed
    }

    /// The device at `base`, if any.
    pub fn device_at(&mut self, base: u64) -> Option<&mut dyn BusDevice> {
        self.slots.iter_mut().find(|(b, _, _)| *b == base).map(|(_, _, d)| d.as_mut() as &mut dyn BusDevice)
    }
}

/// Saved state of a whole bus: each device's range and state, in insertion order.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct BusState {
    /// `(base, len, state)` of every device.
    pub devices: Vec<(u64, u64, DeviceState)>,
}

impl Snapshottable for Bus {
    type State = BusState;

    fn save(&mut self, ctx: &mut SaveContext) -> Result<BusState> {
        let mut devices = Vec::with_capacity(self.slots.len());
        for (base, len, dev) in &mut self.slots {
            devices.push((*base, *len, dev.save(ctx)?));
        }
        Ok(BusState { devices })
    }

    fn restore(&mut self, state: &BusState, ctx: &RestoreContext) -> Result<()> {
        if state.devices.len() != self.slots.len() {
            return Err(Error::Config(format!(
                "snapshot has {} devices on this bus, the VM has {}",
                state.devices.len(),
                self.slots.len()
            )));
        }
        for ((base, len, dev), (sbase, slen, sstate)) in self.slots.iter_mut().zip(&state.devices) {
            if (*base, *len) != (*sbase, *slen) {
                return Err(Error::Config(format!(
                    "snapshot has a device at {sbase:#x}+{slen:#x}, the VM has one at \
                     {base:#x}+{len:#x}"
                )));
            }
            dev.restore(sstate, ctx)?;
        }
        Ok(())
    }
}
