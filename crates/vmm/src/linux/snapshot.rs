//! Snapshots of a paused Linux guest, and restores of them into a new VM.
//!
//! A snapshot directory holds `linux.state` ([`super::state`]), `memory.bin`
//! ([`super::memfile`]) and `disk/`, a layer store: the root disk, a layer chain, is frozen
//! at the same pause instant and the frozen chain recorded there (its layers hard-linked,
//! [`super::import`]), so the snapshot owns what it needs. A restore maps the memory file
//! privately, re-adds the devices in their saved slot order, records the frozen disk in the
//! new VM's own store and forks a new top over it there, and loads vCPU, VM and device
//! state; its run then continues where the snapshot's guest stopped.
//!
//! Nothing is in flight while the guest is paused: virtio-blk and rng serve their queues on
//! the vCPU threads (parked), and the vsock host thread is held out by the vsock transport's
//! lock, which the save takes first and keeps until the memory file is written.

use super::builder::{LayeredDisk, LinuxVm, LinuxVmConfig, SharedVmGenId};
use super::devices::{lock, VirtioHandle};
use super::error::{LinuxError, LinuxResult};
use super::import::import_frozen;
use super::memfile;
use super::state::{self, LinuxState, MemoryFile, VirtioState, LINUX_MEMORY_FILE, LINUX_STATE_FILE};
use super::stop::StopHandle;
use crate::disk::{chain_name, existing_store, DiskRef};
use crate::error::Error;
use crate::hypervisor::Hypervisor;
use crate::vstate::{restore_vcpu, restore_vm, save_vcpu, save_vm};
use branchbox_devices::i8042::I8042;
use branchbox_devices::serial::Serial;
use branchbox_disk::LayeredBackend;
use branchbox_persist::{NoContext, RestoreError, Snapshottable};
use kvm_ioctls::{VcpuFd, VmFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use vm_memory::GuestMemoryMmap;

/// What a restore needs besides the snapshot: where this VM's serial log and vsock socket
/// go, and its disk's store and chain.
#[derive(Debug, Clone)]
pub struct LinuxRestore {
    /// The restored guest's serial log (created, truncated): its output from the snapshot on.
    pub serial_log: PathBuf,
    /// Most bytes of guest output the serial log keeps.
    pub serial_log_cap: u64,
    /// Where the vsock device's host side listens, for a guest with one.
    pub vsock_socket: Option<PathBuf>,
    /// Where the restored guest's network interface attaches, for a guest with one: each
    /// restore or fork child its own namespace's tap.
    pub net: Option<super::devices::NetAttach>,
    /// This VM's layer store (created if missing): the snapshot's frozen disk is recorded
    /// there and the new top written there.
    pub disk_store: PathBuf,
    /// This VM's chain in `disk_store`: a new top over the snapshot's frozen disk.
    pub disk_chain: String,
}

/// The snapshot directory's layer store, holding its frozen disk.
pub const SNAPSHOT_DISK_STORE: &str = "disk";

/// What a save wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    /// Bytes of guest RAM in the memory file.
    pub memory_bytes: u64,
    /// The frozen disk, for a guest with one.
    pub disk: Option<DiskRef>,
}

/// Saves a Linux guest while its run goes on: the VM's parts, shared with the run's threads.
#[derive(Clone)]
pub struct Snapshotter {
    hv: Arc<Hypervisor>,
    vm: Arc<VmFd>,
    vcpus: Vec<Arc<Mutex<VcpuFd>>>,
    mem: Arc<GuestMemoryMmap>,
    config: LinuxVmConfig,
    serial: Arc<Mutex<Serial>>,
    i8042: Arc<Mutex<I8042>>,
    vmgenid: SharedVmGenId,
    virtio: Vec<VirtioHandle>,
    disk: Option<LayeredDisk>,
    stop: StopHandle,
}

fn device(e: RestoreError) -> LinuxError {
    LinuxError::Vmm(Error::Restore(e))
}

impl LinuxVm {
    /// A handle that snapshots this guest while it is paused; take it after adding devices.
    pub fn snapshotter(&self) -> Snapshotter {
        Snapshotter {
            hv: Arc::clone(&self.hv),
            vm: Arc::clone(&self.vm),
            vcpus: self.vcpus.clone(),
            mem: Arc::clone(&self.mem),
            config: self.config.clone(),
            serial: Arc::clone(&self.serial),
            i8042: Arc::clone(&self.i8042),
            vmgenid: Arc::clone(&self.vmgenid),
            virtio: self.virtio.clone(),
            disk: self.disk.clone(),
            stop: self.stop_handle(),
        }
    }

