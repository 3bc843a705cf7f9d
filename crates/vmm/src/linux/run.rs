//! Running a Linux VM: one thread per vCPU until the first of them ends, then the others
//! are stopped. The run's result says why the guest ended.

use super::builder::LinuxVm;
use super::end::RunEnd;
use super::error::{LinuxError, LinuxResult};
use super::{devices, vcpu};
use crate::seccomp::ThreadKind;
use std::sync::Mutex;
use vmm_sys_util::eventfd::EventFd;

impl LinuxVm {
    /// Runs the booted guest until it ends or is stopped; the first vCPU to end decides the
    /// reason and the others are stopped. The serial log is complete when this returns.
    pub fn run(self) -> LinuxResult<RunEnd> {
        if self.boot.is_none() && !self.restored {
            return Err(LinuxError::Config("boot or restore the VM before running it".into()));
        }
        let stop = self.stop_handle();
        let first: Mutex<Option<LinuxResult<RunEnd>>> = Mutex::new(None);
        let (mmio, pio, pauses, hold) = (&self.mmio, &self.pio, &self.pauses, &self.hold);
        let host_stop = EventFd::new(libc::EFD_NONBLOCK).map_err(|e| LinuxError::Device {
            what: "the devices' host thread",
            detail: format!("eventfd: {e}"),
        })?;
        let host_sides = self.host_sides();
        // vCPU threads confine themselves to the vCPU system calls; with virtio devices
        // attached, their queues are served on the vCPU thread at each notification, so those
        // threads also get the device thread's file and Unix-socket calls.
        let confine =
            if self.mmio.ranges().next().is_none() { ThreadKind::Vcpu } else { ThreadKind::VcpuDevices };
        let record = |first: &Mutex<Option<LinuxResult<RunEnd>>>, end: LinuxResult<RunEnd>| {
            let mut slot = first.lock().unwrap_or_else(|e| e.into_inner());
            if slot.is_none() {
                *slot = Some(end);
            }
        };
        let spawned = std::thread::scope(|s| -> LinuxResult<()> {
            if !host_sides.is_empty() {
                let (host_sides, host_stop, stop, first) = (&host_sides, &host_stop, &stop, &first);
                let body = move || {
                    if let Err(e) = devices::serve_host_sides(host_sides, host_stop) {
                        record(first, Err(e));
                        stop.stop();
                    }
                };
                std::thread::Builder::new().name("device-host".into()).spawn_scoped(s, body).map_err(
                    |e| LinuxError::Device { what: "the devices' host thread", detail: e.to_string() },
                )?;
            }
            for (id, fd) in self.vcpus.iter().enumerate() {
                let id = id as u8;
                let (pause, stop, first, host_stop) = (&pauses[usize::from(id)], &stop, &first, &host_stop);
                let body = move || {
                    let end = vcpu::run(id, fd, pause, hold, mmio, pio, confine);
                    record(first, end);
                    stop.stop();
                    // The host side has nothing to serve once a vCPU has left; a failed
                    // write leaves the thread to end with the process.
                    let _ = host_stop.write(1);
                };
                if let Err(error) =
                    std::thread::Builder::new().name(format!("vcpu{id}")).spawn_scoped(s, body)
                {
                    stop.stop();
                    return Err(LinuxError::Thread { vcpu: id, error });
                }
            }
            Ok(())
        });
        self.serial.lock().unwrap_or_else(|e| e.into_inner()).flush();
        spawned?;
        first.into_inner().unwrap_or_else(|e| e.into_inner()).unwrap_or(Ok(RunEnd::Stopped))
    }
}
