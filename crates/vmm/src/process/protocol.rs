//! The control protocol between the engine and one VMM process, over a Unix socket.
//!
//! A frame is a 4-byte little-endian payload length followed by that many bytes of JSON: one
//! [`Request`] from the engine, or one [`Response`] from the VMM. Replies come in request
//! order, one per request. The first request must be [`Request::Hello`] with this build's
//! [`PROTOCOL_VERSION`]; anything else first is refused. Every frame is capped at
//! [`MAX_FRAME`] bytes: a declared length over it is refused before anything is read, and
//! the connection closes (the stream cannot be resynchronised). A frame that is not a valid
//! message gets an [`ErrorKind::Protocol`] reply and the connection goes on.
//!
//! JSON rather than bincode: messages are few and small (paths, a status), and a
//! self-describing format lets a newer peer's unknown message fail with a message naming it
//! instead of decoding into the wrong variant.

use crate::config::VmConfig;
use crate::linux::NetAttach;
use crate::synthetic::testguest::{Answer, Command};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::path::PathBuf;

/// The protocol version this build speaks; both sides must speak the same one (2 added
/// [`Request::BootLinux`]; 3 gave it a layered disk instead of an overlay file, and added
/// [`Request::RestoreLinux`] and snapshots of Linux guests; 4 added a network interface to
/// both).
pub const PROTOCOL_VERSION: u32 = 4;

/// Largest frame payload either side accepts, in bytes.
pub const MAX_FRAME: usize = 64 * 1024;

/// Longest kernel command-line addition a [`BootLinux`] may carry, in bytes: the VMM's own
/// part must still fit with it in the kernel's 2048-byte command line.
pub const MAX_CMDLINE_EXTRA: usize = 1024;

/// What to boot in a [`Request::BootLinux`]. Every path is absolute: the VMM's working
/// directory is not the engine's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub struct BootLinux {
    /// The uncompressed kernel (`vmlinux`, ELF).
    pub kernel: PathBuf,
    /// The read-only root disk (the guest's `/dev/vda`).
    pub disk: PathBuf,
    /// The layer store the sandbox's disk lives in (created if missing): the guest writes
    /// the top of chain `disk_chain` over the base `disk`, and snapshots freeze it.
    pub disk_store: PathBuf,
    /// The sandbox's chain in `disk_store` (created over `disk` if missing).
    pub disk_chain: String,
    /// Added to the VMM's own command line (`root=/dev/vda console=ttyS0 ...`): at most
    /// [`MAX_CMDLINE_EXTRA`] bytes of printable ASCII.
    pub cmdline_extra: String,
    /// Guest RAM in bytes.
    pub mem_size: u64,
    /// Number of vCPUs.
    pub vcpus: u8,
    /// Where the vsock device's host side listens (`CONNECT <port>`).
    pub vsock_socket: PathBuf,
    /// Where the guest's serial console goes (created, truncated, capped).
    pub serial_log: PathBuf,
    /// The guest's network interface, for a networked sandbox (its `ip=` address goes in
    /// `cmdline_extra`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net: Option<NetAttach>,
}

impl BootLinux {
    /// Checks what the VMM can check before touching anything: absolute paths and the
    /// command-line addition's size and characters. Returns what is wrong.
    pub fn check(&self) -> Result<(), String> {
        for (what, path) in [
            ("kernel", &self.kernel),
            ("disk", &self.disk),
            ("disk_store", &self.disk_store),
            ("vsock_socket", &self.vsock_socket),
            ("serial_log", &self.serial_log),
        ] {
            if !path.is_absolute() {
                return Err(format!(
                    "{what} {} is a relative path; the VMM's working directory is not the engine's, give an absolute path",
                    path.display()
                ));
            }
        }
        check_chain_name(&self.disk_chain)?;
        if let Some(net) = &self.net {
            net.check()?;
        }
        if self.cmdline_extra.len() > MAX_CMDLINE_EXTRA {
            return Err(format!(
                "the command-line addition is {} bytes, over the limit of {MAX_CMDLINE_EXTRA}",
                self.cmdline_extra.len()
            ));
        }
        if let Some(c) = self.cmdline_extra.chars().find(|c| !(c.is_ascii_graphic() || *c == ' ')) {
            return Err(format!(
                "the command-line addition holds {c:?}; only printable ASCII and spaces are allowed"
            ));
        }
        Ok(())
    }
}

