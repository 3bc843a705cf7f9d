//! A Linux guest's snapshot state file (`linux.state`): the same header as the synthetic
//! guest's `vm.state` (`docs/microvm.md`) with its own magic, and a bincode payload
//! ([`LinuxState`]). The file is hostile input: size-bounded before it is read, header and
//! checksum checked before decoding, the decoder byte-limited, and the decoded state checked
//! for what the decoder cannot know (a memory file name inside the directory, a RAM size the
//! layout accepts, one vCPU state per vCPU, an absolute disk store).

use crate::disk::DiskRef;
use crate::error::{Error, Result};
use crate::snapshot::format::{
    decode_payload, encode_framed, plain_name, read_bounded, unframe, MAX_PAYLOAD,
};
use crate::vstate::{VcpuState, VmState};
use branchbox_arch::layout;
use branchbox_devices::i8042::I8042State;
use branchbox_devices::serial::SerialDeviceState;
use branchbox_virtio::blk::BlockState;
use branchbox_virtio::mmio::MmioState;
use branchbox_virtio::net::NetState;
use branchbox_virtio::rng::RngState;
use branchbox_virtio::vmgenid::VmGenIdState;
use branchbox_virtio::vsock::VsockState;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// First bytes of a Linux guest's state file.
pub const LINUX_MAGIC: [u8; 8] = *b"BBXLNST\0";
/// The format version this build reads and writes.
pub const LINUX_FORMAT_VERSION: u32 = 1;
/// The state file's name in a snapshot directory.
pub const LINUX_STATE_FILE: &str = "linux.state";
/// The memory file's name in a snapshot directory.
pub const LINUX_MEMORY_FILE: &str = "memory.bin";
/// Most virtio-mmio devices a state may list (the layout's slots).
const MAX_VIRTIO: usize = 16;

/// A virtio device's saved state, by kind, in slot order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum VirtioState {
    /// The root disk (a layer chain: see [`LinuxState::disk`]).
    Block(MmioState<BlockState>),
    /// The vsock device; its host-side connections are not saved (they are reset).
    Vsock(MmioState<VsockState>),
    /// The entropy device.
    Rng(MmioState<RngState>),
    /// The network interface (its MAC; frames in flight are not saved). Restored over the
    /// tap of the new guest's own network namespace.
    Net(MmioState<NetState>),
}

/// The guest's RAM in the snapshot directory: a raw image of guest-physical RAM, the
/// layout's regions back to back (below the device gap, then from 4 GiB).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryFile {
    /// Plain file name inside the snapshot directory.
    pub name: String,
    /// Bytes of guest RAM (the file's exact size).
    pub size: u64,
}

/// Everything a Linux guest's snapshot holds besides its memory and disk contents.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LinuxState {
    /// The kernel the guest booted (for the record; a restore does not load it).
    pub kernel: PathBuf,
    /// The command line the guest booted with (a restore re-adds the devices in `virtio`
    /// order, so they land in the same slots).
    pub cmdline: String,
    /// Number of vCPUs.
    pub vcpus: u8,
    /// VM-wide state: kvmclock, PIC, IOAPIC, PIT.
    pub vm: VmState,
    /// One state per vCPU, in id order.
    pub vcpu_states: Vec<VcpuState>,
    /// COM1.
    pub serial: SerialDeviceState,
    /// The i8042.
    pub i8042: I8042State,
    /// The VMGenID device (a restore starts a new generation).
    pub vmgenid: VmGenIdState,
    /// The virtio devices, in slot order.
    pub virtio: Vec<VirtioState>,
    /// Guest RAM.
    pub memory: MemoryFile,
    /// The root disk's frozen chain, when the guest has a disk.
    pub disk: Option<DiskRef>,
}

/// The bytes of a state file holding `state`.
pub fn encode(state: &LinuxState) -> Result<Vec<u8>> {
    encode_framed(&LINUX_MAGIC, LINUX_FORMAT_VERSION, state, "the guest's state")
}

/// Decodes and checks a state file's bytes; `path` only names it in errors.
pub fn decode(path: &Path, bytes: &[u8]) -> Result<LinuxState> {
    let (_, payload) = unframe(path, bytes, &LINUX_MAGIC, &[LINUX_FORMAT_VERSION], MAX_PAYLOAD)?;
    let state: LinuxState = decode_payload(path, payload)?;
    validate(&state).map_err(|reason| Error::SnapshotCorrupt { path: path.to_path_buf(), reason })?;
    Ok(state)
}

/// Reads and decodes the state file at `path`, refusing files larger than any valid one.
pub fn read(path: &Path) -> Result<LinuxState> {
    decode(path, &read_bounded(path)?)
}

