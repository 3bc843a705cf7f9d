//! The snapshot state file: a fixed header, then a checksummed bincode payload.
//!
//! ```text
//! offset  size  field
//!      0     8  magic  b"BBXVMST\0"
//!      8     4  format version, u32 little-endian (FORMAT_VERSION)
//!     12     4  flags, u32 little-endian, must be 0
//!     16     8  payload length in bytes, u64 little-endian (at most MAX_PAYLOAD)
//!     24     4  CRC-32 (IEEE) of the payload, u32 little-endian
//!     28     4  reserved, must be 0
//!     32     n  payload: MachineState encoded with bincode 1 (fixed-width little-endian ints)
//! ```
//!
//! The whole file is treated as hostile input: its size is bounded before it is read, the
//! header is checked field by field, the checksum before any decoding, and the decoder runs
//! with a byte limit. After decoding, the state is checked for things the decoder cannot know
//! (a layer name that is a plain relative file name, sane RAM size and vCPU count).
//! `docs/microvm.md` is the spec page of this format.

use super::state::MachineState;
use crate::error::{Error, Result};
use bincode::Options;
use std::io::Read;
use std::path::Path;

/// First bytes of every state file.
pub const MAGIC: [u8; 8] = *b"BBXVMST\0";
/// The format version this build writes. Version 4 adds the disks' device states (a list
/// after the doorbells') and the disk's frozen chain (after the device states); version 3
/// stored device states as one typed list per kind of device (each entry with its bus
/// range) instead of two bus lists of an enum of every device (version 2).
pub const FORMAT_VERSION: u32 = 4;
/// The older version this build still reads: its payload is a prefix of version 4's (the
/// fields version 4 added are all at the end), read as a VM without a disk.
pub const FORMAT_VERSION_V3: u32 = 3;
/// Size of the fixed header.
pub const HEADER_LEN: usize = 32;
/// Largest payload accepted (a few vCPUs' state is tens of KiB).
pub const MAX_PAYLOAD: u64 = 16 << 20;
/// Most vCPUs a snapshot may describe.
pub const MAX_VCPUS: usize = 64;
/// Largest guest RAM a snapshot may describe (the test guest's doorbell sits above it).
pub const MAX_RAM: u64 = 3 << 30;

fn codec() -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_little_endian()
        .with_limit(MAX_PAYLOAD)
        .reject_trailing_bytes()
}

/// Encodes `state` into the bytes of a state file.
pub fn encode(state: &MachineState) -> Result<Vec<u8>> {
    encode_framed(&MAGIC, FORMAT_VERSION, state, "VM state")
}

/// The bytes of a state file under `magic` and `version` holding `state`, encoded with
/// [`codec`]; `what` names the state in errors.
pub(crate) fn encode_framed<T: serde::Serialize>(
    magic: &[u8; 8],
    version: u32,
    state: &T,
    what: &str,
) -> Result<Vec<u8>> {
    let payload =
        codec().serialize(state).map_err(|e| Error::Config(format!("cannot encode {what}: {e}")))?;
    Ok(frame(magic, version, &payload))
}

/// Decodes a payload that [`unframe`] checked, with the byte-limited [`codec`]; `path` only
/// names the file in errors.
pub(crate) fn decode_payload<T: serde::de::DeserializeOwned>(path: &Path, payload: &[u8]) -> Result<T> {
    codec().deserialize(payload).map_err(|e| Error::SnapshotCorrupt {
        path: path.to_path_buf(),
        reason: format!("payload does not decode: {e}"),
    })
}

/// The header (magic, version, length, checksum) and then `payload`: the layout every state
/// file of this crate shares (the Linux guest's has its own magic).
pub(crate) fn frame(magic: &[u8; 8], version: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(magic);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        a.copy_from_slice(s);
    }
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        a.copy_from_slice(s);
    }
    u64::from_le_bytes(a)
}

