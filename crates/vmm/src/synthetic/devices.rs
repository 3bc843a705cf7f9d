//! The VM's devices as this VMM composes them: the MMIO and port I/O buses, a typed handle to
//! every device it put on them, and their saved states.
//!
//! Devices live in `branchbox-devices` (and the virtio crate) and know only how they are
//! saved, each with a state type of its own. This module is where the VMM keeps them by kind
//! and turns them into [`DeviceStates`], the devices' part of the snapshot: one list per kind
//! of device, each entry with the range the device occupies, so a restore can tell the
//! device it belongs to and refuse a snapshot of a VM built with other devices. A new kind
//! of device adds a list here (and bumps the snapshot format version).

pub use branchbox_devices::{doorbell, Action, Bus, BusDevice};

use crate::disk::DiskTransport;
use crate::error::{Error, Result};
use branchbox_devices::doorbell::{Doorbell, DoorbellState};
use branchbox_persist::{NoContext, RestoreError, Snapshottable};
use branchbox_virtio::blk::BlockState;
use branchbox_virtio::mmio::MmioState;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The saved state of one device, with the range it occupies on its bus.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Placed<S> {
    /// First address of the device's range.
    pub base: u64,
    /// Length of the device's range.
    pub len: u64,
    /// The device's own state.
    pub state: S,
}

/// Saved state of every device of a VM, one list per kind, each in the order the devices
/// were added.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DeviceStates {
    /// Doorbells on the MMIO bus.
    pub doorbells: Vec<Placed<DoorbellState>>,
    /// Disks (virtio-blk on virtio-mmio) on the MMIO bus: transport registers, the request
    /// queue and what the driver negotiated. Their contents are the snapshot's frozen disk
    /// chain (`MachineState::disk`). Since format version 4; empty when read from a version 3
    /// file.
    pub blocks: Vec<Placed<MmioState<BlockState>>>,
}

/// A device this VMM put on a bus, by its concrete type.
struct Mapped<D> {
    base: u64,
    len: u64,
    device: Arc<Mutex<D>>,
}

/// The buses of one VM and typed handles to the devices on them.
#[derive(Default)]
pub struct Devices {
    mmio: Bus,
    pio: Bus,
    doorbells: Vec<Mapped<Doorbell>>,
    blocks: Vec<Mapped<DiskTransport>>,
}

impl Devices {
    /// Puts a doorbell on the MMIO bus at `[base, base + len)`.
    pub fn add_doorbell(&mut self, base: u64, len: u64) -> Result<()> {
        let device = Arc::new(Mutex::new(Doorbell::default()));
        self.mmio.insert(base, len, device.clone())?;
        self.doorbells.push(Mapped { base, len, device });
        Ok(())
    }

    /// Puts a disk's virtio-mmio device on the MMIO bus at `[base, base + len)`.
    pub(crate) fn add_block(&mut self, base: u64, len: u64, device: Arc<Mutex<DiskTransport>>) -> Result<()> {
        self.mmio.insert(base, len, device.clone())?;
        self.blocks.push(Mapped { base, len, device });
        Ok(())
    }

    /// The MMIO bus.
    pub fn mmio(&self) -> &Bus {
        &self.mmio
    }

    /// The port I/O bus.
    pub fn pio(&self) -> &Bus {
        &self.pio
    }

    /// State of the first doorbell (times rung, last value), if the VM has one.
    pub fn doorbell(&self) -> Option<DoorbellState> {
        self.doorbells.first().map(|d| {
            let bell = lock(&d.device);
            DoorbellState { rings: bell.rings(), last: bell.last() }
        })
    }
}

/// Locks a device; one that panicked while locked is still saved as it was left.
fn lock<D>(device: &Mutex<D>) -> MutexGuard<'_, D> {
    device.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Saves every device of one kind.
fn save_kind<D>(devices: &[Mapped<D>]) -> Result<Vec<Placed<D::State>>>
where
    D: Snapshottable<SaveCtx = NoContext>,
    Error: From<D::Error>,
{
    let mut out = Vec::with_capacity(devices.len());
    for d in devices {
        let state = lock(&d.device).save(&mut NoContext)?;
        out.push(Placed { base: d.base, len: d.len, state });
    }
    Ok(out)
}

