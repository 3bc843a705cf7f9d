//! Running a Linux VM: one thread per vCPU until the first of them ends, then the others
//! are stopped. The run's result says why the guest ended.

use super::builder::LinuxVm;
use super::error::{LinuxError, LinuxResult};
use super::{devices, vcpu};
use crate::vstate::PauseHandle;
use std::fmt;
use std::sync::Mutex;
use vmm_sys_util::eventfd::EventFd;

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

/// Ends a running Linux VM from any thread.
#[derive(Clone)]
pub struct StopHandle(Vec<PauseHandle>);

impl StopHandle {
    pub(super) fn new(pauses: Vec<PauseHandle>) -> StopHandle {
        StopHandle(pauses)
    }

    /// Asks every vCPU to leave the guest; the run returns [`RunEnd::Stopped`] unless the
    /// guest ended first.
    pub fn stop(&self) {
        for p in &self.0 {
            p.request_pause();
        }
    }
}

impl LinuxVm {
    /// Runs the booted guest until it ends or is stopped; the first vCPU to end decides the
    /// reason and the others are stopped. The serial log is complete when this returns.
    pub fn run(mut self) -> LinuxResult<RunEnd> {
        if self.boot.is_none() {
            return Err(LinuxError::Config("boot the VM before running it".into()));
        }
        let stop = self.stop_handle();
        let first: Mutex<Option<LinuxResult<RunEnd>>> = Mutex::new(None);
        let (mmio, pio, pauses) = (&self.mmio, &self.pio, &self.pauses);
        let host_stop = EventFd::new(libc::EFD_NONBLOCK).map_err(|e| LinuxError::Device {
            what: "the vsock host thread",
            detail: format!("eventfd: {e}"),
        })?;
        let vsock = self.vsock.take();
        let spawned = std::thread::scope(|s| -> LinuxResult<()> {
            if let Some(vsock) = &vsock {
                let host_stop = &host_stop;
                std::thread::Builder::new()
                    .name("vsock-host".into())
                    .spawn_scoped(s, move || devices::serve_vsock_host(vsock, host_stop))
                    .map_err(|e| LinuxError::Device {
                        what: "the vsock host thread",
                        detail: e.to_string(),
                    })?;
            }
            for (id, fd) in self.vcpus.iter_mut().enumerate() {
                let id = id as u8;
                let (pause, stop, first, host_stop) = (&pauses[usize::from(id)], &stop, &first, &host_stop);
                let body = move || {
                    let end = vcpu::run(id, fd, pause, mmio, pio);
                    let mut slot = first.lock().unwrap_or_else(|e| e.into_inner());
                    if slot.is_none() {
                        *slot = Some(end);
                    }
                    drop(slot);
                    stop.stop();
                    // The host side has nothing to serve once a vCPU has left; a failed
                    // write leaves the thread to end with the process.
                    let _ = host_stop.write(1);
                };
                if let Err(source) =
                    std::thread::Builder::new().name(format!("vcpu{id}")).spawn_scoped(s, body)
                {
                    stop.stop();
                    return Err(LinuxError::Thread { vcpu: id, source });
                }
            }
            Ok(())
        });
        self.serial.lock().unwrap_or_else(|e| e.into_inner()).flush();
        spawned?;
        first.into_inner().unwrap_or_else(|e| e.into_inner()).unwrap_or(Ok(RunEnd::Stopped))
    }
}