/// Decodes and checks the bytes of a state file; `path` only names it in errors.
pub fn decode(path: &Path, bytes: &[u8]) -> Result<MachineState> {
    let corrupt = |reason: String| Error::SnapshotCorrupt { path: path.to_path_buf(), reason };
    let (version, payload) = unframe(path, bytes, &MAGIC, &[FORMAT_VERSION, FORMAT_VERSION_V3], MAX_PAYLOAD)?;
    let state: MachineState = if version == FORMAT_VERSION_V3 {
        decode_payload::<StateV3>(path, payload)?.into()
    } else {
        decode_payload(path, payload)?
    };
    validate(&state).map_err(corrupt)?;
    Ok(state)
}

/// Checks a state file's header against `magic`, the `versions` this build reads (the
/// newest first) and the payload limit `max`, then the checksum; returns the version and the
/// payload. `path` only names the file in errors.
pub(crate) fn unframe<'a>(
    path: &Path,
    bytes: &'a [u8],
    magic: &[u8; 8],
    versions: &[u32],
    max: u64,
) -> Result<(u32, &'a [u8])> {
    let corrupt = |reason: String| Error::SnapshotCorrupt { path: path.to_path_buf(), reason };
    if bytes.len() < HEADER_LEN {
        if bytes.len() >= magic.len() && bytes[..magic.len()] != magic[..] {
            return Err(corrupt("it does not start with the snapshot magic".into()));
        }
        return Err(Error::SnapshotTruncated {
            path: path.to_path_buf(),
            found: bytes.len() as u64,
            expected: HEADER_LEN as u64,
        });
    }
    if bytes[..magic.len()] != magic[..] {
        return Err(corrupt("it does not start with the snapshot magic".into()));
    }
    let version = le_u32(bytes, 8);
    if !versions.contains(&version) {
        return Err(Error::SnapshotVersion {
            path: path.to_path_buf(),
            found: version,
            supported: versions.first().copied().unwrap_or(0),
            reads: match versions {
                [only] => format!("only that one ({only})"),
                _ => format!("versions {versions:?}"),
            },
        });
    }
    if le_u32(bytes, 12) != 0 || le_u32(bytes, 28) != 0 {
        return Err(corrupt("unknown header flags".into()));
    }
    let len = le_u64(bytes, 16);
    if len > max {
        return Err(corrupt(format!("payload length {len} exceeds the limit of {max}")));
    }
    let expected = HEADER_LEN as u64 + len;
    let found = bytes.len() as u64;
    if found < expected {
        return Err(Error::SnapshotTruncated { path: path.to_path_buf(), found, expected });
    }
    if found > expected {
        return Err(corrupt(format!("{} bytes follow the declared payload", found - expected)));
    }
    let payload = &bytes[HEADER_LEN..];
    let crc = le_u32(bytes, 24);
    let actual = crc32fast::hash(payload);
    if crc != actual {
        return Err(corrupt(format!("payload checksum is {actual:#010x}, header says {crc:#010x}")));
    }
    Ok((version, payload))
}

/// A version 3 payload: everything up to the doorbells' states, the field order of
/// [`MachineState`] and `DeviceStates` (bincode writes fields in order, untagged).
#[derive(serde::Deserialize)]
struct StateV3 {
    config: crate::config::VmConfig,
    vm: crate::vstate::VmState,
    vcpus: Vec<crate::vstate::VcpuState>,
    memory: crate::memory::MemoryState,
    doorbells: Vec<crate::synthetic::devices::Placed<crate::synthetic::devices::doorbell::DoorbellState>>,
}

impl From<StateV3> for MachineState {
    fn from(v3: StateV3) -> MachineState {
        MachineState {
            config: v3.config,
            vm: v3.vm,
            vcpus: v3.vcpus,
            memory: v3.memory,
            devices: crate::synthetic::devices::DeviceStates { doorbells: v3.doorbells, blocks: Vec::new() },
            disk: None,
        }
    }
}

