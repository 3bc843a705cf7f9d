//! The VM-wide KVM state: kvmclock, and the in-kernel PIC, IOAPIC and PIT when present.

use crate::error::{kvm, Error, Result};
use branchbox_persist::{NoContext, Snapshottable};
use kvm_bindings::{
    kvm_clock_data, kvm_irqchip, kvm_pit_config, kvm_pit_state2, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE, KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::VmFd;
use serde::{Deserialize, Serialize};

/// Saved state of the in-kernel interrupt controllers and timer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IrqchipState {
    /// Master 8259 PIC.
    pub pic_master: kvm_irqchip,
    /// Slave 8259 PIC.
    pub pic_slave: kvm_irqchip,
    /// IOAPIC.
    pub ioapic: kvm_irqchip,
    /// 8254 PIT (KVM_GET_PIT2).
    pub pit: kvm_pit_state2,
}

/// Saved VM-wide state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VmState {
    /// kvmclock (KVM_GET_CLOCK).
    pub clock: kvm_clock_data,
    /// Interrupt controllers and PIT, when the VM has them.
    pub irqchip: Option<IrqchipState>,
}

/// A KVM VM file descriptor and the VM-wide devices KVM emulates for it.
pub struct VmCore {
    fd: VmFd,
    irqchip: bool,
}

impl VmCore {
    /// Wraps a VM whose memory slots are registered; creates the in-kernel irqchip and PIT
    /// when `irqchip` is set. They must come after the slots: on this host creating them
    /// first makes registering a slot ~20x slower (see HOST.md).
    pub fn new(fd: VmFd, irqchip: bool) -> Result<VmCore> {
        if irqchip {
            fd.create_irq_chip().map_err(kvm("KVM_CREATE_IRQCHIP"))?;
            let pit = kvm_pit_config { flags: KVM_PIT_SPEAKER_DUMMY, ..Default::default() };
            fd.create_pit2(pit).map_err(kvm("KVM_CREATE_PIT2"))?;
        }
        Ok(VmCore { fd, irqchip })
    }

    /// The raw KVM VM.
    pub fn fd(&self) -> &VmFd {
        &self.fd
    }

    /// Whether the VM has the in-kernel irqchip and PIT.
    pub fn has_irqchip(&self) -> bool {
        self.irqchip
    }
}

/// Saves the VM-wide state of `fd` (`irqchip`: it has the in-kernel irqchip and PIT).
pub fn save_vm(fd: &VmFd, irqchip: bool) -> Result<VmState> {
    let get_chip = |chip_id: u32| -> Result<kvm_irqchip> {
        let mut chip = kvm_irqchip { chip_id, ..Default::default() };
        fd.get_irqchip(&mut chip).map_err(kvm("KVM_GET_IRQCHIP"))?;
        Ok(chip)
    };
    let clock = fd.get_clock().map_err(kvm("KVM_GET_CLOCK"))?;
    let irqchip = if irqchip {
        Some(IrqchipState {
            pic_master: get_chip(KVM_IRQCHIP_PIC_MASTER)?,
            pic_slave: get_chip(KVM_IRQCHIP_PIC_SLAVE)?,
            ioapic: get_chip(KVM_IRQCHIP_IOAPIC)?,
            pit: fd.get_pit2().map_err(kvm("KVM_GET_PIT2"))?,
        })
    } else {
        None
    };
    Ok(VmState { clock, irqchip })
}

/// Loads `state` into the VM `fd`, checking it names each chip where it belongs.
pub fn restore_vm(fd: &VmFd, irqchip: bool, state: &VmState) -> Result<()> {
    // Only the clock value travels: flags such as KVM_CLOCK_TSC_STABLE describe the source
    // host and KVM_SET_CLOCK rejects or misreads them here.
    let clock = kvm_clock_data { clock: state.clock.clock, ..Default::default() };
    fd.set_clock(&clock).map_err(kvm("KVM_SET_CLOCK"))?;
    match (&state.irqchip, irqchip) {
        (Some(chips), true) => {
            for (chip, id) in [
                (&chips.pic_master, KVM_IRQCHIP_PIC_MASTER),
                (&chips.pic_slave, KVM_IRQCHIP_PIC_SLAVE),
                (&chips.ioapic, KVM_IRQCHIP_IOAPIC),
            ] {
                if chip.chip_id != id {
                    return Err(Error::Config(format!(
                        "irqchip state for chip {} stored where chip {id} belongs",
                        chip.chip_id
                    )));
                }
                fd.set_irqchip(chip).map_err(kvm("KVM_SET_IRQCHIP"))?;
            }
            fd.set_pit2(&chips.pit).map_err(kvm("KVM_SET_PIT2"))?;
            Ok(())
        }
        (None, false) => Ok(()),
        _ => Err(Error::Config("snapshot and VM disagree on the in-kernel irqchip".into())),
    }
}

impl Snapshottable for VmCore {
    type State = VmState;
    type SaveCtx = NoContext;
    type RestoreCtx = NoContext;
    type Error = Error;

    fn save(&mut self, _ctx: &mut NoContext) -> Result<VmState> {
        save_vm(&self.fd, self.irqchip)
    }

    fn restore(&mut self, state: &VmState, _ctx: &NoContext) -> Result<()> {
        restore_vm(&self.fd, self.irqchip, state)
    }
}