/// Chain names are what a layer store accepts (1-64 of letters, digits, `-`, `_`); checked
/// here so the answer names the field.
fn check_chain_name(name: &str) -> Result<(), String> {
    let ok = (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(format!("disk chain name {name:?} is not 1-64 letters, digits, '-' or '_'"))
    }
}

/// What to restore in a [`Request::RestoreLinux`]: a Linux guest's snapshot directory and
/// this VM's own files. Every path is absolute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub struct RestoreLinux {
    /// The snapshot directory (`linux.state`, `memory.bin`).
    pub dir: PathBuf,
    /// This guest's serial log (created, truncated): its output from the snapshot on.
    pub serial_log: PathBuf,
    /// Where this guest's vsock device listens.
    pub vsock_socket: PathBuf,
    /// This guest's layer store (created if missing): the snapshot's frozen disk is recorded
    /// there (its layers hard-linked) and the new top written there.
    pub disk_store: PathBuf,
    /// This guest's new disk chain in `disk_store`: a new top over the snapshot's frozen disk.
    pub disk_chain: String,
    /// Run the guest right away instead of leaving it paused.
    pub resume: bool,
    /// Where the guest's network interface attaches, for a snapshot of a networked guest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net: Option<NetAttach>,
}

impl RestoreLinux {
    /// Checks the paths are absolute and the chain name is one a store accepts.
    pub fn check(&self) -> Result<(), String> {
        for (what, path) in [
            ("dir", &self.dir),
            ("serial_log", &self.serial_log),
            ("vsock_socket", &self.vsock_socket),
            ("disk_store", &self.disk_store),
        ] {
            if !path.is_absolute() {
                return Err(format!(
                    "{what} {} is a relative path; the VMM's working directory is not the engine's, give an absolute path",
                    path.display()
                ));
            }
        }
        if let Some(net) = &self.net {
            net.check()?;
        }
        check_chain_name(&self.disk_chain)
    }
}

/// What the engine asks a VMM process to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Version handshake; must be the first request.
    Hello {
        /// The engine's [`PROTOCOL_VERSION`].
        version: u32,
    },
    /// What the process holds and what its guest is doing.
    Status,
    /// Installs the synthetic test guest into the idle shell (the guest is then paused).
    BootTestGuest,
    /// Restores snapshot `name` of the store `dir` into the idle shell: maps its memory
    /// layers `MAP_PRIVATE` over the shell's RAM and loads CPU and device state.
    Restore {
        /// Absolute path of the snapshot directory.
        dir: PathBuf,
        /// Snapshot name (`vm` is the default one).
        name: String,
        /// Run the guest right away instead of leaving it paused.
        resume: bool,
    },
    /// Boots a Linux guest in the idle process (its shell is dropped for it); the guest
    /// runs right away and [`Request::Status`] reports when it ends and why.
    BootLinux(BootLinux),
    /// Restores a Linux guest's snapshot into the idle process (its shell is dropped for
    /// it); the guest continues where the snapshot's stopped.
    RestoreLinux(RestoreLinux),
    /// Stops the guest from running further commands.
    Pause,
    /// Lets a paused guest run again.
    Resume,
    /// Takes a full, durable snapshot of the paused guest into `dir` (as `vm` for the test
    /// guest; `linux.state` and `memory.bin` for a Linux guest, whose disk is frozen too).
    Snapshot {
        /// Absolute path of an existing directory.
        dir: PathBuf,
    },
    /// Checkpoints the paused guest as `name` in `dir`; the delta layer is written in the
    /// background (the reply comes once the guest may run again).
    Checkpoint {
        /// Absolute path of an existing directory.
        dir: PathBuf,
        /// Checkpoint name (letters, digits, `-`, `_`).
        name: String,
    },
    /// Returns the paused guest, in place, to snapshot `name` of `dir`.
    Rollback {
        /// Absolute path of the snapshot directory.
        dir: PathBuf,
        /// Snapshot name.
        name: String,
    },
    /// Gives the running test guest a command and waits for its doorbell.
    Call {
        /// The command.
        command: Command,
    },
    /// Ends the process (after the reply).
    Shutdown,
}

