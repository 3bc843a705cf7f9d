//! Ending a Linux guest's run from another thread.

use crate::vstate::PauseHandle;

/// Ends a running Linux VM from any thread.
#[derive(Clone)]
pub struct StopHandle(Vec<PauseHandle>);

impl StopHandle {
    pub(super) fn new(pauses: Vec<PauseHandle>) -> StopHandle {
        StopHandle(pauses)
    }

    /// Asks every vCPU to leave the guest; the run returns [`RunEnd::Stopped`](super::RunEnd::Stopped) unless the
    /// guest ended first.
    pub fn stop(&self) {
        for p in &self.0 {
            p.request_pause();
        }
    }
}
