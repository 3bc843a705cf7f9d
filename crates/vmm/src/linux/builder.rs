//! Building a Linux VM: KVM VM, guest RAM and its slots, irqchip and PIT, vCPUs, the port
//! bus (COM1, i8042), the MMIO bus (virtio-mmio slots), then the boot structures.

use super::devices::{self, Transport, VirtioHandle};
use super::error::{kvm, LinuxError, LinuxResult};
use super::stop::{Hold, StopHandle};
use super::vcpu;
use crate::hypervisor::Hypervisor;
use crate::vstate::PauseHandle;
use branchbox_arch::acpi::MmioDevice;
use branchbox_arch::layout::{
    self, I8042_PORT, I8042_PORT_LEN, SERIAL_IRQ, SERIAL_PORT, SERIAL_PORT_LEN, VMGENID_ADDR, VMGENID_IRQ,
};
use branchbox_arch::{BootInfo, KernelCmdline};
use branchbox_devices::i8042::I8042;
use branchbox_devices::serial::{CappedLog, Serial};
use branchbox_devices::{Bus, BusDevice};
use branchbox_disk::{LayeredBackend, Store};
use branchbox_virtio::blk::Block;
use branchbox_virtio::mmio::MmioTransport;
use branchbox_virtio::net::Net;
use branchbox_virtio::rng::Rng;
use branchbox_virtio::vmgenid::VmGenId;
use branchbox_virtio::VirtioDevice;
use kvm_bindings::{kvm_pit_config, kvm_userspace_memory_region, KVM_PIT_SPEAKER_DUMMY};
use kvm_ioctls::{VcpuFd, VmFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, MemoryRegionAddress};

/// The guest's VMGenID device, shared with the snapshot code.
pub(super) type SharedVmGenId = Arc<Mutex<VmGenId<Arc<GuestMemoryMmap>>>>;

/// The root disk as a layer chain: the store, and the backend the device writes through
/// (the VMM keeps this second handle to freeze it at a snapshot).
#[derive(Clone)]
pub(super) struct LayeredDisk {
    pub(super) store: Store,
    pub(super) backend: Arc<Mutex<LayeredBackend>>,
}
use vmm_sys_util::eventfd::EventFd;

/// Address of the three pages Intel's VMX needs for real-mode emulation: just below the
/// BIOS area, inside the device gap, never RAM.
const KVM_TSS_ADDR: usize = 0xfffb_d000;

/// What to boot and how big.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinuxVmConfig {
    /// The uncompressed kernel (`vmlinux`, ELF).
    pub kernel: PathBuf,
    /// Kernel command line (the virtio-mmio devices are described in the DSDT).
    pub cmdline: String,
    /// Guest RAM in bytes.
    pub mem_size: u64,
    /// Number of vCPUs.
    pub vcpus: u8,
    /// File the guest's serial console goes to (created, truncated).
    pub serial_log: PathBuf,
    /// Most bytes of guest output the serial log keeps.
    pub serial_log_cap: u64,
}

/// A virtio-mmio slot reserved for a device: its registers, its interrupt line, and the
/// eventfd that raises that line (registered with KVM as an irqfd).
#[derive(Debug)]
pub struct VirtioSlot {
    /// Guest-physical address of the device's register window.
    pub addr: u64,
    /// Bytes of the register window.
    pub len: u64,
    /// IOAPIC pin.
    pub irq: u32,
    /// Writing 1 here interrupts the guest.
    pub interrupt: EventFd,
}

/// A Linux guest's VM, built and not yet run.
pub struct LinuxVm {
    // Field order is drop order: vCPUs and the VM go before the RAM their slots point into.
    pub(super) vcpus: Vec<Arc<Mutex<VcpuFd>>>,
    pub(super) vm: Arc<VmFd>,
    pub(super) mem: Arc<GuestMemoryMmap>,
    pub(super) hv: Arc<Hypervisor>,
    pub(super) config: LinuxVmConfig,
    pub(super) cmdline: KernelCmdline,
    /// The virtio-mmio slots reserved so far, as the DSDT will describe them.
    pub(super) slots: Vec<MmioDevice>,
    pub(super) pio: Bus,
    pub(super) mmio: Bus,
    pub(super) serial: Arc<Mutex<Serial>>,
    pub(super) boot: Option<BootInfo>,
    pub(super) pauses: Vec<PauseHandle>,
    pub(super) hold: Hold,
    pub(super) i8042: Arc<Mutex<I8042>>,
    /// The virtio devices, in slot order (the order a restore must add them in).
    pub(super) virtio: Vec<VirtioHandle>,
    /// The root disk, when it is a layer chain (only such a disk can be snapshotted).
    pub(super) disk: Option<LayeredDisk>,
    pub(super) vmgenid: SharedVmGenId,
    /// Set by a restore: the guest's state is loaded and it runs without a boot.
    pub(super) restored: bool,
}