/// What a VMM process answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Response {
    /// The handshake's answer.
    Hello {
        /// The VMM's [`PROTOCOL_VERSION`].
        version: u32,
        /// The VMM's process id.
        pid: u32,
        /// The shape of the shell it holds.
        config: VmConfig,
        /// Whether its vCPU thread runs under the `Vcpu` seccomp filter.
        confined: bool,
    },
    /// The answer to [`Request::Status`].
    Status(Status),
    /// The request was carried out.
    Done,
    /// A checkpoint was taken.
    Checkpoint {
        /// How long the guest stayed paused for it, in microseconds.
        pause_us: u64,
        /// Pages its new layer holds.
        pages: u64,
        /// The process writing its delta layer, if any.
        writer_pid: Option<u32>,
    },
    /// The test guest's answer.
    Answer(Answer),
    /// The request failed; nothing changed unless the message says so.
    Error(RemoteError),
}

/// A VMM process's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub struct Status {
    /// The process id.
    pub pid: u32,
    /// The shape of its VM.
    pub config: VmConfig,
    /// What its VM is doing.
    pub state: VmState,
}

/// What a VMM process's VM is doing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum VmState {
    /// An empty shell, waiting for a restore or a boot.
    Idle,
    /// A guest is loaded and does not run.
    Paused,
    /// A guest is loaded and runs.
    Running,
    /// The guest stopped on its own (triple fault, halt, entry failure); the process keeps
    /// it for inspection until shut down.
    GuestExited {
        /// What the VMM saw.
        reason: String,
    },
}

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub struct RemoteError {
    /// The kind of failure.
    pub kind: ErrorKind,
    /// What failed and what to do about it.
    pub message: String,
}

impl std::fmt::Display for RemoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

/// Kinds of failure a VMM process reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The peers speak different protocol versions.
    Version,
    /// A request came before the handshake.
    NoHello,
    /// The frame was not a valid request.
    Protocol,
    /// The request does not fit the VM's state (restore into a busy process, run a paused
    /// guest, ...).
    State,
    /// A request's argument was refused (a relative path, a bad name).
    Argument,
    /// The snapshot is for a VM of another shape than this process's shell.
    Shape,
    /// The snapshot could not be opened or used.
    Snapshot,
    /// The guest stopped; see [`VmState::GuestExited`].
    Guest,
    /// A Linux guest could not be built or booted (kernel, disk, devices).
    Boot,
    /// The request is not built for the guest this process runs (snapshots of a Linux
    /// guest, test-guest commands to a Linux guest).
    Unsupported,
    /// The VMM failed (KVM, memory).
    Vmm,
}

/// A frame that could not be read or decoded.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The declared length is over the limit.
    #[error("a frame of {len} bytes exceeds the limit of {max} bytes; messages are small, so the peer is not a branchbox VMM of this version or is misbehaving")]
    TooLarge {
        /// Declared length.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// The stream ended inside a frame.
    #[error("the connection closed in the middle of a frame ({got} of {want} bytes)")]
    Truncated {
        /// Bytes received.
        got: usize,
        /// Bytes declared (with the length prefix).
        want: usize,
    },
    /// The payload is not a valid message.
    #[error("not a valid message: {0}")]
    Decode(String),
    /// Reading or writing the socket failed.
    #[error("socket {op} failed: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Encodes `msg` as one frame (length prefix and payload).
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    let payload = serde_json::to_vec(msg).map_err(|e| FrameError::Decode(e.to_string()))?;
    if payload.len() > MAX_FRAME {
        return Err(FrameError::TooLarge { len: payload.len() as u64, max: MAX_FRAME });
    }
    let mut frame = Vec::with_capacity(4 + payload.len());
    frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.extend_from_slice(&payload);
    Ok(frame)
}

