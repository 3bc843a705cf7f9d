//! Why a Linux guest's run ended.

use std::fmt;

/// Why a guest's run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEnd {
    /// The guest asked for a reset (i8042 command 0xFE, or KVM's reset event).
    Reset { vcpu: u8 },
    /// The guest powered off (KVM's shutdown system event).
    PowerOff { vcpu: u8 },
    /// KVM_EXIT_SHUTDOWN: a triple fault, an exception the guest could not handle.
    TripleFault { vcpu: u8 },
    /// The vCPU halted with nothing to wake it (no in-kernel irqchip handled it).
    Halted { vcpu: u8 },
    /// KVM gave up on the guest; `suberror` 1 is an instruction it could not emulate, whose
    /// bytes are `insn` when KVM reported them.
    InternalError { vcpu: u8, suberror: u32, rip: u64, insn: Vec<u8> },
    /// The hardware refused to enter the guest.
    EntryFailure { vcpu: u8, reason: u64 },
    /// An exit this VMM does not handle.
    UnexpectedExit { vcpu: u8, exit: String },
    /// A [`StopHandle`] ended the run, or a device asked to return to the caller.
    Stopped,
}

impl fmt::Display for RunEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunEnd::Reset { vcpu } => write!(f, "vCPU {vcpu}: the guest asked for a reset"),
            RunEnd::PowerOff { vcpu } => write!(f, "vCPU {vcpu}: the guest powered off"),
            RunEnd::TripleFault { vcpu } => {
                write!(
                    f,
                    "vCPU {vcpu}: shutdown (triple fault: the guest took an exception it cannot handle)"
                )
            }
            RunEnd::Halted { vcpu } => write!(f, "vCPU {vcpu} halted"),
            RunEnd::InternalError { vcpu, suberror, rip, insn } => {
                write!(f, "vCPU {vcpu}: KVM internal error {suberror}")?;
                if *suberror == 1 {
                    write!(f, " (emulation failure)")?;
                }
                write!(f, " at rip {rip:#x}")?;
                if !insn.is_empty() {
                    write!(f, ", instruction bytes")?;
                    for b in insn {
                        write!(f, " {b:02x}")?;
                    }
                }
                Ok(())
            }
            RunEnd::EntryFailure { vcpu, reason } => {
                write!(f, "vCPU {vcpu}: VM entry failed (hardware reason {reason:#x})")
            }
            RunEnd::UnexpectedExit { vcpu, exit } => write!(f, "vCPU {vcpu}: unhandled exit {exit}"),
            RunEnd::Stopped => write!(f, "stopped by the VMM"),
        }
    }
}
