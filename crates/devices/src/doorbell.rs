//! The doorbell: a one-page MMIO device the test guest writes to when it has an answer.
//!
//! A guest write stops the run loop so the host can read the guest's mailbox; the device
//! remembers how often it rang and the last value, which a snapshot carries along.

use crate::{Action, BusDevice};
use branchbox_persist::{NoContext, RestoreError, Snapshottable};
use serde::{Deserialize, Serialize};

/// Guest-physical address of the doorbell page, above any RAM the test guest is given.
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
        self.state.rings = self.state.rings.wrapping_add(1);
        self.state.last = u64::from_le_bytes(bytes);
        Action::Stop
    }
}

impl Snapshottable for Doorbell {
    type State = DoorbellState;
    type SaveCtx = NoContext;
    type RestoreCtx = NoContext;
    type Error = RestoreError;

    fn save(&mut self, _ctx: &mut NoContext) -> Result<DoorbellState, RestoreError> {
        Ok(self.state)
    }

    fn restore(&mut self, state: &DoorbellState, _ctx: &NoContext) -> Result<(), RestoreError> {
        self.state = *state;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_are_counted_read_back_and_survive_save_and_restore() {
        let mut bell = Doorbell::default();
        assert_eq!(bell.write(0, &[0x34, 0x12]), Action::Stop);
        assert_eq!(bell.write(0, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]), Action::Stop, "longer than 8 bytes");
        let mut out = [0u8; 10];
        assert_eq!(bell.read(0, &mut out), Action::Continue);
        assert_eq!(out, [2, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        let saved = bell.save(&mut NoContext).unwrap();
        assert_eq!(saved, DoorbellState { rings: 2, last: 0x0807_0605_0403_0201 });
        let mut other = Doorbell::default();
        other.restore(&saved, &NoContext).unwrap();
        assert_eq!((other.rings(), other.last()), (2, 0x0807_0605_0403_0201));
    }
}