    /// Builds a VM from the snapshot in `dir` (see the module's comment); run it with
    /// [`run`](LinuxVm::run), which continues where the snapshot's guest stopped.
    pub fn restore(hv: &Arc<Hypervisor>, dir: &Path, opts: &LinuxRestore) -> LinuxResult<LinuxVm> {
        let s = state::read(&dir.join(LINUX_STATE_FILE))?;
        let mem = memfile::map(&dir.join(&s.memory.name), s.memory.size)?;
        let config = LinuxVmConfig {
            kernel: s.kernel.clone(),
            cmdline: s.cmdline.clone(),
            mem_size: s.memory.size,
            vcpus: s.vcpus,
            serial_log: opts.serial_log.clone(),
            serial_log_cap: opts.serial_log_cap,
        };
        let mut vm = LinuxVm::with_memory(hv, config, mem)?;
        for dev in &s.virtio {
            match dev {
                VirtioState::Block(_) => {
                    let disk = s
                        .disk
                        .as_ref()
                        .ok_or_else(|| LinuxError::Config("a block device without its disk".into()))?;
                    let from = existing_store(&disk.store).map_err(|e| LinuxError::Vmm(e.at_restore()))?;
                    let store = import_frozen(&from, &disk.frozen, &opts.disk_store)?;
                    let layers = |e| {
                        LinuxError::Vmm(
                            crate::disk::DiskError::Layers { store: disk.store.clone(), source: e }
                                .at_restore(),
                        )
                    };
                    let frozen = store.open_frozen(&disk.frozen).map_err(layers)?;
                    let top = LayeredBackend::fork(&store, &frozen, &[&opts.disk_chain]).map_err(layers)?;
                    let top = top
                        .into_iter()
                        .next()
                        .ok_or_else(|| LinuxError::Config("the store forked no chain".into()))?;
                    vm.add_layered_block(store, top, "rootfs")?;
                }
                VirtioState::Vsock(v) => {
                    let socket = opts.vsock_socket.as_deref().ok_or_else(|| {
                        LinuxError::Config(
                            "the snapshot's guest has a vsock device: give its socket path".into(),
                        )
                    })?;
                    vm.add_vsock(v.device.guest_cid, socket)?;
                }
                VirtioState::Rng(_) => vm.add_rng()?,
                VirtioState::Net(v) => {
                    let at = opts.net.as_ref().ok_or_else(|| {
                        LinuxError::Config(
                            "the snapshot's guest has a network interface: give its namespace and tap".into(),
                        )
                    })?;
                    vm.add_net(at, v.device.mac)?;
                }
            }
        }
        vm.load(&s)?;
        vm.restored = true;
        Ok(vm)
    }

    fn load(&mut self, s: &LinuxState) -> LinuxResult<()> {
        restore_vm(&self.vm, true, &s.vm)?;
        for (id, (fd, v)) in self.vcpus.iter().zip(&s.vcpu_states).enumerate() {
            restore_vcpu(&lock(fd), &self.hv, id as u8, true, v)?;
        }
        lock(&self.serial).restore(&s.serial, &NoContext).map_err(device)?;
        lock(&self.i8042).restore(&s.i8042, &NoContext).map_err(device)?;
        for (handle, saved) in self.virtio.iter().zip(&s.virtio) {
            match (handle, saved) {
                (VirtioHandle::Block(t), VirtioState::Block(v)) => lock(t).restore(v, &NoContext),
                (VirtioHandle::Vsock(t), VirtioState::Vsock(v)) => lock(t).restore(v, &NoContext),
                (VirtioHandle::Rng(t), VirtioState::Rng(v)) => lock(t).restore(v, &NoContext),
                (VirtioHandle::Net(t), VirtioState::Net(v)) => lock(t).restore(v, &NoContext),
                _ => Err(RestoreError::new("virtio-mmio", "devices out of their saved slot order")),
            }
            .map_err(device)?;
        }
        // Last: a restore starts a new generation and tells the guest so.
        lock(&self.vmgenid).restore(&s.vmgenid, &NoContext).map_err(device)
    }
}

