//! A tap device as a [`PacketPort`]: frames without packet information or offload headers
//! (the device strips and adds the virtio header itself), non-blocking.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};

use super::PacketPort;

/// `_IOW('T', 202, int)`: attach to (or create) the tap named in the request.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
/// Longest interface name, without its NUL (`IFNAMSIZ` - 1).
const MAX_NAME: usize = 15;

/// `struct ifreq` as `TUNSETIFF` reads it: the name, then the flags in the union.
#[repr(C)]
struct IfReq {
    name: [u8; 16],
    flags: libc::c_short,
    _rest: [u8; 22],
}

/// An open tap device.
#[derive(Debug)]
pub struct Tap {
    file: File,
    name: String,
}

impl Tap {
    /// Attaches to the tap device `name` in the calling thread's network namespace, creating
    /// it if there is none (a tap made beforehand, as the sandbox's network setup does, must be
    /// a plain tap: `ip tuntap add NAME mode tap`). Needs `CAP_NET_ADMIN` to create one.
    pub fn open(name: &str) -> io::Result<Tap> {
        if name.is_empty() || name.len() > MAX_NAME || name.contains(['/', ' ', '\0']) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{name:?} is not a network interface name (1-{MAX_NAME} bytes, no '/', space or NUL)"
                ),
            ));
        }
        let path = CString::new("/dev/net/tun").expect("no NUL in a literal");
        // SAFETY: a plain open(2) of a NUL-terminated path; a non-negative result is ours.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("opening /dev/net/tun: {e}")));
        }
        // SAFETY: `fd` was just opened and nothing else owns it.
        let file = unsafe { File::from_raw_fd(fd) };
        let mut req = IfReq {
            name: [0; 16],
            flags: (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short,
            _rest: [0; 22],
        };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: TUNSETIFF reads and writes one `struct ifreq`, which `req` is laid out as.
        if unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF as _, &mut req) } < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("attaching to tap {name}: {e}")));
        }
        Ok(Tap { file, name: name.to_string() })
    }

    /// The interface's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl PacketPort for Tap {
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        // One write is one frame; a tap never takes part of one.
        self.file.write(frame).map(drop)
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        match self.file.read(buf) {
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn event_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}
