//! The virtio devices of a Linux guest on virtio-mmio: block (base + overlay), vsock (a Unix
//! socket per sandbox on the host side), rng; and the thread that serves vsock's host side
//! while the guest runs.

use super::builder::LinuxVm;
use super::error::{LinuxError, LinuxResult};
use branchbox_devices::BusDevice;
use branchbox_virtio::blk::{Block, OverlayBackend};
use branchbox_virtio::mmio::MmioTransport;
use branchbox_virtio::rng::Rng;
use branchbox_virtio::vsock::Vsock;
use branchbox_virtio::VirtioDevice;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

/// A device on the virtio-mmio transport over this VM's RAM.
pub type Transport<D> = MmioTransport<D, Arc<GuestMemoryMmap>>;

/// The guest's vsock device, served from the host side by [`serve_vsock_host`].
pub(super) type VsockTransport = Arc<Mutex<Transport<Vsock>>>;

impl LinuxVm {
    /// Adds a virtio block device over the read-only `base` and the writable `overlay`
    /// (created at the base's size if missing). The first one is the guest's `/dev/vda`.
    pub fn add_block(&mut self, base: &Path, overlay: &Path, id: &str) -> LinuxResult<()> {
        let backend = OverlayBackend::open(base, overlay)
            .map_err(|e| LinuxError::Device { what: "virtio-blk", detail: e.to_string() })?;
        self.add_virtio(Block::new(Box::new(backend), id)).map(|_| ())
    }

    /// Adds a virtio entropy device.
    pub fn add_rng(&mut self) -> LinuxResult<()> {
        self.add_virtio(Rng::new()).map(|_| ())
    }

    /// Adds a vsock device for guest CID `cid` whose host side listens on the Unix socket
    /// `socket`: a host client connects, writes `CONNECT <port>\n`, reads `OK <port>\n`.
    pub fn add_vsock(&mut self, cid: u64, socket: &Path) -> LinuxResult<()> {
        if self.vsock.is_some() {
            return Err(LinuxError::Config("a guest has one vsock device".into()));
        }
        let vsock = Vsock::new(cid, socket)
            .map_err(|e| LinuxError::Device { what: "virtio-vsock", detail: e.to_string() })?;
        self.vsock = Some(self.add_virtio(vsock)?);
        Ok(())
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
}

/// Serves the vsock device's host side until `stop` is signalled: waits for host events
/// (clients connecting, data to forward) and lets the transport move what they produced into
/// the guest's queues.
pub(super) fn serve_vsock_host(vsock: &VsockTransport, stop: &EventFd) {
    let host_fd = vsock.lock().unwrap_or_else(|e| e.into_inner()).device().host_event_fd();
    let mut fds = [
        libc::pollfd { fd: host_fd, events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: stop.as_raw_fd(), events: libc::POLLIN, revents: 0 },
    ];
    loop {
        // SAFETY: `fds` is a valid array of two pollfds for the duration of the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        if fds[0].revents != 0 {
            let mut t = vsock.lock().unwrap_or_else(|e| e.into_inner());
            t.device_mut().handle_host_events();
            t.process_pending();
        }
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