fn validate(s: &LinuxState) -> std::result::Result<(), String> {
    if !plain_name(&s.memory.name) {
        return Err(format!(
            "memory file name {:?} is not a plain file name inside the snapshot directory",
            s.memory.name
        ));
    }
    layout::ram_regions(s.memory.size).map_err(|e| format!("guest RAM of {} bytes: {e}", s.memory.size))?;
    let n = s.vcpu_states.len();
    if s.vcpus == 0 || s.vcpus > layout::MAX_VCPUS || n != usize::from(s.vcpus) {
        return Err(format!("{n} vCPU states for a guest with {} vCPUs", s.vcpus));
    }
    if let Some((i, v)) = s.vcpu_states.iter().enumerate().find(|(i, v)| usize::from(v.id) != *i) {
        return Err(format!("vCPU state {i} is vCPU {}'s", v.id));
    }
    if s.vm.irqchip.is_none() || s.vcpu_states.iter().any(|v| v.lapic.is_none()) {
        return Err("a Linux guest's state lacks the in-kernel irqchip or a LAPIC".into());
    }
    if s.cmdline.len() >= layout::CMDLINE_MAX {
        return Err(format!(
            "command line of {} bytes (under {} allowed)",
            s.cmdline.len(),
            layout::CMDLINE_MAX
        ));
    }
    if s.virtio.len() > MAX_VIRTIO {
        return Err(format!("{} virtio devices (at most {MAX_VIRTIO})", s.virtio.len()));
    }
    let blocks = s.virtio.iter().filter(|v| matches!(v, VirtioState::Block(_))).count();
    let vsocks = s.virtio.iter().filter(|v| matches!(v, VirtioState::Vsock(_))).count();
    let nets = s.virtio.iter().filter(|v| matches!(v, VirtioState::Net(_))).count();
    match &s.disk {
        Some(d) if !d.store.is_absolute() => {
            return Err(format!("disk store {} is not an absolute path", d.store.display()))
        }
        Some(_) if blocks != 1 => return Err(format!("a disk and {blocks} block devices")),
        None if blocks != 0 => return Err("a block device without its disk".into()),
        _ => {}
    }
    if vsocks > 1 {
        return Err(format!("{vsocks} vsock devices (at most one)"));
    }
    if nets > 1 {
        return Err(format!("{nets} network devices (at most one)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::format::tests::{every_truncation_is_refused, flipped, vcpu};
    use crate::vstate::IrqchipState;
    use proptest::prelude::*;

    fn sample() -> LinuxState {
        let vcpu = VcpuState { lapic: Some(Default::default()), ..vcpu() };
        LinuxState {
            kernel: "/k/vmlinux".into(),
            cmdline: "console=ttyS0".into(),
            vcpus: 1,
            vm: VmState {
                clock: Default::default(),
                irqchip: Some(IrqchipState {
                    pic_master: Default::default(),
                    pic_slave: Default::default(),
                    ioapic: Default::default(),
                    pit: Default::default(),
                }),
            },
            vcpu_states: vec![vcpu],
            serial: Default::default(),
            i8042: Default::default(),
            vmgenid: VmGenIdState { addr: layout::VMGENID_ADDR, id: [7; 16] },
            virtio: Vec::new(),
            memory: MemoryFile { name: LINUX_MEMORY_FILE.into(), size: 64 << 20 },
            disk: None,
        }
    }

    fn p() -> &'static Path {
        Path::new("linux.state")
    }

    fn refused(s: &LinuxState) -> String {
        decode(p(), &encode(s).unwrap()).unwrap_err().to_string()
    }

    #[test]
    fn a_state_round_trips_and_every_truncation_is_refused() {
        let bytes = encode(&sample()).unwrap();
        let back = decode(p(), &bytes).unwrap();
        assert_eq!(back.memory, sample().memory);
        assert_eq!(back.vmgenid, sample().vmgenid);
        every_truncation_is_refused(&bytes, |b| decode(p(), b));
    }

    #[test]
    fn the_engine_s_state_files_and_other_versions_are_refused_by_name() {
        let mut bytes = encode(&sample()).unwrap();
        bytes[..8].copy_from_slice(b"BBXVMST\0");
        assert!(decode(p(), &bytes).unwrap_err().to_string().contains("magic"));
        let mut bytes = encode(&sample()).unwrap();
        bytes[8..12].copy_from_slice(&2u32.to_le_bytes());
        let err = decode(p(), &bytes).unwrap_err();
        assert!(matches!(err, Error::SnapshotVersion { found: 2, supported: 1, .. }), "{err:?}");
        assert!(err.to_string().contains("reads only that one (1)"), "{err}");
    }

    #[test]
    fn references_and_sizes_that_make_no_sense_are_refused() {
        let mut s = sample();
        s.memory.name = "../memory.bin".into();
        assert!(refused(&s).contains("not a plain file name"));
        let mut s = sample();
        s.memory.size = 63 << 20;
        assert!(refused(&s).contains("guest RAM of"));
        let mut s = sample();
        s.vcpus = 2;
        assert!(refused(&s).contains("1 vCPU states for a guest with 2 vCPUs"));
        let mut s = sample();
        s.vcpu_states[0].id = 3;
        assert!(refused(&s).contains("vCPU state 0 is vCPU 3's"));
        let mut s = sample();
        s.vm.irqchip = None;
        assert!(refused(&s).contains("irqchip"));
        let mut s = sample();
        s.disk = Some(DiskRef { store: "/disks".into(), frozen: "f".into() });
        assert!(refused(&s).contains("a disk and 0 block devices"));
        s.disk = Some(DiskRef { store: "disks".into(), frozen: "f".into() });
        assert!(refused(&s).contains("not an absolute path"));
        let mut s = sample();
        s.cmdline = "a".repeat(layout::CMDLINE_MAX);
        assert!(refused(&s).contains("command line of 2048 bytes"));
    }

    proptest! {
        #[test]
        fn any_single_byte_change_is_detected(at in 0usize..100_000, flip in 1u8..=255) {
            prop_assert!(decode(p(), &flipped(encode(&sample()).unwrap(), at, flip)).is_err());
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            prop_assert!(decode(p(), &bytes).is_err());
        }
    }
}
