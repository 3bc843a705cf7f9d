//! A whole VM composed in one place: KVM VM, guest RAM and its slot, vCPUs, device buses.
//!
//! The order of construction is fixed by what this host measured (HOST.md): VM, RAM slot,
//! then the in-kernel irqchip and PIT, then vCPUs.

use crate::config::VmConfig;
use crate::disk::{self, Disk, DiskError, DiskMemory, DiskRef, DISK_BASE, DISK_LEN};
use crate::error::{kvm, Error, Result};
use crate::hypervisor::Hypervisor;
use crate::memory::layers::{Chain, LayerRef};
use crate::memory::lineage::Lineage;
use crate::memory::GuestRam;
use crate::snapshot::{format, MachineState, Snapshot};
use crate::synthetic::devices::doorbell::{DoorbellState, DOORBELL_BASE, DOORBELL_LEN};
use crate::synthetic::devices::{Bus, DeviceStates, Devices};
use crate::synthetic::vcpu::{RunOutcome, Vcpu};
use crate::vstate::{PauseHandle, VcpuState, VmCore, VmState};
use branchbox_persist::{NoContext, Snapshottable};
use kvm_bindings::kvm_userspace_memory_region;
use std::path::Path;
use std::sync::Arc;

vmm_sys_util::ioctl_iowr_nr!(
    KVM_CLEAR_DIRTY_LOG,
    kvm_bindings::KVMIO,
    0xc0,
    kvm_bindings::kvm_clear_dirty_log
);

/// A KVM virtual machine.
pub struct Vm {
    // Field order is drop order: vCPUs, the VM and the devices go before the RAM their slot
    // and the disk's view point into.
    vcpus: Vec<Vcpu>,
    core: VmCore,
    devices: Devices,
    disk: Option<Disk>,
    ram: GuestRam,
    config: VmConfig,
    /// The layers under this VM's RAM and what was dirtied since; `None` while its RAM is
    /// still anonymous (booted, never snapshotted).
    pub(crate) lineage: Option<Lineage>,
    /// Whether KVM's manual dirty-log protection is on: reading the log then leaves it and
    /// the pages' write protection alone until [`Vm::clear_dirty_log`].
    manual_log: bool,
}

/// Everything a VM's state holds except memory: VM-wide, vCPU and device state.
pub(crate) struct CpuState {
    pub vm: VmState,
    pub vcpus: Vec<VcpuState>,
    pub devices: DeviceStates,
}

impl Vm {
    /// Builds a VM shell: KVM VM, anonymous RAM registered as slot 0, irqchip/PIT if
    /// configured, vCPUs without CPUID, and the doorbell on the MMIO bus. A shell is what
    /// [`boot`](Vm::boot) or a restore fills in.
    pub fn shell(hv: &Arc<Hypervisor>, config: VmConfig) -> Result<Vm> {
        let size = usize::try_from(config.mem_size)
            .map_err(|_| Error::Config("RAM size does not fit this host".into()))?;
        if config.mem_size > DOORBELL_BASE {
            return Err(Error::Config(format!(
                "RAM of {} bytes would overlap the doorbell at {DOORBELL_BASE:#x}",
                config.mem_size
            )));
        }
        if config.vcpus == 0 || usize::from(config.vcpus) > format::MAX_VCPUS {
            return Err(Error::Config(format!(
                "{} vCPUs requested, 1..={} supported",
                config.vcpus,
                format::MAX_VCPUS
            )));
        }
        let fd = hv.kvm().create_vm().map_err(kvm("KVM_CREATE_VM"))?;
        let ram = GuestRam::anonymous(size)?;
        let region = kvm_userspace_memory_region {
            slot: 0,
            flags: 0,
            guest_phys_addr: 0,
            memory_size: config.mem_size,
            userspace_addr: ram.host_addr(),
        };
        // SAFETY: the region covers exactly `ram`, which outlives the VM (field drop order).
        unsafe { fd.set_user_memory_region(region) }.map_err(kvm("KVM_SET_USER_MEMORY_REGION"))?;
        let core = VmCore::new(fd, config.irqchip)?;
        let vcpus = (0..config.vcpus)
            .map(|id| Vcpu::create(hv, core.fd(), id, config.irqchip))
            .collect::<Result<Vec<_>>>()?;
        let mut devices = Devices::default();
        devices.add_doorbell(DOORBELL_BASE, DOORBELL_LEN)?;
        Ok(Vm { vcpus, core, devices, disk: None, ram, config, lineage: None, manual_log: false })
    }

