//! Ending or pausing a Linux guest's run from another thread.

use crate::vstate::PauseHandle;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct HoldState {
    /// vCPUs that take a pause request park instead of ending the run.
    held: bool,
    /// The run is ending: parked vCPUs leave, and none parks again.
    stopping: bool,
    /// vCPUs parked now.
    parked: usize,
}

/// What the vCPUs of one run share to be held out of the guest (a pause) and let back in,
/// without ending the run.
#[derive(Clone, Default)]
pub(super) struct Hold(Arc<(Mutex<HoldState>, Condvar)>);

impl Hold {
    fn state(&self) -> std::sync::MutexGuard<'_, HoldState> {
        self.0 .0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Called by a vCPU that took a pause request: parks while the guest is held. True when
    /// the vCPU goes back into the guest, false when its run is to end. Only a stop ends it:
    /// a request left over from a pause that gave up is not one.
    pub(super) fn park(&self) -> bool {
        let mut s = self.state();
        if s.stopping {
            return false;
        }
        s.parked += 1;
        self.0 .1.notify_all();
        while s.held && !s.stopping {
            s = self.0 .1.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.parked -= 1;
        !s.stopping
    }
}

/// Ends or pauses a running Linux VM from any thread.
#[derive(Clone)]
pub struct StopHandle {
    pauses: Vec<PauseHandle>,
    hold: Hold,
}

impl StopHandle {
    pub(super) fn new(pauses: Vec<PauseHandle>, hold: Hold) -> StopHandle {
        StopHandle { pauses, hold }
    }

    /// Asks every vCPU to leave the guest; the run returns [`RunEnd::Stopped`](super::RunEnd::Stopped) unless the
    /// guest ended first. A paused guest's vCPUs leave too.
    pub fn stop(&self) {
        {
            let mut s = self.hold.state();
            s.stopping = true;
            self.hold.0 .1.notify_all();
        }
        for p in &self.pauses {
            p.request_pause();
        }
    }

    /// Holds every vCPU out of the guest, keeping the run (and its devices) alive; returns
    /// once all of them are parked, or the run is ending. `patience` bounds the wait for a
    /// vCPU busy in a device access; past it the guest is let back in and this says so.
    pub fn pause(&self, patience: Duration) -> Result<(), String> {
        self.hold.state().held = true;
        for p in &self.pauses {
            p.request_pause();
        }
        let deadline = Instant::now() + patience;
        let mut s = self.hold.state();
        while s.parked < self.pauses.len() && !s.stopping {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                s.held = false;
                self.hold.0 .1.notify_all();
                return Err(format!(
                    "{} of {} vCPUs left the guest within {patience:?}; the guest runs on",
                    s.parked,
                    self.pauses.len()
                ));
            }
            s = self.hold.0 .1.wait_timeout(s, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        if s.stopping {
            return Err("the guest's run is ending".into());
        }
        Ok(())
    }

    /// Whether every vCPU is parked out of the guest and the run is not ending: what a
    /// snapshot needs.
    pub fn is_paused(&self) -> bool {
        let s = self.hold.state();
        s.held && !s.stopping && s.parked == self.pauses.len()
    }

    /// Holds the guest from its first instruction: called before the run starts, every
    /// vCPU parks before entering the guest ([`pause`](Self::pause) then waits for that).
    pub fn hold_at_start(&self) {
        self.hold.state().held = true;
        for p in &self.pauses {
            p.request_pause();
        }
    }

    /// Lets a paused guest's vCPUs back in.
    pub fn resume(&self) {
        self.hold.state().held = false;
        self.hold.0 .1.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Holds the vCPUs and parks one on another thread; returns once it is parked.
    fn park_held(hold: &Hold) -> std::thread::JoinHandle<bool> {
        hold.state().held = true;
        let parked = std::thread::spawn({
            let hold = hold.clone();
            move || hold.park()
        });
        while hold.state().parked == 0 {
            std::thread::yield_now();
        }
        parked
    }

    #[test]
    fn only_a_stop_ends_a_parked_or_kicked_vcpu() {
        let hold = Hold::default();
        let handle = StopHandle::new(Vec::new(), hold.clone());
        // A kick left over from a pause that gave up sends the vCPU back into the guest.
        assert!(hold.park());
        // Held, the vCPU waits; the stop wakes it and ends its run.
        let parked = park_held(&hold);
        handle.stop();
        assert!(!parked.join().unwrap());
        assert!(!hold.park(), "after a stop no vCPU goes back in");
        assert!(handle.pause(Duration::from_secs(1)).is_err(), "a stopped run cannot be paused");
    }

    #[test]
    fn a_resumed_vcpu_goes_back_into_the_guest() {
        let hold = Hold::default();
        let handle = StopHandle::new(Vec::new(), hold.clone());
        let parked = park_held(&hold);
        handle.resume();
        assert!(parked.join().unwrap());
        assert_eq!(hold.state().parked, 0);
    }
}