impl LinuxVm {
    /// Creates the VM: RAM slots first, then the in-kernel irqchip and PIT (the other order
    /// makes slot registration ~20x slower on PVM hosts, see HOST.md), then the vCPUs, COM1
    /// and the i8042. Nothing is written into guest memory until [`boot`](LinuxVm::boot).
    pub fn new(hv: &Arc<Hypervisor>, config: LinuxVmConfig) -> LinuxResult<LinuxVm> {
        let regions = layout::ram_regions(config.mem_size)?;
        let mem = GuestMemoryMmap::<()>::from_ranges(&regions)
            .map_err(|e| LinuxError::Memory { bytes: config.mem_size, detail: e.to_string() })?;
        LinuxVm::with_memory(hv, config, mem)
    }

    /// [`new`](LinuxVm::new) over guest RAM the caller mapped (a restore maps a snapshot's
    /// memory file privately); `mem` must have the layout's regions for `config.mem_size`.
    pub(super) fn with_memory(
        hv: &Arc<Hypervisor>,
        config: LinuxVmConfig,
        mem: GuestMemoryMmap,
    ) -> LinuxResult<LinuxVm> {
        if config.vcpus == 0 || config.vcpus > layout::MAX_VCPUS {
            return Err(branchbox_arch::Error::Vcpus { given: config.vcpus, max: layout::MAX_VCPUS }.into());
        }
        let cmdline = KernelCmdline::new(&config.cmdline)?;
        let vm = hv.kvm().create_vm().map_err(kvm("KVM_CREATE_VM"))?;
        let mem = Arc::new(mem);
        register_ram(&vm, &mem)?;
        vm.set_tss_address(KVM_TSS_ADDR).map_err(kvm("KVM_SET_TSS_ADDR"))?;
        vm.create_irq_chip().map_err(kvm("KVM_CREATE_IRQCHIP"))?;
        let pit = kvm_pit_config { flags: KVM_PIT_SPEAKER_DUMMY, ..Default::default() };
        vm.create_pit2(pit).map_err(kvm("KVM_CREATE_PIT2"))?;
        let vcpus = (0..config.vcpus)
            .map(|id| {
                vm.create_vcpu(u64::from(id))
                    .map(|fd| Arc::new(Mutex::new(fd)))
                    .map_err(kvm("KVM_CREATE_VCPU"))
            })
            .collect::<LinuxResult<Vec<_>>>()?;

        let log = CappedLog::create(&config.serial_log, config.serial_log_cap).map_err(|error| {
            LinuxError::File { what: "the serial log", path: config.serial_log.clone(), error }
        })?;
        let serial_irq = EventFd::new(libc::EFD_NONBLOCK)
            .map_err(|e| LinuxError::Device { what: "COM1", detail: format!("eventfd: {e}") })?;
        vm.register_irqfd(&serial_irq, SERIAL_IRQ).map_err(kvm("KVM_IRQFD (COM1)"))?;
        let serial = Arc::new(Mutex::new(Serial::new(serial_irq, log)));
        let mut pio = Bus::default();
        insert(&mut pio, "COM1", u64::from(SERIAL_PORT), u64::from(SERIAL_PORT_LEN), serial.clone())?;
        let i8042 = Arc::new(Mutex::new(I8042::default()));
        insert(&mut pio, "the i8042", u64::from(I8042_PORT), u64::from(I8042_PORT_LEN), i8042.clone())?;

        let vmgenid_irq = EventFd::new(libc::EFD_NONBLOCK)
            .map_err(|e| LinuxError::Device { what: "VMGenID", detail: format!("eventfd: {e}") })?;
        vm.register_irqfd(&vmgenid_irq, VMGENID_IRQ).map_err(kvm("KVM_IRQFD (VMGenID)"))?;
        let vmgenid = VmGenId::new(Arc::clone(&mem), GuestAddress(VMGENID_ADDR), Box::new(vmgenid_irq))
            .map_err(|e| LinuxError::Device { what: "VMGenID", detail: e.to_string() })?;
        let vmgenid = Arc::new(Mutex::new(vmgenid));

        let pauses = (0..config.vcpus).map(|_| PauseHandle::default()).collect();
        Ok(LinuxVm {
            vcpus,
            vm: Arc::new(vm),
            mem,
            hv: Arc::clone(hv),
            config,
            cmdline,
            slots: Vec::new(),
            pio,
            mmio: Bus::default(),
            serial,
            boot: None,
            pauses,
            hold: Hold::default(),
            i8042,
            virtio: Vec::new(),
            disk: None,
            vmgenid,
            restored: false,
        })
    }