/// Checks that `states` describe exactly the devices of one kind this VM has, at the same
/// ranges, before any of them is touched.
fn check_kind<D, S>(kind: &'static str, devices: &[Mapped<D>], states: &[Placed<S>]) -> Result<()> {
    if devices.len() != states.len() {
        return Err(RestoreError::new(
            kind,
            format!("the snapshot has {} of them, this VM has {}", states.len(), devices.len()),
        )
        .into());
    }
    for (d, s) in devices.iter().zip(states) {
        if (d.base, d.len) != (s.base, s.len) {
            return Err(RestoreError::new(
                kind,
                format!(
                    "the snapshot has one at {:#x}+{:#x}, this VM has one at {:#x}+{:#x}",
                    s.base, s.len, d.base, d.len
                ),
            )
            .into());
        }
    }
    Ok(())
}

/// Restores every device of one kind (already checked by [`check_kind`]).
fn restore_kind<D>(devices: &[Mapped<D>], states: &[Placed<D::State>]) -> Result<()>
where
    D: Snapshottable<RestoreCtx = NoContext>,
    Error: From<D::Error>,
{
    for (d, s) in devices.iter().zip(states) {
        lock(&d.device).restore(&s.state, &NoContext)?;
    }
    Ok(())
}

impl Snapshottable for Devices {
    type State = DeviceStates;
    type SaveCtx = NoContext;
    type RestoreCtx = NoContext;
    type Error = Error;

    fn save(&mut self, _ctx: &mut NoContext) -> Result<DeviceStates> {
        Ok(DeviceStates { doorbells: save_kind(&self.doorbells)?, blocks: save_kind(&self.blocks)? })
    }

    /// Refuses a state for other devices than this VM's before changing any device.
    fn restore(&mut self, state: &DeviceStates, _ctx: &NoContext) -> Result<()> {
        check_kind("doorbell", &self.doorbells, &state.doorbells)?;
        check_kind("disk", &self.blocks, &state.blocks)?;
        restore_kind(&self.doorbells, &state.doorbells)?;
        restore_kind(&self.blocks, &state.blocks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placed(base: u64, rings: u64) -> Placed<DoorbellState> {
        Placed { base, len: 0x1000, state: DoorbellState { rings, last: 9 } }
    }

    #[test]
    fn device_states_round_trip_and_a_mismatch_changes_nothing() {
        let mut devices = Devices::default();
        devices.add_doorbell(0xd000_0000, 0x1000).unwrap();
        devices.mmio().write(0xd000_0000, &[5]);
        let saved = devices.save(&mut NoContext).unwrap();
        assert_eq!(
            saved.doorbells,
            vec![Placed { base: 0xd000_0000, len: 0x1000, state: DoorbellState { rings: 1, last: 5 } }]
        );

        devices
            .restore(&DeviceStates { doorbells: vec![placed(0xd000_0000, 7)], blocks: vec![] }, &NoContext)
            .unwrap();
        assert_eq!(devices.doorbell(), Some(DoorbellState { rings: 7, last: 9 }));

        let moved = DeviceStates { doorbells: vec![placed(0xe000_0000, 1)], blocks: vec![] };
        let err = devices.restore(&moved, &NoContext).unwrap_err();
        assert!(
            err.to_string().contains("cannot restore doorbell: the snapshot has one at 0xe0000000+0x1000"),
            "{err}"
        );
        let two =
            DeviceStates { doorbells: vec![placed(0xd000_0000, 1), placed(0xe000_0000, 1)], blocks: vec![] };
        let err = devices.restore(&two, &NoContext).unwrap_err();
        assert!(err.to_string().contains("the snapshot has 2 of them, this VM has 1"), "{err}");
        assert_eq!(
            devices.doorbell(),
            Some(DoorbellState { rings: 7, last: 9 }),
            "refused restores change nothing"
        );
    }
}
