//! VMGenID: a 16-byte generation id in a guest page that the guest kernel reads through the
//! ACPI `VM_Gen_Counter` device (the DSDT, built by `branchbox-arch`, points its `ADDR` at
//! the page). When the id changes and the device's interrupt arrives, Linux mixes the new id
//! into its random pool, so a restored or forked guest does not repeat its parent's
//! randomness.
//!
//! This is not a virtio device: it has no queues and no registers. The VMM builds it at the
//! address the DSDT names and calls [`VmGenId::regenerate`] on every fork; a restore does
//! that by itself, since a restored guest is by definition a new generation.

use branchbox_persist::{NoContext, RestoreError, Snapshottable};
use serde::{Deserialize, Serialize};
use vm_memory::{Bytes, GuestAddress, GuestAddressSpace, GuestMemory, Permissions};

use crate::mmio::Interrupt;
use crate::rng::fill_random;

/// Bytes of the generation id.
pub const ID_LEN: usize = 16;

/// Why the generation id cannot be placed or changed.
#[derive(Debug, thiserror::Error)]
pub enum VmGenIdError {
    /// The address is not 8-byte aligned or the id would not lie in guest memory.
    #[error(
        "VMGenID address {0:#x} must be 8-byte aligned with 16 bytes of guest memory behind \
         it; use the address the DSDT names (branchbox_arch::layout::VMGENID_ADDR)"
    )]
    BadAddress(u64),
    /// The host's random source failed.
    #[error("cannot draw a new generation id from getrandom: {0}")]
    Random(std::io::Error),
    /// Guest memory refused the write.
    #[error("cannot write the generation id at {0:#x}")]
    Write(u64),
}

/// The VMGenID device.
pub struct VmGenId<S: GuestAddressSpace> {
    mem: S,
    addr: GuestAddress,
    id: [u8; ID_LEN],
    interrupt: Box<dyn Interrupt>,
}

/// Saved state: where the id lives and its value when saved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmGenIdState {
    /// Guest address of the id.
    pub addr: u64,
    /// The id when saved.
    pub id: [u8; ID_LEN],
}

impl<S: GuestAddressSpace> VmGenId<S> {
    /// Places a fresh generation id at `addr` in `mem`; `interrupt` is the line the DSDT's
    /// notification is wired to.
    pub fn new(mem: S, addr: GuestAddress, interrupt: Box<dyn Interrupt>) -> Result<Self, VmGenIdError> {
        if addr.0 % 8 != 0 || !mem.memory().check_range(addr, ID_LEN, Permissions::Write) {
            return Err(VmGenIdError::BadAddress(addr.0));
        }
        let mut dev = VmGenId { mem, addr, id: [0; ID_LEN], interrupt };
        dev.write_new_id()?;
        Ok(dev)
    }

    /// The current generation id.
    pub fn generation_id(&self) -> [u8; ID_LEN] {
        self.id
    }

    /// Starts a new generation (on fork): writes a new id and raises the interrupt.
    pub fn regenerate(&mut self) -> Result<(), VmGenIdError> {
        self.write_new_id()?;
        // A lost interrupt only delays the reseed to the guest's next look at the id.
        let _ = self.interrupt.trigger();
        Ok(())
    }

    fn write_new_id(&mut self) -> Result<(), VmGenIdError> {
        let mut id = [0u8; ID_LEN];
        fill_random(&mut id).map_err(VmGenIdError::Random)?;
        self.mem.memory().write_slice(&id, self.addr).map_err(|_| VmGenIdError::Write(self.addr.0))?;
        self.id = id;
        Ok(())
    }
}

impl<S: GuestAddressSpace + Send> Snapshottable for VmGenId<S> {
    type State = VmGenIdState;
    type SaveCtx = NoContext;
    type RestoreCtx = NoContext;
    type Error = RestoreError;

    fn save(&mut self, _ctx: &mut NoContext) -> Result<VmGenIdState, RestoreError> {
        Ok(VmGenIdState { addr: self.addr.0, id: self.id })
    }

    /// Checks the saved address matches, then starts a new generation.
    fn restore(&mut self, state: &VmGenIdState, _ctx: &NoContext) -> Result<(), RestoreError> {
        if state.addr != self.addr.0 {
            return Err(RestoreError::new(
                "vmgenid",
                format!(
                    "saved id address {:#x} differs from this VM's {:#x}: the guest's ACPI \
                     tables name the saved one",
                    state.addr, self.addr.0
                ),
            ));
        }
        self.regenerate().map_err(|e| RestoreError::new("vmgenid", e.to_string()))
    }
}
