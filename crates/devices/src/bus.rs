//! The bus: address ranges mapped to devices.

use crate::{Action, BusDevice};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Why a device cannot be mapped where it was asked to be.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    /// The range is empty or runs past the end of the address space.
    #[error("device range {base:#x}+{len:#x} is empty or overflows the address space; give a length of at least 1 that ends below 2^64")]
    BadRange {
        /// Requested start.
        base: u64,
        /// Requested length.
        len: u64,
    },
    /// The range overlaps a device already on the bus.
    #[error("device range {base:#x}+{len:#x} overlaps the device at {other_base:#x}+{other_len:#x}; move one of them")]
    Overlap {
        /// Requested start.
        base: u64,
        /// Requested length.
        len: u64,
        /// Start of the device already there.
        other_base: u64,
        /// Length of the device already there.
        other_len: u64,
    },
}

/// One mapped device.
#[derive(Clone)]
struct Slot {
    len: u64,
    device: Arc<Mutex<dyn BusDevice>>,
}

/// Address ranges mapped to devices. Accesses nobody claims read as all ones and are
/// counted, like a bus with nothing behind it.
///
/// Build it once, then clone it for each vCPU thread: clones share the devices and the
/// count of unclaimed accesses (a device inserted after cloning is seen only by the bus it
/// was inserted into). Each device sits behind its own mutex, so the VMM's device thread and
/// the vCPU threads can reach the same device.
#[derive(Clone, Default)]
pub struct Bus {
    /// Slots by base address; ranges never overlap.
    slots: BTreeMap<u64, Slot>,
    unclaimed: Arc<AtomicU64>,
}

impl Bus {
    /// Maps `device` at `[base, base + len)`; ranges must not overlap.
    pub fn insert(&mut self, base: u64, len: u64, device: Arc<Mutex<dyn BusDevice>>) -> Result<(), BusError> {
        let end = base.checked_add(len).filter(|_| len > 0).ok_or(BusError::BadRange { base, len })?;
        // The only candidates for overlap: the last slot starting below `end`.
        if let Some((&other_base, other)) = self.slots.range(..end).next_back() {
            if other_base + other.len > base {
                return Err(BusError::Overlap { base, len, other_base, other_len: other.len });
            }
        }
        self.slots.insert(base, Slot { len, device });
        Ok(())
    }

    fn find(&self, addr: u64) -> Option<(u64, &Slot)> {
        let (&base, slot) = self.slots.range(..=addr).next_back()?;
        let offset = addr - base;
        (offset < slot.len).then_some((offset, slot))
    }

    /// Routes a guest read at `addr`.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> Action {
        match self.find(addr) {
            Some((offset, slot)) => lock(&slot.device).read(offset, data),
            None => {
                self.unclaimed.fetch_add(1, Ordering::Relaxed);
                data.fill(0xff);
                Action::Continue
            }
        }
    }

    /// Routes a guest write at `addr`.
    pub fn write(&self, addr: u64, data: &[u8]) -> Action {
        match self.find(addr) {
            Some((offset, slot)) => lock(&slot.device).write(offset, data),
            None => {
                self.unclaimed.fetch_add(1, Ordering::Relaxed);
                Action::Continue
            }
        }
    }

    /// Guest accesses that hit no device since this bus (or the bus it was cloned from) was
    /// built.
    pub fn unclaimed(&self) -> u64 {
        self.unclaimed.load(Ordering::Relaxed)
    }

    /// The mapped ranges, `(base, len)`, in address order.
    pub fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.slots.iter().map(|(&base, slot)| (base, slot.len))
    }
}

/// Locks a device. A device that panicked while locked (a bug, reported where it happened)
/// left its state as it was; the bus keeps serving it rather than panicking again on every
/// later access.
fn lock<'a>(device: &'a Mutex<dyn BusDevice>) -> MutexGuard<'a, dyn BusDevice + 'static> {
    device.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records the last access; a write at offset 4 stops the run loop.
    #[derive(Default)]
    struct Probe {
        last: Option<(u64, Vec<u8>)>,
    }

    impl BusDevice for Probe {
        fn read(&mut self, offset: u64, data: &mut [u8]) -> Action {
            data.fill(offset as u8);
            Action::Continue
        }

        fn write(&mut self, offset: u64, data: &[u8]) -> Action {
            self.last = Some((offset, data.to_vec()));
            if offset == 4 {
                Action::Stop
            } else {
                Action::Continue
            }
        }
    }

    #[test]
    fn accesses_reach_the_device_at_their_offset_and_unclaimed_ones_read_all_ones() {
        let probe = Arc::new(Mutex::new(Probe::default()));
        let mut bus = Bus::default();
        bus.insert(0x1000, 0x10, probe.clone()).unwrap();
        let mut data = [0u8; 2];
        assert_eq!(bus.read(0x1003, &mut data), Action::Continue);
        assert_eq!(data, [3, 3]);
        assert_eq!(bus.write(0x1004, &[7]), Action::Stop);
        assert_eq!(probe.lock().unwrap().last, Some((4, vec![7])));
        assert_eq!(bus.read(0x1010, &mut data), Action::Continue, "one past the end");
        assert_eq!(data, [0xff, 0xff]);
        assert_eq!(bus.write(0xfff, &[1]), Action::Continue, "one before the start");
        let clone = bus.clone();
        assert_eq!(clone.unclaimed(), 2, "clones share the count");
        assert_eq!(bus.ranges().collect::<Vec<_>>(), vec![(0x1000, 0x10)]);
    }

    #[test]
    fn overlapping_empty_and_overflowing_ranges_are_refused() {
        let mut bus = Bus::default();
        bus.insert(0x1000, 0x1000, Arc::new(Mutex::new(Probe::default()))).unwrap();
        let dev = || Arc::new(Mutex::new(Probe::default()));
        for (base, len) in [(0x1fff, 1), (0x800, 0x801), (0x0, u64::MAX), (0x1800, 0x10)] {
            assert_eq!(
                bus.insert(base, len, dev()),
                Err(BusError::Overlap { base, len, other_base: 0x1000, other_len: 0x1000 }),
                "{base:#x}+{len:#x}"
            );
        }
        assert_eq!(bus.insert(0x5000, 0, dev()), Err(BusError::BadRange { base: 0x5000, len: 0 }));
        assert_eq!(bus.insert(u64::MAX, 2, dev()), Err(BusError::BadRange { base: u64::MAX, len: 2 }));
        bus.insert(0x800, 0x800, dev()).unwrap();
        bus.insert(0x2000, 1, dev()).unwrap();
        assert_eq!(bus.ranges().count(), 3, "adjacent ranges fit");
    }

    #[test]
    fn a_device_that_panicked_keeps_being_served() {
        let probe = Arc::new(Mutex::new(Probe::default()));
        let mut bus = Bus::default();
        bus.insert(0, 8, probe.clone()).unwrap();
        let p = probe.clone();
        let _ = std::thread::spawn(move || {
            let _guard = p.lock().unwrap();
            panic!("device bug");
        })
        .join();
        assert!(probe.is_poisoned());
        assert_eq!(bus.write(4, &[1]), Action::Stop);
    }
}
