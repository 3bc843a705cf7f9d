//! The doorbell: a one-page MMIO device the test guest writes to when it has an answer.
//!
//! A guest write stops the run loop so the host can read the guest's mailbox; the device
//! remembers how often it rang and the last value, which a snapshot carries along.

use super::{Action, BusDevice, DeviceState};
use crate::error::Result;
use crate::snapshot::{RestoreContext, SaveContext, Snapshottable};
use serde::{Deserialize, Serialize};

/// Guest-physical address of the doorbell page, above any RAM this VMM gives a guest.
pub const DOORBELL_BASE: u64 = 0xD000_0000;
/// Size of the doorbell's MMIO range.
pub const DOORBELL_LEN: u64 = 0x1000;

/// Saved state of a [`Doorbell`].
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DoorbellState {
    /// Times the guest rang.
    pub rings: u64,
    /// Value of the last ring (up to 8 bytes, little-endian).
    pub last: u64,
}

/// The doorbell device.
#[derive(Debug, Default)]
pub struct Doorbell {
    state: DoorbellState,
}

impl Doorbell {
    /// Times the guest rang so far.
    pub fn rings(&self) -> u64 {
        self.state.rings
    }

    /// Value of the last ring.
    pub fn last(&self) -> u64 {
        self.state.last
    }
}

impl BusDevice for Doorbell {
    fn read(&mut self, _offset: u64, data: &mut [u8]) -> Action {
        let bytes = self.state.rings.to_le_bytes();
        for (d, s) in data.iter_mut().zip(bytes.iter().chain(std::iter::repeat(&0))) {
            *d = *s;
        }
        Action::Continue
    }

    fn write(&mut self, _offset: u64, data: &[u8]) -> Action {
        let mut bytes = [0u8; 8];
        for (d, s) in bytes.iter_mut().zip(data) {
            *d = *s;
        }
        self.state.rings += 1;
        self.state.last = u64::from_le_bytes(bytes);
        Action::Stop
    }
}

impl Snapshottable for Doorbell {
    type State = DeviceState;

    fn save(&mut self, _ctx: &mut SaveContext) -> Result<DeviceState> {
        Ok(DeviceState::Doorbell(self.state))
    }

    fn restore(&mut self, state: &DeviceState, _ctx: &RestoreContext) -> Result<()> {
        match state {
            DeviceState::Doorbell(s) => {
                self.state = *s;
                Ok(())
            }
        }
    }
}