/// Writes `msg` as one frame.
pub fn write_message<T: Serialize>(w: &mut impl Write, msg: &T) -> Result<(), FrameError> {
    let frame = encode(msg)?;
    w.write_all(&frame).map_err(|source| FrameError::Io { op: "write", source })
}

/// Reads one frame's payload; `None` when the stream ended cleanly between frames.
pub fn read_frame(r: &mut impl Read) -> Result<Option<Vec<u8>>, FrameError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < len.len() {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(FrameError::Truncated { got, want: 4 }),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(source) => return Err(FrameError::Io { op: "read", source }),
        }
    }
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_FRAME {
        return Err(FrameError::TooLarge { len: n as u64, max: MAX_FRAME });
    }
    let mut payload = vec![0u8; n];
    let mut got = 0;
    while got < n {
        match r.read(&mut payload[got..]) {
            Ok(0) => return Err(FrameError::Truncated { got: got + 4, want: n + 4 }),
            Ok(k) => got += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(source) => return Err(FrameError::Io { op: "read", source }),
        }
    }
    Ok(Some(payload))
}

/// Decodes a frame's payload as a message (no trailing bytes, JSON nesting bounded by
/// `serde_json`'s recursion limit).
pub fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, FrameError> {
    serde_json::from_slice(payload).map_err(|e| FrameError::Decode(e.to_string()))
}