    /// Builds a fresh VM ready for a guest to be installed: a shell whose vCPUs get the
    /// host's supported CPUID.
    pub fn boot(hv: &Arc<Hypervisor>, config: VmConfig) -> Result<Vm> {
        let vm = Vm::shell(hv, config)?;
        for vcpu in &vm.vcpus {
            vcpu.fd().set_cpuid2(hv.supported_cpuid()).map_err(kvm("KVM_SET_CPUID2"))?;
        }
        Ok(vm)
    }

    /// Restores `snapshot` into `shell` (built with the snapshot's config): RAM becomes a
    /// private copy-on-write view of the snapshot's layer, nothing is copied. A snapshot
    /// with a disk gives the VM a disk of its own: a new chain (a new empty top) over the
    /// snapshot's frozen chain, named by [`disk_chain`](Vm::disk_chain).
    pub fn restore_into(shell: Vm, snapshot: &Snapshot) -> Result<Vm> {
        let disk = match snapshot.disk() {
            Some(d) => d.fork(1)?.pop(),
            None => None,
        };
        Vm::restore_with(shell, snapshot, disk)
    }

    /// [`restore_into`](Vm::restore_into) with the disk's new chain already made (`None`
    /// for a snapshot without a disk). A failed restore removes that chain.
    pub(crate) fn restore_with(
        mut shell: Vm,
        snapshot: &Snapshot,
        disk: Option<branchbox_disk::LayeredBackend>,
    ) -> Result<Vm> {
        let chain = disk.as_ref().map(|b| b.name().to_string());
        let added = match (snapshot.disk(), disk) {
            (Some(d), Some(backend)) => shell.add_disk(d.store.clone(), backend),
            _ => Ok(()),
        };
        if let Err(e) = added.and_then(|()| shell.restore(snapshot.state(), snapshot.chain())) {
            // The new chain belongs to no VM: its top is released with the shell, then removed.
            drop(shell);
            if let (Some(d), Some(name)) = (snapshot.disk(), chain) {
                let _ = d.store.remove_chain(&name);
            }
            return Err(e);
        }
        shell.lineage = Some(Lineage::new(snapshot.dir(), snapshot.chain()));
        Ok(shell)
    }

    /// Opens the snapshot in `dir` and restores it into a new VM.
    pub fn restore_from(hv: &Arc<Hypervisor>, dir: &Path) -> Result<Vm> {
        let snapshot = Snapshot::open(dir)?;
        let shell = Vm::shell(hv, snapshot.state().config)?;
        Vm::restore_into(shell, &snapshot)
    }

    /// Gives this VM a disk: chain `chain` of the layer store at `store` (a directory;
    /// `branchbox_disk::LayeredBackend::create` makes one, and its handle must be dropped
    /// first: a chain's top is open in one place at a time). The disk is a virtio-blk device
    /// on virtio-mmio at [`DISK_BASE`]; from now on the VM's snapshots, forks and rollbacks
    /// carry it with the memory. A VM has at most one disk, added before its first snapshot.
    pub fn attach_disk(&mut self, store: &Path, chain: &str) -> Result<()> {
        if let Some(d) = &self.disk {
            return Err(DiskError::HasDisk { chain: d.name().to_string() }.at_restore());
        }
        let store = std::fs::canonicalize(store)
            .map_err(|_| DiskError::NoStore { store: store.to_owned() }.at_restore())?;
        let (store, backend) = disk::open_chain(&store, chain).map_err(DiskError::at_restore)?;
        self.add_disk(store, backend)
    }

    fn add_disk(
        &mut self,
        store: branchbox_disk::Store,
        backend: branchbox_disk::LayeredBackend,
    ) -> Result<()> {
        if let Some(d) = &self.disk {
            return Err(DiskError::HasDisk { chain: d.name().to_string() }.at_restore());
        }
        let disk = Disk::new(&self.ram, store, backend).map_err(DiskError::at_restore)?;
        self.devices.add_block(DISK_BASE, DISK_LEN, disk.transport().clone())?;
        self.disk = Some(disk);
        Ok(())
    }

    /// The name of this VM's disk chain in its store, if it has a disk. It stays in the store
    /// after the VM is dropped, until removed (`Store::remove_chain`).
    pub fn disk_chain(&self) -> Option<&str> {
        self.disk.as_ref().map(Disk::name)
    }

    /// The directory of this VM's disk store, if it has a disk.
    pub fn disk_store(&self) -> Option<&Path> {
        self.disk.as_ref().map(|d| d.store().root())
    }

    /// Guest RAM as the disk device reaches it, for a host-side driver that plays the
    /// guest's part (tests): what is written through it is seen by checkpoints, like the
    /// device's own writes. `None` without a disk.
    pub fn disk_memory(&self) -> Option<DiskMemory> {
        self.disk.as_ref().map(|d| d.memory().clone())
    }

