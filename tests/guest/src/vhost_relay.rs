//! A relay between QEMU and our vhost-user net server that holds back the ring enables QEMU's
//! virtio-net sends before it has set the features.
//!
//! QEMU's virtio-net (7.2 and 10.0 alike) sends `SET_VRING_ENABLE` when the guest negotiates
//! its features, before `SET_FEATURES`; vhost-user-backend 0.24 (and the vhost crate under it)
//! refuses that message until `VHOST_USER_F_PROTOCOL_FEATURES` has been acked by
//! `SET_FEATURES`, and ends the session. Offering no protocol features does not help either:
//! QEMU's vhost-net start then fails when it restores the ring-enable state. So the test puts
//! this relay in between: every message passes unchanged (with its descriptors), except that
//! an early enable is acknowledged here and handed on right after `SET_FEATURES`. Our device
//! code and the library see what a front end that orders its messages by the specification
//! would send. The product does not use vhost-user for net: the VMM serves virtio-net
//! in process.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// vhost-user request numbers and header flags (the vhost-user specification).
const SET_FEATURES: u32 = 2;
const SET_VRING_ENABLE: u32 = 18;
const FLAG_VERSION: u32 = 0x1;
const FLAG_REPLY: u32 = 0x4;
const FLAG_NEED_REPLY: u32 = 0x8;
/// Bytes of a message header: request, flags, payload size.
const HEADER: usize = 12;
/// Most descriptors one message carries (the specification's limit).
const MAX_FDS: usize = 8;
/// The largest payload passed on (a memory table of 8 regions is under 300 bytes).
const MAX_PAYLOAD: usize = 4096;

/// Listens on `front` (QEMU connects there) and relays one connection to the server
/// listening on `back`. Ends when either side closes.
pub fn relay(front: &Path, back: PathBuf) -> JoinHandle<std::io::Result<()>> {
    let listener = UnixListener::bind(front).expect("bind the relay's socket");
    std::thread::spawn(move || {
        let (qemu, _) = listener.accept()?;
        let server = UnixStream::connect(&back)?;
        let to_qemu = Arc::new(Mutex::new(qemu.try_clone()?));
        let (mut replies_from, replies_to) = (server.try_clone()?, Arc::clone(&to_qemu));
        // Replies come whole from the server; copied message by message, so an acknowledgement
        // written here never lands inside one.
        let replies = std::thread::spawn(move || -> std::io::Result<()> {
            loop {
                let mut header = [0u8; HEADER];
                if replies_from.read_exact(&mut header).is_err() {
                    return Ok(());
                }
                let size = u32_at(&header, 8) as usize;
                if size > MAX_PAYLOAD {
                    return Err(std::io::Error::other(format!("a reply of {size} bytes")));
                }
                let mut payload = vec![0u8; size];
                replies_from.read_exact(&mut payload)?;
                let mut q = replies_to.lock().unwrap_or_else(|e| e.into_inner());
                q.write_all(&header)?;
                q.write_all(&payload)?;
            }
        });
        let mut held: Vec<([u8; HEADER], Vec<u8>)> = Vec::new();
        let mut features_set = false;
        let result = (|| -> std::io::Result<()> {
            loop {
                let Some((mut header, fds)) = recv_header(&qemu)? else { return Ok(()) };
                let size = u32_at(&header, 8) as usize;
                if size > MAX_PAYLOAD {
                    return Err(std::io::Error::other(format!("a request of {size} bytes")));
                }
                let mut payload = vec![0u8; size];
                (&qemu).read_exact(&mut payload)?;
                let request = u32_at(&header, 0);
                if request == SET_VRING_ENABLE && !features_set {
                    let flags = u32_at(&header, 4);
                    if flags & FLAG_NEED_REPLY != 0 {
                        let mut ack = [0u8; HEADER + 8];
                        ack[0..4].copy_from_slice(&SET_VRING_ENABLE.to_le_bytes());
                        ack[4..8].copy_from_slice(&(FLAG_VERSION | FLAG_REPLY).to_le_bytes());
                        ack[8..12].copy_from_slice(&8u32.to_le_bytes());
                        to_qemu.lock().unwrap_or_else(|e| e.into_inner()).write_all(&ack)?;
                    }
                    header[4..8].copy_from_slice(&(flags & !FLAG_NEED_REPLY).to_le_bytes());
                    held.push((header, payload));
                    continue;
                }
                send(&server, &header, &payload, &fds)?;
                if request == SET_FEATURES {
                    features_set = true;
                    for (h, p) in held.drain(..) {
                        send(&server, &h, &p, &[])?;
                    }
                }
            }
        })();
        let _ = server.shutdown(std::net::Shutdown::Both);
        let _ = replies.join();
        result
    })
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Reads one header and the descriptors that came with it; `None` when the peer closed.
fn recv_header(s: &UnixStream) -> std::io::Result<Option<([u8; HEADER], Vec<OwnedFd>)>> {
    let mut header = [0u8; HEADER];
    let mut got = 0;
    let mut fds = Vec::new();
    while got < HEADER {
        let mut iov = libc::iovec { iov_base: header[got..].as_mut_ptr().cast(), iov_len: HEADER - got };
        // SAFETY: CMSG_SPACE is a pure computation.
        let space = unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32) } as usize;
        let mut control = vec![0u8; space];
        // SAFETY: msghdr is plain data; zero is a valid start.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: `msg` points at live buffers of the sizes it states.
        let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if n == 0 {
            return Ok(None);
        }
        got += n as usize;
        // SAFETY: walking the control buffer recvmsg filled, with the kernel's macros.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c).cast::<RawFd>();
                    let count =
                        ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                    for i in 0..count {
                        fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
    }
    Ok(Some((header, fds)))
}

/// Sends header and payload as one message, with `fds` attached.
fn send(s: &UnixStream, header: &[u8; HEADER], payload: &[u8], fds: &[OwnedFd]) -> std::io::Result<()> {
    let mut bytes = header.to_vec();
    bytes.extend_from_slice(payload);
    let mut iov = libc::iovec { iov_base: bytes.as_mut_ptr().cast(), iov_len: bytes.len() };
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    // SAFETY: pure computation.
    let space = unsafe { libc::CMSG_SPACE((raw.len() * std::mem::size_of::<RawFd>()) as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: msghdr is plain data; zero is a valid start.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !raw.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: the control buffer has room for one header with `raw.len()` descriptors.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN((raw.len() * std::mem::size_of::<RawFd>()) as u32) as usize;
            std::ptr::copy_nonoverlapping(raw.as_ptr(), libc::CMSG_DATA(c).cast::<RawFd>(), raw.len());
        }
    }
    let mut sent = 0;
    while sent < bytes.len() {
        if sent > 0 {
            // The descriptors went with the first part.
            msg.msg_control = std::ptr::null_mut();
            msg.msg_controllen = 0;
            iov = libc::iovec { iov_base: bytes[sent..].as_mut_ptr().cast(), iov_len: bytes.len() - sent };
            msg.msg_iov = &mut iov;
        }
        // SAFETY: `msg` points at live buffers of the sizes it states.
        let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        sent += n as usize;
    }
    Ok(())
}