    /// Guest RAM, for devices that read and write it (virtqueues). A device's handle keeps
    /// the mapping alive, so the RAM outlives the VM's slots that point into it.
    pub fn memory(&self) -> &Arc<GuestMemoryMmap> {
        &self.mem
    }

    /// The guest's current VMGenID generation id (in the page the DSDT's `ADDR` names).
    pub fn generation_id(&self) -> [u8; 16] {
        devices::lock(&self.vmgenid).generation_id()
    }

    /// Reserves the next virtio-mmio slot: the DSDT will describe it (registers and interrupt,
    /// see branchbox-arch's `acpi`) and its interrupt line is wired. Put the device there with
    /// [`attach_virtio`](LinuxVm::attach_virtio).
    pub fn virtio_slot(&mut self) -> LinuxResult<VirtioSlot> {
        if self.boot.is_some() {
            return Err(LinuxError::Config("virtio devices must be added before the VM boots".into()));
        }
        let (addr, irq) = layout::virtio_mmio_slot(self.slots.len() as u32)?;
        let interrupt = EventFd::new(libc::EFD_NONBLOCK).map_err(|e| LinuxError::Device {
            what: "a virtio-mmio slot",
            detail: format!("eventfd: {e}"),
        })?;
        self.vm.register_irqfd(&interrupt, irq).map_err(kvm("KVM_IRQFD (virtio-mmio)"))?;
        self.slots.push(MmioDevice { addr: addr.0, len: layout::VIRTIO_MMIO_SIZE, irq });
        Ok(VirtioSlot { addr: addr.0, len: layout::VIRTIO_MMIO_SIZE, irq, interrupt })
    }

    /// Maps `device` (a virtio-mmio transport) at `slot`'s registers.
    pub fn attach_virtio(&mut self, slot: &VirtioSlot, device: Arc<Mutex<dyn BusDevice>>) -> LinuxResult<()> {
        insert(&mut self.mmio, "a virtio-mmio device", slot.addr, slot.len, device)
    }

    /// Writes the kernel and the boot structures into guest memory and sets every vCPU up
    /// to enter the kernel in 64-bit mode (the boot vCPU at the entry point, the others
    /// waiting for the kernel's startup IPI).
    pub fn boot(&mut self) -> LinuxResult<&BootInfo> {
        if self.boot.is_some() {
            return Err(LinuxError::Config("the VM has already been booted".into()));
        }
        let c = &self.config;
        let info = branchbox_arch::write_boot_structures(
            self.mem.as_ref(),
            c.mem_size,
            c.vcpus,
            &c.kernel,
            &self.cmdline,
            &self.slots,
        )?;
        for (id, fd) in self.vcpus.iter().enumerate() {
            let entry = (id == 0).then_some(info.entry.0);
            vcpu::configure(&devices::lock(fd), &self.hv, id as u8, c.vcpus, entry)?;
        }
        Ok(self.boot.insert(info))
    }

    /// Adds a virtio block device over the read-only `base` and the writable `overlay`
    /// (created at the base's size if missing). The first one is the guest's `/dev/vda`.
    pub fn add_block(&mut self, base: &Path, overlay: &Path, id: &str) -> LinuxResult<()> {
        let device = devices::block(base, overlay, id)?;
        let t = self.add_virtio(device)?;
        self.virtio.push(VirtioHandle::Block(t));
        Ok(())
    }

    /// Adds a virtio block device over chain `backend` of the layer `store`: a disk that
    /// snapshots freeze and restores fork. The first block device is the guest's `/dev/vda`;
    /// a guest has at most one layered disk.
    pub fn add_layered_block(&mut self, store: Store, backend: LayeredBackend, id: &str) -> LinuxResult<()> {
        if self.disk.is_some() {
            return Err(LinuxError::Config("a guest has one layered disk".into()));
        }
        let backend = Arc::new(Mutex::new(backend));
        let device = Block::new(Box::new(crate::disk::Shared(Arc::clone(&backend))), id);
        let t = self.add_virtio(device)?;
        self.virtio.push(VirtioHandle::Block(t));
        self.disk = Some(LayeredDisk { store, backend });
        Ok(())
    }