    /// The MMIO bus, where a host-side driver reaches the devices' registers as the guest
    /// would.
    pub fn mmio(&self) -> &Bus {
        self.devices.mmio()
    }

    /// Pages the host wrote since the last call: through [`GuestRam`]'s own writes and
    /// through the disk device's view.
    pub(crate) fn take_host_dirty(&self) -> Vec<u64> {
        let ram = self.ram.take_host_dirty();
        match &self.disk {
            Some(d) => crate::memory::dirty::union(&ram, &d.take_dirty()),
            None => ram,
        }
    }

    /// Freezes the disk, if any, at this instant (vCPUs stopped) as a new frozen chain.
    pub(crate) fn freeze_disk(&self) -> Result<Option<(DiskRef, branchbox_disk::FrozenChain)>> {
        let Some(d) = &self.disk else { return Ok(None) };
        let name = disk::chain_name("snap")?;
        d.freeze(&name).map(Some).map_err(DiskError::at_checkpoint)
    }

    /// Removes a frozen chain [`freeze_disk`](Vm::freeze_disk) recorded, after the
    /// checkpoint it was for failed.
    pub(crate) fn forget_frozen(&self, disk: &DiskRef) {
        if let Some(d) = &self.disk {
            d.forget(&disk.frozen);
        }
    }

    /// The VM's disk, if any.
    pub(crate) fn disk(&self) -> Option<&Disk> {
        self.disk.as_ref()
    }

    /// The VM's shape.
    pub fn config(&self) -> VmConfig {
        self.config
    }

    /// Guest RAM.
    pub fn ram(&self) -> &GuestRam {
        &self.ram
    }

    /// Guest RAM, for re-pointing its layers.
    pub(crate) fn ram_mut(&mut self) -> &mut GuestRam {
        &mut self.ram
    }

    /// Turns KVM dirty page logging of the RAM slot on or off (re-registers the slot with
    /// only its flags changed; turning it on starts an empty log).
    pub fn set_dirty_logging(&mut self, on: bool) -> Result<()> {
        if on && !self.manual_log {
            // Manual protection lets a checkpoint read the log before its writer's fork and
            // re-arm it after, when the fork has already dropped KVM's mappings of those
            // pages (re-arming is then nearly free). Without it the log works as before.
            let cap = kvm_bindings::kvm_enable_cap {
                cap: kvm_bindings::KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2,
                args: [u64::from(kvm_bindings::KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE), 0, 0, 0],
                ..Default::default()
            };
            self.manual_log = self.core.fd().enable_cap(&cap).is_ok();
        }
        let region = kvm_userspace_memory_region {
            slot: 0,
            flags: if on { kvm_bindings::KVM_MEM_LOG_DIRTY_PAGES } else { 0 },
            guest_phys_addr: 0,
            memory_size: self.config.mem_size,
            userspace_addr: self.ram.host_addr(),
        };
        // SAFETY: the same region as registered at creation; only the flags change.
        unsafe { self.core.fd().set_user_memory_region(region) }
            .map_err(kvm("KVM_SET_USER_MEMORY_REGION (dirty log)"))
    }

    /// Guest pages KVM logged as written since the last call (dirty logging must be on).
    pub fn take_dirty_log(&self) -> Result<Vec<u64>> {
        let bitmap = self.dirty_bitmap()?;
        self.clear_dirty_log(&bitmap)?;
        Ok(crate::memory::dirty::bitmap_pages(&bitmap))
    }

    /// The RAM slot's dirty bitmap (one bit a page). Under manual protection the log keeps
    /// these bits, and the pages stay writable, until [`clear_dirty_log`](Vm::clear_dirty_log).
    pub(crate) fn dirty_bitmap(&self) -> Result<Vec<u64>> {
        let size = usize::try_from(self.config.mem_size)
            .map_err(|_| Error::Config("RAM size does not fit".into()))?;
        self.core.fd().get_dirty_log(0, size).map_err(kvm("KVM_GET_DIRTY_LOG"))
    }

