//! The virtio devices of a Linux guest on virtio-mmio: block (base + overlay), vsock (a Unix
//! socket per sandbox on the host side), rng, net (a tap in the sandbox's guest network
//! namespace); and the thread that serves vsock's and net's host sides while the guest runs.

use super::error::{LinuxError, LinuxResult};
use crate::seccomp::{self, ThreadKind};
use branchbox_disk::OverlayBackend;
use branchbox_virtio::blk::Block;
use branchbox_virtio::mmio::MmioTransport;
use branchbox_virtio::net::{Net, Tap};
use branchbox_virtio::rng::Rng;
use branchbox_virtio::vsock::Vsock;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

/// A device on the virtio-mmio transport over this VM's RAM.
pub type Transport<D> = MmioTransport<D, Arc<GuestMemoryMmap>>;

/// The guest's vsock device, served from the host side by [`serve_host_sides`].
pub(super) type VsockTransport = Arc<Mutex<Transport<Vsock>>>;

/// The guest's net device, served from the host side by [`serve_host_sides`].
pub(super) type NetTransport = Arc<Mutex<Transport<Net>>>;

/// A virtio device the VM keeps a typed handle to, so that a snapshot can save it.
#[derive(Clone)]
pub(super) enum VirtioHandle {
    Block(Arc<Mutex<Transport<Block>>>),
    Vsock(VsockTransport),
    Rng(Arc<Mutex<Transport<Rng>>>),
    Net(NetTransport),
}

/// Locks a device (or vCPU); a panic on another thread while it held the lock leaves the
/// state as it was, which a VMM that keeps running must still reach.
pub(super) fn lock<T: ?Sized>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A block device over the read-only `base` and the writable `overlay` (created at the
/// base's size if missing).
pub(super) fn block(base: &Path, overlay: &Path, id: &str) -> LinuxResult<Block> {
    let backend = OverlayBackend::open(base, overlay)
        .map_err(|e| LinuxError::Device { what: "virtio-blk", detail: e.to_string() })?;
    Ok(Block::new(Box::new(backend), id))
}

/// A vsock device for guest CID `cid`, its host side listening on the Unix socket `socket`.
pub(super) fn vsock(cid: u64, socket: &Path) -> LinuxResult<Vsock> {
    Vsock::new(cid, socket).map_err(|e| LinuxError::Device { what: "virtio-vsock", detail: e.to_string() })
}

/// Where a guest's network interface attaches: a tap of the sandbox's guest network namespace
/// (`bbg-<16 hex>` under /run/netns, named by the sandbox id; docs/network.md).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub struct NetAttach {
    /// The sandbox whose network it is (`sbx-<16 hex>`): its guest namespace holds the tap,
    /// and the VMM process serves its resolver on its gateway, as the gvisor backend's shim
    /// does.
    pub sandbox: String,
    /// The tap in that namespace (`tap0`): 1-15 letters, digits, `-` or `_`.
    pub tap: String,
    /// Where the sandbox's policy record is (`branchbox_net::record`), read by each query of
    /// the resolver; an absolute path.
    pub policy_dir: std::path::PathBuf,
}

impl NetAttach {
    /// Checks what can be checked before touching anything; returns what is wrong.
    pub fn check(&self) -> Result<(), String> {
        if !self.policy_dir.is_absolute() {
            return Err(format!(
                "policy directory {} is a relative path; give an absolute path",
                self.policy_dir.display()
            ));
        }
        branchbox_net::Names::of(&self.sandbox).map_err(|e| e.to_string())?;
        let ok = (1..=15).contains(&self.tap.len())
            && self.tap.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !ok {
            return Err(format!("tap name {:?} is not 1-15 letters, digits, '-' or '_'", self.tap));
        }
        Ok(())
    }
}

/// Serves the resolver of the sandbox `at` names from this process, on its gateway in its
/// router namespace, for as long as the process lives; each query follows the policy recorded
/// then (`branchbox_net::dns`). Its threads are the control thread's children, outside the
/// device threads' seccomp filters: they open sockets, which those filters forbid. They, and
/// the `nft`s they run, live in the resolver's CPU cgroup (`branchbox_net::resolver_cgroup`),
/// a quarter of one core, as the gvisor backend's do.
pub(super) fn serve_resolver(at: &NetAttach) -> LinuxResult<()> {
    let what = "the sandbox's resolver";
    let err = |e: branchbox_net::Error| LinuxError::Device { what, detail: e.to_string() };
    let cfg = branchbox_net::NetConfig::from_env().map_err(err)?;
    let dir = at.policy_dir.clone();
    let sandbox = at.sandbox.clone();
    branchbox_net::resolver_cgroup::start_inside(&at.sandbox, "branchbox-vmm", move || {
        let policy = Box::new(move || branchbox_net::record::recorded(&dir).ok().flatten());
        branchbox_net::dns::start(cfg, &sandbox, policy)
    })
    .map_err(|_| LinuxError::Device { what, detail: "panicked while starting".into() })?
    .map_err(err)
}

/// Opens the tap `at` names in its sandbox's guest namespace, from a short-lived thread that
/// enters the namespace (`branchbox_net::in_netns`); the descriptor works from any namespace,
/// and the VMM's own threads never change namespace.
pub(super) fn open_tap(at: &NetAttach) -> LinuxResult<Tap> {
    let err = |detail: String| LinuxError::Device { what: "virtio-net", detail };
    let ns = branchbox_net::Names::of(&at.sandbox).map_err(|e| err(e.to_string()))?.guest_ns;
    let tap = at.tap.clone();
    let opened = branchbox_net::in_netns(&ns, move || Tap::open(&tap)).map_err(|e| err(e.to_string()))?;
    opened.map_err(|e| err(format!("tap {} in {ns}: {e}", at.tap)))
}