    /// Adds a virtio entropy device.
    pub fn add_rng(&mut self) -> LinuxResult<()> {
        let t = self.add_virtio(Rng::new())?;
        self.virtio.push(VirtioHandle::Rng(t));
        Ok(())
    }

    /// Adds a vsock device for guest CID `cid` whose host side listens on the Unix socket
    /// `socket`: a host client connects, writes `CONNECT <port>\n`, reads `OK <port>\n`.
    pub fn add_vsock(&mut self, cid: u64, socket: &Path) -> LinuxResult<()> {
        if self.host_sides_ref().0.is_some() {
            return Err(LinuxError::Config("a guest has one vsock device".into()));
        }
        let device = devices::vsock(cid, socket)?;
        let t = self.add_virtio(device)?;
        self.virtio.push(VirtioHandle::Vsock(t));
        Ok(())
    }

    /// Adds the guest's network interface: virtio-net with MAC `mac` over the tap `at` names
    /// (docs/network.md), and serves the sandbox's resolver from this process. The guest's
    /// address comes from its command line (`ip=`), which the caller sets.
    pub fn add_net(&mut self, at: &devices::NetAttach, mac: [u8; 6]) -> LinuxResult<()> {
        if self.host_sides_ref().1.is_some() {
            return Err(LinuxError::Config("a guest has one network interface".into()));
        }
        at.check().map_err(LinuxError::Config)?;
        let tap = devices::open_tap(at)?;
        devices::serve_resolver(at)?;
        let t = self.add_virtio(Net::new(Box::new(tap), mac))?;
        self.virtio.push(VirtioHandle::Net(t));
        Ok(())
    }

    /// The devices whose host side a thread serves while the guest runs.
    pub(super) fn host_sides(&self) -> devices::HostSides {
        let (vsock, net) = self.host_sides_ref();
        devices::HostSides { vsock: vsock.cloned(), net: net.cloned() }
    }

    fn host_sides_ref(&self) -> (Option<&devices::VsockTransport>, Option<&devices::NetTransport>) {
        let mut sides = (None, None);
        for d in &self.virtio {
            match d {
                VirtioHandle::Vsock(t) => sides.0 = Some(t),
                VirtioHandle::Net(t) => sides.1 = Some(t),
                _ => {}
            }
        }
        sides
    }

    fn add_virtio<D>(&mut self, device: D) -> LinuxResult<Arc<Mutex<Transport<D>>>>
    where
        D: VirtioDevice + 'static,
        Transport<D>: BusDevice,
    {
        let slot = self.virtio_slot()?;
        let interrupt = slot.interrupt.try_clone().map_err(|e| LinuxError::Device {
            what: "a virtio-mmio slot",
            detail: format!("eventfd: {e}"),
        })?;
        let transport =
            Arc::new(Mutex::new(MmioTransport::new(device, Arc::clone(&self.mem), Box::new(interrupt))));
        self.attach_virtio(&slot, transport.clone())?;
        Ok(transport)
    }

    /// A handle that ends or pauses [`run`](LinuxVm::run) from any thread.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle::new(self.pauses.clone(), self.hold.clone())
    }
}

fn insert(
    bus: &mut Bus,
    what: &'static str,
    base: u64,
    len: u64,
    dev: Arc<Mutex<dyn BusDevice>>,
) -> LinuxResult<()> {
    bus.insert(base, len, dev).map_err(|e| LinuxError::Device { what, detail: e.to_string() })
}

/// Registers each RAM region as a KVM memory slot.
fn register_ram(vm: &VmFd, mem: &GuestMemoryMmap) -> LinuxResult<()> {
    for (slot, region) in mem.iter().enumerate() {
        let host = region
            .get_host_address(MemoryRegionAddress(0))
            .map_err(|e| LinuxError::Memory { bytes: region.len(), detail: e.to_string() })?;
        let r = kvm_userspace_memory_region {
            slot: slot as u32,
            flags: 0,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: host as u64,
        };
        // SAFETY: the region is a live mapping owned by `mem`, which the VM never outlives
        // (LinuxVm drops the VM and vCPUs before the memory).
        unsafe { vm.set_user_memory_region(r) }.map_err(kvm("KVM_SET_USER_MEMORY_REGION"))?;
    }
    Ok(())
}