/// Checks what the decoder cannot: references and sizes that must make sense.
fn validate(state: &MachineState) -> std::result::Result<(), String> {
    let layers = &state.memory.layers;
    if layers.is_empty() || layers.len() > crate::memory::layers::MAX_LAYERS {
        return Err(format!(
            "{} memory layers (1..={} allowed)",
            layers.len(),
            crate::memory::layers::MAX_LAYERS
        ));
    }
    for (i, layer) in layers.iter().enumerate() {
        let name = &layer.name;
        if !plain_name(name) {
            return Err(format!(
                "memory layer name {name:?} is not a plain file name inside the snapshot directory"
            ));
        }
        let is_base = matches!(layer.kind, crate::memory::layers::LayerKind::Base { .. });
        if is_base != (i == 0) {
            return Err("the first memory layer must be the base and only the first".into());
        }
    }
    let size = state.memory.size;
    if size == 0 || size > MAX_RAM || size % crate::memory::PAGE_SIZE as u64 != 0 {
        return Err(format!("guest RAM size {size} is not a valid size"));
    }
    if size != state.config.mem_size {
        return Err(format!(
            "memory layer size {size} differs from the VM's RAM size {}",
            state.config.mem_size
        ));
    }
    let n = state.vcpus.len();
    if n == 0 || n > MAX_VCPUS || n != usize::from(state.config.vcpus) {
        return Err(format!("{n} vCPU states for a VM with {} vCPUs", state.config.vcpus));
    }
    if state.vm.irqchip.is_some() != state.config.irqchip {
        return Err("irqchip state does not match the VM configuration".into());
    }
    if let Some(disk) = &state.disk {
        if !disk.store.is_absolute() {
            return Err(format!("disk store {} is not an absolute path", disk.store.display()));
        }
        if state.devices.blocks.len() != 1 {
            return Err(format!("a disk and {} disk devices", state.devices.blocks.len()));
        }
    } else if !state.devices.blocks.is_empty() {
        return Err("disk device state without a disk".into());
    }
    Ok(())
}

/// Whether `name` is a plain file name: no directory part, not `.`/`..`, no NUL.
pub fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.contains('\0')
}

/// Reads and decodes a state file, refusing files larger than any valid one.
pub fn read_state_file(path: &Path) -> Result<MachineState> {
    decode(path, &read_bounded(path)?)
}