    /// Under manual protection, clears `bitmap`'s bits from the log and write-protects those
    /// pages again, so their next write is logged; without it reading the log did both.
    pub(crate) fn clear_dirty_log(&self, bitmap: &[u64]) -> Result<()> {
        if !self.manual_log {
            return Ok(());
        }
        let pages = self.config.mem_size / crate::memory::PAGE_SIZE as u64;
        if (bitmap.len() as u64) * 64 < pages {
            return Err(Error::Config("dirty bitmap shorter than the RAM slot".into()));
        }
        let mut arg = kvm_bindings::kvm_clear_dirty_log {
            slot: 0,
            num_pages: u32::try_from(pages).map_err(|_| Error::Config("RAM too large to log".into()))?,
            first_page: 0,
            ..Default::default()
        };
        arg.__bindgen_anon_1.dirty_bitmap = bitmap.as_ptr() as *mut libc::c_void;
        // SAFETY: `arg` names slot 0 and a bitmap covering all of its pages, which KVM only
        // reads.
        let r = unsafe { vmm_sys_util::ioctl::ioctl_with_ref(self.core.fd(), KVM_CLEAR_DIRTY_LOG(), &arg) };
        if r < 0 {
            return Err(kvm("KVM_CLEAR_DIRTY_LOG")(kvm_ioctls::Error::last()));
        }
        Ok(())
    }

    /// Saves the VM-wide, vCPU and device state; the VM is paused.
    pub(crate) fn save_cpu(&mut self) -> Result<CpuState> {
        // vCPUs first: saving completes any access left pending by the last exit, which may
        // still change device state.
        let vcpus = self.vcpus.iter_mut().map(|v| v.save(&mut NoContext)).collect::<Result<Vec<_>>>()?;
        Ok(CpuState {
            vm: self.core.save(&mut NoContext)?,
            vcpus,
            devices: self.devices.save(&mut NoContext)?,
        })
    }

    /// Restores the VM-wide, vCPU and device parts of a saved state.
    pub(crate) fn restore_cpu(
        &mut self,
        vm: &VmState,
        vcpus: &[VcpuState],
        devices: &DeviceStates,
    ) -> Result<()> {
        if vcpus.len() != self.vcpus.len() {
            return Err(Error::Config(format!("{} vCPU states for {} vCPUs", vcpus.len(), self.vcpus.len())));
        }
        self.core.restore(vm, &NoContext)?;
        for (vcpu, s) in self.vcpus.iter_mut().zip(vcpus) {
            vcpu.restore(s, &NoContext)?;
        }
        self.devices.restore(devices, &NoContext)
    }

    /// The KVM VM and its VM-wide devices.
    pub fn core(&self) -> &VmCore {
        &self.core
    }

    /// vCPU `index`.
    pub fn vcpu(&mut self, index: usize) -> Result<&mut Vcpu> {
        self.vcpus.get_mut(index).ok_or_else(|| Error::Config(format!("the VM has no vCPU {index}")))
    }

    /// Guest accesses to MMIO or port addresses that no device claims.
    pub fn unclaimed_accesses(&self) -> u64 {
        self.devices.mmio().unclaimed() + self.devices.pio().unclaimed()
    }

    /// Saved state of the doorbell (times rung, last value).
    pub fn doorbell(&self) -> Result<DoorbellState> {
        self.devices.doorbell().ok_or_else(|| Error::Config("the VM has no doorbell".into()))
    }

    /// A handle that pauses this VM's running vCPU from another thread.
    pub fn pause_handle(&self) -> Result<PauseHandle> {
        self.vcpus.first().map(Vcpu::pause_handle).ok_or_else(|| Error::Config("the VM has no vCPU".into()))
    }

    /// Runs vCPU 0 until a device stops it or a pause is requested.
    pub fn run(&mut self) -> Result<RunOutcome> {
        let vcpu = self.vcpus.first_mut().ok_or_else(|| Error::Config("the VM has no vCPU".into()))?;
        vcpu.run(self.devices.mmio(), self.devices.pio())
    }
}

/// A whole VM is saved with the memory layers (base first) its checkpoint prepared, and
/// restored from an opened layer chain.
impl Snapshottable for Vm {
    type State = MachineState;
    type SaveCtx = [LayerRef];
    type RestoreCtx = Chain;
    type Error = Error;

    fn save(&mut self, layers: &mut [LayerRef]) -> Result<MachineState> {
        let cpu = self.save_cpu()?;
        Ok(MachineState {
            config: self.config,
            vm: cpu.vm,
            vcpus: cpu.vcpus,
            devices: cpu.devices,
            memory: self.ram.save(layers)?,
            // The checkpoint freezes the disk and records it.
            disk: None,
        })
    }

    fn restore(&mut self, state: &MachineState, chain: &Chain) -> Result<()> {
        if state.config != self.config {
            return Err(Error::Config(format!(
                "snapshot is for a VM shaped {:?}, this VM is {:?}",
                state.config, self.config
            )));
        }
        self.ram.restore(&state.memory, chain)?;
        self.restore_cpu(&state.vm, &state.vcpus, &state.devices)
    }
}
