//! The i8042 keyboard controller, kept for one thing: the CPU reset a guest asks for by
//! writing 0xFE to port 0x64 (Linux's `reboot=k`, its fallback when ACPI has no reset).

use crate::{Action, BusDevice};
use branchbox_persist::{NoContext, RestoreError, Snapshottable};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use vm_superio::{I8042Device, Trigger};

/// Notes that the guest asked for a reset, for the write that asked to report it.
#[derive(Default)]
struct ResetRequest(AtomicBool);

impl Trigger for ResetRequest {
    type E = std::convert::Infallible;

    fn trigger(&self) -> Result<(), Self::E> {
        self.0.store(true, Ordering::Relaxed);
        Ok(())
    }
}

/// Saved state of an [`I8042`]: the controller holds no state between accesses.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct I8042State {}

/// The controller at ports 0x60-0x64.
pub struct I8042 {
    dev: I8042Device<ResetRequest>,
}

impl Default for I8042 {
    fn default() -> Self {
        I8042 { dev: I8042Device::new(ResetRequest::default()) }
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, offset: u64, data: &mut [u8]) -> Action {
        let value = u8::try_from(offset).map(|o| self.dev.read(o)).unwrap_or(0xff);
        data.fill(value);
        Action::Continue
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Action {
        if let (Ok(off), [value]) = (u8::try_from(offset), data) {
            let Ok(()) = self.dev.write(off, *value);
            if self.dev.reset_evt().0.swap(false, Ordering::Relaxed) {
                return Action::Reset;
            }
        }
        Action::Continue
    }
}

impl Snapshottable for I8042 {
    type State = I8042State;
    type SaveCtx = NoContext;
    type RestoreCtx = NoContext;
    type Error = RestoreError;

    fn save(&mut self, _ctx: &mut NoContext) -> Result<I8042State, RestoreError> {
        Ok(I8042State {})
    }

    fn restore(&mut self, _state: &I8042State, _ctx: &NoContext) -> Result<(), RestoreError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_fe_on_port_64_resets_the_cpu() {
        let mut k = I8042::default();
        assert_eq!(k.write(4, &[0xfe]), Action::Reset);
        assert_eq!(k.write(4, &[0xfe]), Action::Reset, "every request is reported");
    }

    #[test]
    fn other_writes_and_reads_do_nothing() {
        let mut k = I8042::default();
        assert_eq!(k.write(0, &[0xfe]), Action::Continue, "0xFE on the data port is not a reset");
        assert_eq!(k.write(4, &[0xd1]), Action::Continue);
        assert_eq!(k.write(4, &[0xfe, 0x00]), Action::Continue, "only byte writes count");
        let mut status = [0xaa];
        k.read(4, &mut status);
        assert_eq!(status, [0], "input buffer empty: a guest waiting to send a command goes on");
        let mut far = [0u8; 2];
        k.read(u64::MAX, &mut far);
        assert_eq!(far, [0xff, 0xff]);
    }
}