/// The devices with a host side, each polled by [`serve_host_sides`].
#[derive(Clone, Default)]
pub(super) struct HostSides {
    pub(super) vsock: Option<VsockTransport>,
    pub(super) net: Option<NetTransport>,
}

impl HostSides {
    pub(super) fn is_empty(&self) -> bool {
        self.vsock.is_none() && self.net.is_none()
    }
}

/// Serves the host sides of the guest's vsock and net devices until `stop` is signalled: waits
/// for host events (vsock clients connecting or sending, frames arriving on the tap) and lets
/// each transport move what they produced into the guest's queues. The thread confines itself
/// to the VMM thread's system calls first.
pub(super) fn serve_host_sides(sides: &HostSides, stop: &EventFd) -> LinuxResult<()> {
    let epoll = Epoll::new().map_err(epoll_err)?;
    if let Some(vsock) = &sides.vsock {
        epoll.add(lock(vsock).device().host_event_fd(), VSOCK).map_err(epoll_err)?;
    }
    if let Some(net) = &sides.net {
        epoll.add(lock(net).device().host_event_fd(), NET).map_err(epoll_err)?;
    }
    epoll.add(stop.as_raw_fd(), STOP).map_err(epoll_err)?;
    seccomp::apply(ThreadKind::Vmm)?;
    // Work the devices already hold goes to the guest now, before any host event: after a
    // restore the vsock device holds the transport-reset event. Delivered only with the first
    // host connection, it reached the guest together with that connection's request, and the
    // guest reset the connection it had just accepted (the agent logged "Transport endpoint
    // is not connected" and the host's handshake waited out its 60 s).
    if let Some(vsock) = &sides.vsock {
        lock(vsock).process_pending();
    }
    if let Some(net) = &sides.net {
        lock(net).process_pending();
    }
    let mut events = [libc::epoll_event { events: 0, u64: 0 }; 3];
    loop {
        let n = match epoll.wait(&mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(epoll_err(e)),
        };
        let ready = || events[..n].iter().map(|e| e.u64);
        if ready().any(|t| t == STOP) {
            return Ok(());
        }
        if let Some(vsock) = sides.vsock.as_ref().filter(|_| ready().any(|t| t == VSOCK)) {
            let mut t = lock(vsock);
            t.device_mut().handle_host_events();
            t.process_pending();
        }
        if let Some(net) = sides.net.as_ref().filter(|_| ready().any(|t| t == NET)) {
            let mut t = lock(net);
            t.device_mut().handle_host_events();
            t.process_pending();
        }
    }
}

const VSOCK: u64 = 1;
const STOP: u64 = 2;
const NET: u64 = 3;

fn epoll_err(e: std::io::Error) -> LinuxError {
    LinuxError::Device { what: "the devices' host thread", detail: format!("epoll: {e}") }
}

/// A minimal epoll set: the descriptors the devices' host thread waits on.
struct Epoll(OwnedFd);

impl Epoll {
    fn new() -> std::io::Result<Epoll> {
        // SAFETY: plain syscall; a non-negative result is a new descriptor we own.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        Ok(Epoll(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn add(&self, fd: RawFd, token: u64) -> std::io::Result<()> {
        let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: token };
        // SAFETY: both descriptors are open; `ev` lives for the call.
        if unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn wait(&self, events: &mut [libc::epoll_event]) -> std::io::Result<usize> {
        let max = i32::try_from(events.len()).unwrap_or(i32::MAX);
        // SAFETY: `events` is valid for `max` entries for the duration of the call.
        let n = unsafe { libc::epoll_wait(self.0.as_raw_fd(), events.as_mut_ptr(), max, -1) };
        usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
    }
}

/// Longest `OK <port>` answer line accepted from the vsock device's host side.
const MAX_OK_LINE: usize = 32;

/// Opens a stream to the guest's vsock `port` through the device's Unix socket at `socket`:
/// connects, sends `CONNECT <port>\n` and reads the `OK <host_port>\n` line. Fails when the
/// device refuses (nothing listens on that guest port yet) or answers anything else.
pub fn connect_guest_port(
    socket: &Path,
    port: u32,
    timeout: std::time::Duration,
) -> std::io::Result<UnixStream> {
    use std::io::{Read, Write};
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(format!("CONNECT {port}\n").as_bytes())?;
    let mut line = Vec::with_capacity(MAX_OK_LINE);
    let mut byte = [0u8; 1];
    // Byte by byte: what follows the line is the guest's stream and must stay unread.
    while line.len() < MAX_OK_LINE {
        if stream.read(&mut byte)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                format!("the vsock device closed the connection: nothing listens on guest port {port}"),
            ));
        }
        if byte[0] == b'\n' {
            let text = String::from_utf8_lossy(&line);
            if text.starts_with("OK ") {
                stream.set_read_timeout(None)?;
                return Ok(stream);
            }
            return Err(std::io::Error::other(format!(
                "the vsock device answered {text:?} to CONNECT {port}"
            )));
        }
        line.push(byte[0]);
    }
    Err(std::io::Error::other(format!(
        "the vsock device's answer to CONNECT {port} is longer than {MAX_OK_LINE} bytes"
    )))
}