/// The bytes of the state file at `path`, reading no more than one byte past the largest
/// valid file (so that [`unframe`] refuses it by name rather than this reading it whole).
pub(crate) fn read_bounded(path: &Path) -> Result<Vec<u8>> {
    let io = |op| move |source| Error::SnapshotIo { path: path.to_path_buf(), op, source };
    let file = std::fs::File::open(path).map_err(io("open"))?;
    let mut bytes = Vec::new();
    file.take(HEADER_LEN as u64 + MAX_PAYLOAD + 1).read_to_end(&mut bytes).map_err(io("read"))?;
    Ok(bytes)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::VmConfig;
    use crate::disk::DiskRef;
    use crate::memory::layers::{LayerKind, LayerRef};
    use crate::memory::MemoryState;
    use crate::synthetic::devices::{doorbell::DoorbellState, DeviceStates, Placed};
    use crate::vstate::{VcpuState, VmState};
    use proptest::prelude::*;

    /// vCPU 0 with default registers and no LAPIC, for the tests of every state file.
    pub(crate) fn vcpu() -> VcpuState {
        VcpuState {
            id: 0,
            cpuid: vec![Default::default(); 3],
            mp_state: Default::default(),
            regs: Default::default(),
            sregs: Default::default(),
            xsave: vec![0; 1024],
            xcrs: Default::default(),
            debugregs: Default::default(),
            lapic: None,
            msrs: vec![Default::default(); 5],
            events: Default::default(),
        }
    }

    /// Checks that `decode` refuses every proper prefix of `bytes` (a valid state file).
    pub(crate) fn every_truncation_is_refused<T>(bytes: &[u8], decode: impl Fn(&[u8]) -> Result<T>) {
        for len in 0..bytes.len() {
            assert!(decode(&bytes[..len]).is_err(), "length {len} decoded");
        }
    }

    /// `bytes` with the byte at `at` (modulo the length) changed by xor with `flip`.
    pub(crate) fn flipped(mut bytes: Vec<u8>, at: usize, flip: u8) -> Vec<u8> {
        let at = at % bytes.len();
        bytes[at] ^= flip;
        bytes
    }

    fn sample() -> MachineState {
        MachineState {
            config: VmConfig { mem_size: 8 << 20, vcpus: 1, irqchip: false },
            vm: VmState { clock: Default::default(), irqchip: None },
            vcpus: vec![vcpu()],
            memory: MemoryState {
                size: 8 << 20,
                layers: vec![LayerRef { name: "mem.layer".into(), kind: LayerKind::Base { crc32: 1 } }],
            },
            devices: DeviceStates {
                doorbells: vec![Placed {
                    base: 0xd000_0000,
                    len: 0x1000,
                    state: DoorbellState { rings: 3, last: 7 },
                }],
                blocks: vec![],
            },
            disk: None,
        }
    }

    /// `bytes` with the header's version set to `version` (the checksum covers only the
    /// payload).
    fn with_version(mut bytes: Vec<u8>, version: u32) -> Vec<u8> {
        bytes[8..12].copy_from_slice(&version.to_le_bytes());
        bytes
    }

    fn p() -> &'static Path {
        Path::new("vm.state")
    }

    #[test]
    fn encoded_state_decodes_back() {
        let bytes = encode(&sample()).unwrap();
        let back = decode(p(), &bytes).unwrap();
        assert_eq!(back.memory, sample().memory);
        assert_eq!(back.vcpus.len(), 1);
    }

    #[test]
    fn a_version_3_file_reads_as_a_vm_without_a_disk() {
        // A version 3 payload is version 4's without the two fields added at the end: an
        // empty list of disk devices (8 bytes) and no disk (1 byte).
        let v4 = encode(&sample()).unwrap();
        let payload = &v4[HEADER_LEN..v4.len() - 9];
        let mut v3 = with_version(v4[..HEADER_LEN].to_vec(), FORMAT_VERSION_V3);
        v3[16..24].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        v3[24..28].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
        v3.extend_from_slice(payload);
        let back = decode(p(), &v3).unwrap();
        assert_eq!(back.devices, sample().devices);
        assert_eq!(back.disk, None);
        let err = decode(p(), &with_version(v4, 2)).unwrap_err();
        assert!(matches!(err, Error::SnapshotVersion { found: 2, .. }), "{err:?}");
    }

    #[test]
    fn a_disk_must_come_with_its_device_and_an_absolute_store() {
        let mut s = sample();
        s.disk = Some(DiskRef { store: "/var/lib/disks".into(), frozen: "snap-1".into() });
        let err = decode(p(), &encode(&s).unwrap()).unwrap_err();
        assert!(err.to_string().contains("a disk and 0 disk devices"), "{err}");
        s.disk = Some(DiskRef { store: "disks".into(), frozen: "snap-1".into() });
        let err = decode(p(), &encode(&s).unwrap()).unwrap_err();
        assert!(err.to_string().contains("not an absolute path"), "{err}");
    }

    #[test]
    fn every_truncation_is_an_error() {
        every_truncation_is_refused(&encode(&sample()).unwrap(), |b| decode(p(), b));
    }

    #[test]
    fn layer_names_that_leave_the_directory_are_refused() {
        for name in ["../x", "/etc/passwd", "", "..", "a/b"] {
            let mut s = sample();
            s.memory.layers[0].name = name.into();
            let err = decode(p(), &encode(&s).unwrap()).unwrap_err();
            assert!(matches!(err, Error::SnapshotCorrupt { .. }), "{name}: {err:?}");
        }
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            prop_assert!(decode(p(), &bytes).is_err());
        }

        #[test]
        fn random_payload_behind_a_valid_header_never_panics(
            payload in proptest::collection::vec(any::<u8>(), 0..8192)
        ) {
            let mut bytes = Vec::new();
            bytes.extend_from_slice(&MAGIC);
            bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
            bytes.extend_from_slice(&0u32.to_le_bytes());
            bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
            bytes.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
            bytes.extend_from_slice(&0u32.to_le_bytes());
            bytes.extend_from_slice(&payload);
            let _ = decode(p(), &bytes);
        }

        #[test]
        fn any_single_byte_change_is_detected(at in 0usize..100_000, flip in 1u8..=255) {
            prop_assert!(decode(p(), &flipped(encode(&sample()).unwrap(), at, flip)).is_err());
        }
    }
}
