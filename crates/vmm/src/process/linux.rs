//! A Linux guest inside a VMM process: booted by [`Request::BootLinux`](super::protocol::Request)
//! with the sandbox's disk, vsock and serial log, run on its own threads while the control
//! thread keeps answering, and reported by `Status` once it ends.

use super::protocol::{BootLinux, RestoreLinux};
use crate::hypervisor::Hypervisor;
use crate::linux::{
    LinuxError, LinuxRestore, LinuxResult, LinuxVm, LinuxVmConfig, RunEnd, Saved, Snapshotter, StopHandle,
    DEFAULT_SERIAL_LOG_CAP,
};
use branchbox_disk::{LayeredBackend, Store};
use branchbox_virtio::net::GUEST_MAC;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The VMM's own part of a Linux guest's command line: the root disk is the first virtio
/// block device, the console the serial port, PID 1 the agent, and there is no PCI bus.
const BASE_CMDLINE: &str = "root=/dev/vda rw console=ttyS0 init=/sbin/init pci=off";

/// The guest's vsock CID (one guest per process, so every guest has the same one).
const GUEST_CID: u64 = 3;

/// Longest a pause waits for the vCPUs to leave the guest (they leave at once unless one is
/// inside a device access, which is short).
const PAUSE_PATIENCE: Duration = Duration::from_secs(10);

/// A booted Linux guest and the thread running it.
pub(super) struct LinuxGuest {
    stop: StopHandle,
    snapshotter: Snapshotter,
    run: Option<JoinHandle<LinuxResult<RunEnd>>>,
    end: Option<String>,
}

fn missing(what: &str, path: &std::path::Path) -> String {
    format!("the {what} {} does not exist or is not a file", path.display())
}

impl LinuxGuest {
    /// Builds the VM `boot` describes (block, vsock, rng, and net for a networked sandbox),
    /// boots it and starts running it.
    /// The error says what could not be built.
    pub(super) fn boot(hv: &Arc<Hypervisor>, boot: &BootLinux) -> Result<LinuxGuest, String> {
        // Checked here so that the answer names the file rather than a loader's detail.
        if !boot.kernel.is_file() {
            return Err(format!(
                "{}; build it with `branchbox guest kernel`",
                missing("kernel", &boot.kernel)
            ));
        }
        if !boot.disk.is_file() {
            return Err(format!(
                "{}; build it with `branchbox guest disk`",
                missing("root disk", &boot.disk)
            ));
        }
        let cmdline = format!("{BASE_CMDLINE} {}", boot.cmdline_extra).trim_end().to_string();
        let config = LinuxVmConfig {
            kernel: boot.kernel.clone(),
            cmdline,
            mem_size: boot.mem_size,
            vcpus: boot.vcpus,
            serial_log: boot.serial_log.clone(),
            serial_log_cap: DEFAULT_SERIAL_LOG_CAP,
        };
        let build = || -> LinuxResult<LinuxVm> {
            let mut vm = LinuxVm::new(hv, config)?;
            let (store, chain) = open_disk(boot)?;
            vm.add_layered_block(store, chain, "rootfs")?;
            vm.add_vsock(GUEST_CID, &boot.vsock_socket)?;
            vm.add_rng()?;
            if let Some(net) = &boot.net {
                vm.add_net(net, GUEST_MAC)?;
            }
            vm.boot()?;
            Ok(vm)
        };
        let vm = build().map_err(|e| e.to_string())?;
        LinuxGuest::start(vm, true)
    }

    /// Builds the VM a Linux guest's snapshot describes and runs it from where the snapshot
    /// stopped (held paused unless `resume`).
    pub(super) fn restore(hv: &Arc<Hypervisor>, req: &RestoreLinux) -> Result<LinuxGuest, String> {
        let opts = LinuxRestore {
            serial_log: req.serial_log.clone(),
            serial_log_cap: DEFAULT_SERIAL_LOG_CAP,
            vsock_socket: Some(req.vsock_socket.clone()),
            disk_store: req.disk_store.clone(),
            disk_chain: req.disk_chain.clone(),
            net: req.net.clone(),
        };
        let vm = LinuxVm::restore(hv, &req.dir, &opts).map_err(|e| e.to_string())?;
        LinuxGuest::start(vm, req.resume)
    }

    fn start(vm: LinuxVm, resume: bool) -> Result<LinuxGuest, String> {
        let stop = vm.stop_handle();
        let snapshotter = vm.snapshotter();
        if !resume {
            stop.hold_at_start();
        }
        let run = std::thread::Builder::new()
            .name("linux-run".into())
            .spawn(move || vm.run())
            .map_err(|e| format!("cannot start the guest's run thread: {e}"))?;
        let guest = LinuxGuest { stop, snapshotter, run: Some(run), end: None };
        if !resume {
            guest.pause()?;
        }
        Ok(guest)
    }

    /// Snapshots the paused guest into `dir` (it stays paused).
    pub(super) fn snapshot(&self, dir: &std::path::Path) -> Result<Saved, String> {
        self.snapshotter.save(dir).map_err(|e| e.to_string())
    }

    /// Why the guest ended, once it has; `None` while it runs.
    pub(super) fn ended(&mut self) -> Option<String> {
        if self.end.is_none() && self.run.as_ref().is_some_and(JoinHandle::is_finished) {
            self.end = Some(self.join());
        }
        self.end.clone()
    }

    /// Holds the guest's vCPUs out of it; its devices stay up.
    pub(super) fn pause(&self) -> Result<(), String> {
        self.stop.pause(PAUSE_PATIENCE)
    }

    /// Lets a paused guest run again.
    pub(super) fn resume(&self) {
        self.stop.resume();
    }

    /// Stops the guest (if it still runs) and waits for its threads, so the serial log is
    /// complete.
    pub(super) fn stop(&mut self) {
        self.stop.stop();
        if self.end.is_none() && self.run.is_some() {
            self.end = Some(self.join());
        }
    }

    fn join(&mut self) -> String {
        match self.run.take().map(JoinHandle::join) {
            Some(Ok(Ok(end))) => end.to_string(),
            Some(Ok(Err(e))) => format!("the VMM failed running the guest: {e}"),
            Some(Err(_)) => "the guest's run thread panicked".into(),
            None => "the guest's run was already collected".into(),
        }
    }
}

/// Opens the sandbox's disk chain, creating the store and the chain over the base disk the
/// first time.
fn open_disk(boot: &BootLinux) -> LinuxResult<(Store, branchbox_disk::LayeredBackend)> {
    let layers = |source| LinuxError::Device {
        what: "the root disk",
        detail: crate::disk::DiskError::Layers { store: boot.disk_store.clone(), source }.to_string(),
    };
    let store = Store::open(&boot.disk_store).map_err(layers)?;
    let chain = if store.has_chain(&boot.disk_chain).map_err(layers)? {
        LayeredBackend::open(&store, &boot.disk_chain)
    } else {
        LayeredBackend::create(&store, &boot.disk_chain, &boot.disk)
    }
    .map_err(layers)?;
    Ok((store, chain))
}
