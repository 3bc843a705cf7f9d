//! The persistence contract of the microVM: one trait that every stateful part implements
//! (vCPUs, VM-wide KVM state, guest RAM, every device), and the error parts report when a
//! saved state cannot be put back.
//!
//! This crate imports nothing else from the workspace on purpose. Devices depend on it to say
//! how they are saved; the snapshot format (in `branchbox-vmm`) depends on the devices to know
//! what it holds. Never the reverse: a device never learns where or how its state is stored.

use std::fmt;

/// A part of a VM whose state a snapshot must carry.
///
/// Both methods are required: a part that forgot to save its state would otherwise compile
/// and silently lose it on restore. What a part needs from outside to save or restore (the
/// snapshot directory, the memory layers, guest memory for a device's queues) is its own
/// context type; a part that needs nothing uses [`NoContext`].
pub trait Snapshottable {
    /// The part's saved state: plain data, serialisable by the snapshot format.
    type State;
    /// What saving needs from outside.
    type SaveCtx: ?Sized;
    /// What restoring needs from outside.
    type RestoreCtx: ?Sized;
    /// The error a save or restore reports.
    type Error;

    /// Captures the part's state; the VM is paused and no request is in flight.
    fn save(&mut self, ctx: &mut Self::SaveCtx) -> Result<Self::State, Self::Error>;
    /// Puts the part back into `state`; the VM has not run since the part was built.
    fn restore(&mut self, state: &Self::State, ctx: &Self::RestoreCtx) -> Result<(), Self::Error>;
}

/// The context of a part that needs nothing from outside to be saved or restored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NoContext;

/// Why a saved state cannot be put back into a part. Saved states come from files a user may
/// have moved or edited, so a restore checks what it is given and says what does not fit.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub struct RestoreError {
    /// The part that refused, for example `virtio-blk` or `serial`.
    pub part: &'static str,
    /// What did not fit, for example `queue 0 size 512 exceeds the maximum 256`.
    pub detail: String,
}

impl RestoreError {
    /// A refusal by `part`, saying `detail`.
    pub fn new(part: &'static str, detail: impl Into<String>) -> RestoreError {
        RestoreError { part, detail: detail.into() }
    }
}

impl fmt::Display for RestoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot restore {}: {}", self.part, self.detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Counter(u32);

    impl Snapshottable for Counter {
        type State = u32;
        type SaveCtx = NoContext;
        type RestoreCtx = NoContext;
        type Error = RestoreError;

        fn save(&mut self, _ctx: &mut NoContext) -> Result<u32, RestoreError> {
            Ok(self.0)
        }

        fn restore(&mut self, state: &u32, _ctx: &NoContext) -> Result<(), RestoreError> {
            if *state > 100 {
                return Err(RestoreError::new("counter", format!("{state} exceeds 100")));
            }
            self.0 = *state;
            Ok(())
        }
    }

    #[test]
    fn a_part_round_trips_and_refuses_what_does_not_fit() {
        let mut c = Counter(7);
        let saved = c.save(&mut NoContext).unwrap();
        let mut d = Counter(0);
        d.restore(&saved, &NoContext).unwrap();
        assert_eq!(d.0, 7);
        let err = d.restore(&101, &NoContext).unwrap_err();
        assert_eq!(err.to_string(), "cannot restore counter: 101 exceeds 100");
        assert_eq!(d.0, 7, "a refused restore leaves the part as it was");
    }
}