/// Reads frames from `data` as a peer would, decoding each as a request and as a response,
/// until the bytes run out or a frame is refused. For the fuzz target: must never panic, and
/// every decoded message must encode and decode back to itself.
pub fn fuzz_frames(data: &[u8]) {
    let mut cursor = std::io::Cursor::new(data);
    while let Ok(Some(payload)) = read_frame(&mut cursor) {
        if let Ok(req) = decode::<Request>(&payload) {
            let again = encode(&req).ok().and_then(|f| f.get(4..).map(decode::<Request>));
            assert!(matches!(again, Some(Ok(ref r)) if *r == req), "request did not round-trip: {req:?}");
        }
        if let Ok(resp) = decode::<Response>(&payload) {
            let again = encode(&resp).ok().and_then(|f| f.get(4..).map(decode::<Response>));
            assert!(matches!(again, Some(Ok(ref r)) if *r == resp), "response did not round-trip: {resp:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_round_trips_through_a_frame() {
        let req = Request::Restore { dir: "/tmp/s".into(), name: "vm".into(), resume: true };
        let frame = encode(&req).unwrap();
        let payload = read_frame(&mut frame.as_slice()).unwrap().unwrap();
        assert_eq!(decode::<Request>(&payload).unwrap(), req);
    }

    #[test]
    fn an_oversized_length_is_refused_before_reading_the_payload() {
        let mut frame = ((MAX_FRAME + 1) as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(b"{}");
        let err = read_frame(&mut frame.as_slice()).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { len, .. } if len == MAX_FRAME as u64 + 1), "{err}");
    }

    #[test]
    fn truncated_frames_and_unknown_fields_are_errors() {
        assert!(matches!(read_frame(&mut &[1u8, 0][..]), Err(FrameError::Truncated { .. })));
        assert!(matches!(read_frame(&mut &[5u8, 0, 0, 0, b'{'][..]), Err(FrameError::Truncated { .. })));
        assert!(read_frame(&mut &[][..]).unwrap().is_none());
        assert!(decode::<Request>(br#"{"hello":{"version":1,"extra":2}}"#).is_err());
        assert!(decode::<Request>(br#""status" trailing"#).is_err());
        assert_eq!(decode::<Request>(br#""status""#).unwrap(), Request::Status);
    }

    #[test]
    fn boot_linux_refuses_relative_paths_and_oversized_or_odd_command_lines() {
        let boot = BootLinux {
            kernel: "/k/vmlinux".into(),
            disk: "/d/rootfs.ext4".into(),
            disk_store: "/s/disk".into(),
            disk_chain: "root".into(),
            cmdline_extra: "branchbox.hostname=a".into(),
            mem_size: 256 << 20,
            vcpus: 1,
            vsock_socket: "/s/vsock.sock".into(),
            serial_log: "/s/serial.log".into(),
            net: None,
        };
        assert_eq!(boot.check(), Ok(()));
        let net =
            NetAttach { tap: "tap0".into(), sandbox: "sbx-0123456789abcdef".into(), policy_dir: "/s".into() };
        let networked = BootLinux { net: Some(net.clone()), ..boot.clone() };
        assert_eq!(networked.check(), Ok(()));
        let frame = encode(&Request::BootLinux(networked.clone())).unwrap();
        assert_eq!(decode::<Request>(&frame[4..]).unwrap(), Request::BootLinux(networked));
        for (bad, says) in [
            (NetAttach { tap: "tap0 up".into(), ..net.clone() }, "tap name \"tap0 up\""),
            (NetAttach { tap: "a".repeat(16), ..net.clone() }, "is not 1-15"),
            (NetAttach { tap: String::new(), ..net.clone() }, "is not 1-15"),
            (NetAttach { sandbox: "sbx-../x".into(), ..net.clone() }, "is not a sandbox id"),
            (NetAttach { policy_dir: "s".into(), ..net.clone() }, "policy directory s is a relative path"),
        ] {
            let e = BootLinux { net: Some(bad), ..boot.clone() }.check().unwrap_err();
            assert!(e.contains(says), "{e}");
        }
        let relative = BootLinux { disk_store: "disk".into(), ..boot.clone() };
        assert!(relative.check().unwrap_err().contains("disk_store disk is a relative path"));
        let chain = BootLinux { disk_chain: "../x".into(), ..boot.clone() };
        assert!(chain.check().unwrap_err().contains("disk chain name \"../x\""));
        let long = BootLinux { cmdline_extra: "a".repeat(MAX_CMDLINE_EXTRA + 1), ..boot.clone() };
        assert!(long.check().unwrap_err().contains("1025 bytes, over the limit of 1024"));
        let newline = BootLinux { cmdline_extra: "a\ninit=/bin/sh".into(), ..boot.clone() };
        assert!(newline.check().unwrap_err().contains("'\\n'"));
        let req = Request::BootLinux(boot);
        let frame = encode(&req).unwrap();
        assert_eq!(decode::<Request>(&frame[4..]).unwrap(), req);
    }

    #[test]
    fn restore_linux_refuses_relative_paths_and_chain_names_a_store_refuses() {
        let req = RestoreLinux {
            dir: "/snap".into(),
            serial_log: "/s/serial.log".into(),
            vsock_socket: "/s/vsock.sock".into(),
            disk_store: "/s/disk".into(),
            disk_chain: "root".into(),
            resume: true,
            net: None,
        };
        assert_eq!(req.check(), Ok(()));
        let net =
            NetAttach { tap: "tap0".into(), sandbox: "sbx-0123456789abcdef".into(), policy_dir: "s".into() };
        let e = RestoreLinux { net: Some(net), ..req.clone() }.check().unwrap_err();
        assert!(e.contains("policy directory s is a relative path"), "{e}");
        let relative = RestoreLinux { disk_store: "disk".into(), ..req.clone() };
        assert!(relative.check().unwrap_err().contains("disk_store disk is a relative path"));
        let chain = RestoreLinux { disk_chain: "a/b".into(), ..req.clone() };
        assert!(chain.check().unwrap_err().contains("disk chain name \"a/b\""));
        let frame = encode(&Request::RestoreLinux(req.clone())).unwrap();
        assert_eq!(decode::<Request>(&frame[4..]).unwrap(), Request::RestoreLinux(req));
    }

    #[test]
    fn fuzz_entry_survives_arbitrary_bytes() {
        fuzz_frames(&[0xff; 16]);
        fuzz_frames(b"\x08\0\0\0\"status\"\x02\0\0\0{}");
        let mut seed = encode(&Request::Call { command: Command::Ping }).unwrap();
        seed.extend(encode(&Response::Done).unwrap());
        fuzz_frames(&seed);
    }
}
