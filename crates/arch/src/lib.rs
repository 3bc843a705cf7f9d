//! x86_64 boot structures for branchbox's Linux guests, written into guest memory through
//! vm-memory: the guest layout, the `vmlinux` loader, the zero page and e820 map, the
//! identity page tables, the GDT, the MP table, the ACPI tables and the kernel command line.
//!
//! What it is for: everything a VMM writes before a Linux kernel's first instruction, and
//! the register values that instruction runs with ([`cpu`]). What it is not for: creating
//! VMs or running vCPUs (that is `branchbox-vmm`). Nothing here reads guest-written data:
//! the inputs are the caller's (kernel file, RAM size, vCPU count, command line) and are
//! checked with errors that name them. The layout is described in `docs/boot.md`.

pub mod acpi;
pub mod cmdline;
pub mod cpu;
pub mod gdt;
pub mod kernel;
pub mod layout;
pub mod mptable;
pub mod paging;
pub mod zeropage;

use std::path::{Path, PathBuf};
use vm_memory::{GuestAddress, GuestMemoryBackend};

pub use cmdline::KernelCmdline;
pub use zeropage::{E820Entry, E820_RAM, E820_RESERVED};

/// Why boot structures could not be built or written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The guest RAM size does not fit the layout.
    #[error(
        "guest RAM of {given} bytes is not supported: give a multiple of 2 MiB from {min} to {max} bytes"
    )]
    MemSize { given: u64, min: u64, max: u64 },
    /// The vCPU count does not fit the ACPI tables.
    #[error("{given} vCPUs requested: give 1 to {max}")]
    Vcpus { given: u8, max: u8 },
    /// More virtio-mmio devices than the layout has slots for.
    #[error("virtio-mmio device number {index} requested: the layout has {max} slots")]
    TooManyDevices { index: u32, max: u32 },
    /// A virtio-mmio device's registers lie where a 32-bit ACPI resource cannot name them.
    #[error(
        "virtio-mmio device {index} at {addr:#x} (+{len:#x}) does not fit a 32-bit ACPI memory resource"
    )]
    DeviceAbove4G { index: usize, addr: u64, len: u64 },
    /// The kernel file could not be opened or read.
    #[error(
        "cannot read the kernel {path}: {error}; build one with `branchbox guest kernel` or pass --kernel"
    )]
    KernelOpen { path: PathBuf, error: std::io::Error },
    /// The kernel file is not a loadable x86_64 vmlinux.
    #[error("the kernel {path} cannot be booted: {detail}")]
    KernelFormat { path: PathBuf, detail: String },
    /// The kernel does not fit the RAM below the device gap.
    #[error("the kernel ends at {end:#x}, past the guest's low RAM ending at {ram_end:#x}: give the guest more RAM")]
    KernelTooLarge { end: u64, ram_end: u64 },
    /// The command line exceeds the kernel's limit.
    #[error("the kernel command line is {len} bytes, the kernel keeps at most {max}: shorten it")]
    CmdlineTooLong { len: usize, max: usize },
    /// The command line has characters the kernel cannot take.
    #[error("{0}")]
    Cmdline(String),
    /// More e820 ranges than the zero page holds.
    #[error("{entries} e820 ranges do not fit the zero page's {max}")]
    E820Full { entries: usize, max: usize },
    /// The zero page could not be written.
    #[error("cannot write the zero page: {0}")]
    ZeroPage(String),
    /// The ACPI tables outgrew their window.
    #[error("the ACPI tables would end at {end:#x}, past their window's end {limit:#x}: fewer vCPUs")]
    AcpiTooLarge { end: u64, limit: u64 },
    /// A structure could not be written into guest memory (the RAM is smaller than the layout).
    #[error("cannot write the {what} into guest memory: {error}")]
    Write { what: &'static str, error: vm_memory::GuestMemoryError },
}

/// Result of this crate's operations.
pub type Result<T> = std::result::Result<T, Error>;

/// What a boot wrote, for setting up the vCPUs and for checking the guest's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootInfo {
    /// The kernel's 64-bit entry point.
    pub entry: GuestAddress,
    /// The e820 map given to the kernel.
    pub e820: Vec<E820Entry>,
    /// The command line given to the kernel.
    pub cmdline: String,
    /// Where the ACPI tables went.
    pub acpi: acpi::AcpiTables,
    /// The virtio-mmio devices the DSDT describes, in slot order.
    pub virtio: Vec<acpi::MmioDevice>,
}

/// Writes everything a kernel entered at `startup_64` needs into `mem` (RAM of `mem_size`
/// bytes laid out by [`layout::ram_regions`]): the kernel from `kernel`, `cmdline`, the zero
/// page with the e820 map, the GDT, the identity map, the MP table and ACPI tables for `vcpus`
/// and the virtio-mmio `devices`.
pub fn write_boot_structures<M: GuestMemoryBackend>(
    mem: &M,
    mem_size: u64,
    vcpus: u8,
    kernel: &Path,
    cmdline: &KernelCmdline,
    devices: &[acpi::MmioDevice],
) -> Result<BootInfo> {
    layout::check_mem_size(mem_size)?;
    let loaded = kernel::load_vmlinux(mem, kernel)?;
    let low_end = mem_size.min(layout::MMIO_GAP_START);
    if loaded.end > low_end {
        return Err(Error::KernelTooLarge { end: loaded.end, ram_end: low_end });
    }
    let text = cmdline.as_string()?;
    cmdline.write(mem)?;
    let e820 = zeropage::e820_map(mem_size);
    zeropage::write_zero_page(mem, &zeropage::boot_params_for(text.len(), &e820)?)?;
    gdt::write_gdt(mem)?;
    paging::write_identity_map(mem)?;
    mptable::write_mptable(mem, vcpus)?;
    let acpi = acpi::write_acpi_tables(mem, vcpus, devices)?;
    Ok(BootInfo { entry: loaded.entry, e820, cmdline: text, acpi, virtio: devices.to_vec() })
}