impl Snapshotter {
    /// Writes the paused guest to `dir` (an existing directory): memory, CPU and device
    /// state, and its disk frozen in its store as a new frozen chain. The guest must be
    /// paused ([`StopHandle::pause`]) and stays paused.
    pub fn save(&self, dir: &Path) -> LinuxResult<Saved> {
        if !self.stop.is_paused() {
            return Err(LinuxError::Config("pause the guest before taking a snapshot".into()));
        }
        let has_block = self.virtio.iter().any(|d| matches!(d, VirtioHandle::Block(_)));
        if has_block && self.disk.is_none() {
            return Err(LinuxError::Config(
                "the guest's disk is a plain overlay, not a layer chain; boot it with a disk store to snapshot it"
                    .into(),
            ));
        }
        // Held to the end: the devices' host thread must not write guest memory meanwhile.
        let mut vsock = self.virtio.iter().find_map(|d| match d {
            VirtioHandle::Vsock(t) => Some(lock(t)),
            _ => None,
        });
        let mut net = self.virtio.iter().find_map(|d| match d {
            VirtioHandle::Net(t) => Some(lock(t)),
            _ => None,
        });
        let mut vcpu_states = Vec::with_capacity(self.vcpus.len());
        for (id, fd) in self.vcpus.iter().enumerate() {
            vcpu_states.push(save_vcpu(&mut lock(fd), &self.hv, id as u8, true)?);
        }
        let vm = save_vm(&self.vm, true)?;
        let serial = lock(&self.serial).save(&mut NoContext).map_err(device)?;
        let i8042 = lock(&self.i8042).save(&mut NoContext).map_err(device)?;
        let vmgenid = lock(&self.vmgenid).save(&mut NoContext).map_err(device)?;
        let mut virtio = Vec::with_capacity(self.virtio.len());
        for d in &self.virtio {
            virtio.push(match d {
                VirtioHandle::Block(t) => VirtioState::Block(lock(t).save(&mut NoContext).map_err(device)?),
                VirtioHandle::Vsock(_) => match &mut vsock {
                    Some(t) => VirtioState::Vsock(t.save(&mut NoContext).map_err(device)?),
                    None => return Err(LinuxError::Config("the vsock device vanished".into())),
                },
                VirtioHandle::Rng(t) => VirtioState::Rng(lock(t).save(&mut NoContext).map_err(device)?),
                VirtioHandle::Net(_) => match &mut net {
                    Some(t) => VirtioState::Net(t.save(&mut NoContext).map_err(device)?),
                    None => return Err(LinuxError::Config("the network device vanished".into())),
                },
            });
        }
        let disk = match &self.disk {
            Some(d) => Some(d.freeze(&dir.join(SNAPSHOT_DISK_STORE))?),
            None => None,
        };
        let memory_bytes = memfile::write(&self.mem, dir, LINUX_MEMORY_FILE)?;
        drop(vsock);
        drop(net);
        let state = LinuxState {
            kernel: self.config.kernel.clone(),
            cmdline: self.config.cmdline.clone(),
            vcpus: self.config.vcpus,
            vm,
            vcpu_states,
            serial,
            i8042,
            vmgenid,
            virtio,
            memory: MemoryFile { name: LINUX_MEMORY_FILE.into(), size: memory_bytes },
            disk: disk.clone(),
        };
        let bytes = state::encode(&state)?;
        crate::memory::write_atomic(dir, LINUX_STATE_FILE, &bytes).map_err(|source| {
            LinuxError::Vmm(Error::SnapshotIo { path: dir.join(LINUX_STATE_FILE), op: "write", source })
        })?;
        Ok(Saved { memory_bytes, disk })
    }
}

impl LayeredDisk {
    /// Freezes the top at this instant and records the frozen chain under a fresh name in the
    /// store at `into` (the snapshot's). The vCPUs are parked, so no request is in flight (see
    /// the module's comment).
    fn freeze(&self, into: &Path) -> LinuxResult<DiskRef> {
        let layers = |source| {
            LinuxError::Vmm(Error::Checkpoint(format!(
                "the disk could not be frozen with memory: {}",
                crate::disk::DiskError::Layers { store: self.store.root().to_owned(), source }
            )))
        };
        let frozen = lock(&self.backend).freeze().map_err(layers)?;
        let name = chain_name("linux")?;
        self.store.save_frozen(&name, &frozen).map_err(layers)?;
        let imported = import_frozen(&self.store, &name, into);
        // The VM's own chain names those layers as the deltas under its new top; its store
        // keeps no second record of the snapshot.
        let _ = self.store.remove_chain(&name);
        let into = imported?;
        Ok(DiskRef { store: into.root().to_owned(), frozen: name })
    }
}
