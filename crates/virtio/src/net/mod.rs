//! virtio-net: one receive and one transmit queue over a host packet port (a tap device in the
//! sandbox's guest network namespace, docs/network.md).
//!
//! Queues: 0 RX (host to guest), 1 TX (guest to host). Every buffer starts with the 12-byte
//! `virtio_net_hdr_v1` (all devices are version 1); the rest is one Ethernet frame. The device
//! offers no offloads (no checksum, no segmentation, no mergeable buffers), so every frame the
//! guest sends is complete and checksummed, and every frame it receives fits one buffer of the
//! size Linux posts without those features (1,518 bytes plus the header). A TX header that asks
//! for an offload the device never offered is refused, not passed on.
//!
//! Frames from the host side do not come through a queue: the transport watches
//! [`Net::host_event_fd`], calls [`Net::handle_host_events`] (which drains the port into a
//! bounded list), then processes RX because [`VirtioDevice::queues_with_work`] names it. Frames
//! that find the list full are dropped and counted, as a NIC drops on a full ring; TCP
//! retransmits, so nothing spins while the guest is slow to post buffers.

mod tap;

pub use tap::Tap;

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixDatagram;

use branchbox_persist::{NoContext, RestoreError, Snapshottable};
use serde::{Deserialize, Serialize};
use virtio_bindings::virtio_ids::VIRTIO_ID_NET;
use virtio_bindings::virtio_net::{VIRTIO_NET_F_MAC, VIRTIO_NET_F_STATUS, VIRTIO_NET_S_LINK_UP};
use virtio_queue::{DescriptorChain, Queue};
use vm_memory::GuestMemory;

use crate::chain::{parse_chain, ChainLimits};
use crate::queue::{fill_chains, process_chains, Answer, Fill, QueueOutcome};
use crate::{DeviceError, VirtioDevice, FEATURE_EVENT_IDX, FEATURE_VERSION_1};

/// The RX queue's index.
pub const RX: usize = 0;
/// The TX queue's index.
pub const TX: usize = 1;
/// Size of each queue.
pub const QUEUE_SIZE: u16 = 256;
/// Bytes of `virtio_net_hdr_v1` before every frame, either way.
pub const HDR_LEN: usize = 12;
/// The largest frame taken from the guest or the host side: an Ethernet frame of the largest
/// IP packet. Without offloads Linux sends at most its MTU plus 14 bytes.
pub const MAX_FRAME: usize = 65_550;
/// Frames from the host side held for the guest at most; more are dropped until it posts
/// buffers.
pub const MAX_PENDING: usize = 256;
/// The MAC address every guest gets: a forked child keeps its source's (docs/network.md).
pub const GUEST_MAC: [u8; 6] = [0x02, 0x62, 0x62, 0x00, 0x00, 0x02];

const TX_LIMITS: ChainLimits = ChainLimits {
    max_descriptors: QUEUE_SIZE as usize,
    max_readable: (HDR_LEN + MAX_FRAME) as u32,
    max_writable: 0,
};
const RX_LIMITS: ChainLimits = ChainLimits {
    max_descriptors: QUEUE_SIZE as usize,
    max_readable: 0,
    // A buffer may be larger than any frame; only what the frame needs is written.
    max_writable: u32::MAX,
};

/// `gso_type` of a header that asks for no segmentation (`VIRTIO_NET_HDR_GSO_NONE`).
const GSO_NONE: u8 = 0;

/// Where a device's frames go and come from on the host.
pub trait PacketPort: Send {
    /// Sends one Ethernet frame. `WouldBlock` means the host side is full; the frame is dropped.
    fn send(&mut self, frame: &[u8]) -> io::Result<()>;
    /// Receives one frame into `buf`; `Ok(None)` when none is waiting.
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>>;
    /// A descriptor that is readable while frames are waiting.
    fn event_fd(&self) -> RawFd;
}

/// A connected datagram socket as a port, one frame per datagram: for tests, and for a
/// user-space switch on the other end. Make it non-blocking before handing it over.
impl PacketPort for UnixDatagram {
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        UnixDatagram::send(self, frame).map(drop)
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        match UnixDatagram::recv(self, buf) {
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn event_fd(&self) -> RawFd {
        self.as_raw_fd()
    }
}

/// What the device passed and dropped so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetCounters {
    /// Frames the guest sent that reached the host side.
    pub tx_frames: u64,
    /// Frames the guest sent that were refused (malformed chain, an offload asked for, too
    /// long) or that the host side could not take.
    pub tx_dropped: u64,
    /// Frames from the host side put into the guest's buffers.
    pub rx_frames: u64,
    /// Frames from the host side dropped: the pending list was full, or the guest's buffer was
    /// too small for the frame.
    pub rx_dropped: u64,
    /// Errors from the host side's port other than "nothing waiting".
    pub port_errors: u64,
}

/// The virtio-net device.
pub struct Net {
    port: Box<dyn PacketPort>,
    mac: [u8; 6],
    acked_features: u64,
    pending: VecDeque<Vec<u8>>,
    counters: NetCounters,
}

/// Saved state of a net device: the MAC and what the driver negotiated. Frames in flight are
/// not saved (a restored guest sees them as lost, and TCP sends them again).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetState {
    /// The guest's MAC address.
    pub mac: [u8; 6],
    /// Features the driver accepted.
    pub acked_features: u64,
}

impl Net {
    /// A net device whose guest has MAC `mac`, passing frames to and from `port`.
    pub fn new(port: Box<dyn PacketPort>, mac: [u8; 6]) -> Net {
        Net { port, mac, acked_features: 0, pending: VecDeque::new(), counters: NetCounters::default() }
    }

    /// The descriptor the transport polls for frames from the host side.
    pub fn host_event_fd(&self) -> RawFd {
        self.port.event_fd()
    }

    /// What the device passed and dropped so far.
    pub fn counters(&self) -> NetCounters {
        self.counters
    }

    /// The guest's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// Drains the host side: every waiting frame goes on the pending list, or is dropped once
    /// [`MAX_PENDING`] frames wait.
    pub fn handle_host_events(&mut self) {
        let mut buf = vec![0u8; MAX_FRAME];
        loop {
            match self.port.recv(&mut buf) {
                Ok(Some(n)) => {
                    if self.pending.len() < MAX_PENDING {
                        self.pending.push_back(buf[..n.min(MAX_FRAME)].to_vec());
                    } else {
                        self.counters.rx_dropped += 1;
                    }
                }
                Ok(None) => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    // A port that keeps failing would keep its descriptor readable; stop this
                    // round and count it, the next event tries again.
                    self.counters.port_errors += 1;
                    return;
                }
            }
        }
    }

    /// Serves one TX chain: checks the header and sends the frame after it.
    pub fn serve_tx<M: GuestMemory>(&mut self, mem: &M, chain: DescriptorChain<&M>) -> Answer {
        let Ok(req) = parse_chain(mem, chain, TX_LIMITS) else {
            self.counters.tx_dropped += 1;
            return Answer::Rejected(0);
        };
        let total = req.readable_len() as usize;
        let mut hdr = [0u8; HDR_LEN];
        if total <= HDR_LEN || req.read_at(mem, 0, &mut hdr).is_err() || !plain_header(&hdr) {
            self.counters.tx_dropped += 1;
            return Answer::Rejected(0);
        }
        let mut frame = vec![0u8; total - HDR_LEN];
        if req.read_at(mem, HDR_LEN as u32, &mut frame).is_err() {
            self.counters.tx_dropped += 1;
            return Answer::Rejected(0);
        }
        match self.port.send(&frame) {
            Ok(()) => self.counters.tx_frames += 1,
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => {
                self.counters.tx_dropped += 1;
                self.counters.port_errors += 1;
            }
            Err(_) => self.counters.tx_dropped += 1,
        }
        Answer::Done(0)
    }

    /// Puts the oldest pending frame into one RX chain, after a header saying one buffer.
    fn fill_rx<M: GuestMemory>(&mut self, mem: &M, chain: DescriptorChain<&M>) -> Fill {
        let Some(frame) = self.pending.pop_front() else { return Fill::PutBack };
        match parse_chain(mem, chain, RX_LIMITS) {
            Ok(buf) if buf.writable_len() as usize >= HDR_LEN + frame.len() => {
                let mut hdr = [0u8; HDR_LEN];
                // num_buffers: always one buffer without VIRTIO_NET_F_MRG_RXBUF.
                hdr[10] = 1;
                if buf.write_at(mem, 0, &hdr).is_ok() && buf.write_at(mem, HDR_LEN as u32, &frame).is_ok() {
                    self.counters.rx_frames += 1;
                    Fill::Used((HDR_LEN + frame.len()) as u32)
                } else {
                    self.counters.rx_dropped += 1;
                    Fill::Rejected(0)
                }
            }
            Ok(_) => {
                // A buffer too small for the frame: the frame is lost, the buffer returned.
                self.counters.rx_dropped += 1;
                Fill::Used(0)
            }
            Err(_) => {
                self.counters.rx_dropped += 1;
                Fill::Rejected(0)
            }
        }
    }
}

/// A TX header that asks for nothing the device did not offer: no checksum to complete, no
/// segmentation. (`flags` bit 0 is `NEEDS_CSUM`, bit 1 `DATA_VALID`, which only the device
/// sets; byte 1 is `gso_type`.)
fn plain_header(hdr: &[u8; HDR_LEN]) -> bool {
    hdr[0] == 0 && hdr[1] == GSO_NONE
}

impl VirtioDevice for Net {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; 2]
    }

    fn features(&self) -> u64 {
        FEATURE_VERSION_1 | FEATURE_EVENT_IDX | 1 << VIRTIO_NET_F_MAC | 1 << VIRTIO_NET_F_STATUS
    }

    fn ack_features(&mut self, features: u64) {
        self.acked_features = features & self.features();
    }

    /// `mac` (6 bytes), `status` (u16: link up).
    fn config(&self) -> Vec<u8> {
        let mut c = self.mac.to_vec();
        c.extend_from_slice(&(VIRTIO_NET_S_LINK_UP as u16).to_le_bytes());
        c
    }

    fn process_queue<M: GuestMemory>(
        &mut self,
        index: usize,
        queue: &mut Queue,
        mem: &M,
    ) -> Result<QueueOutcome, DeviceError> {
        match index {
            RX => fill_chains(RX, queue, mem, self, |n| !n.pending.is_empty(), Net::fill_rx),
            TX => process_chains(index, queue, mem, |chain| self.serve_tx(mem, chain)),
            _ => Err(DeviceError::NoSuchQueue { index, count: 2 }),
        }
    }

    fn queues_with_work(&self) -> u64 {
        if self.pending.is_empty() {
            0
        } else {
            1 << RX
        }
    }

    fn reset(&mut self) {
        self.acked_features = 0;
        self.pending.clear();
    }
}

impl Snapshottable for Net {
    type State = NetState;
    type SaveCtx = NoContext;
    type RestoreCtx = NoContext;
    type Error = RestoreError;

    fn save(&mut self, _ctx: &mut NoContext) -> Result<NetState, RestoreError> {
        Ok(NetState { mac: self.mac, acked_features: self.acked_features })
    }

    fn restore(&mut self, state: &NetState, _ctx: &NoContext) -> Result<(), RestoreError> {
        if state.mac != self.mac {
            return Err(RestoreError::new(
                "virtio-net",
                format!(
                    "saved MAC {} differs from this device's {}; build the device with the saved MAC",
                    format_mac(&state.mac),
                    format_mac(&self.mac)
                ),
            ));
        }
        self.pending.clear();
        self.acked_features = state.acked_features & self.features();
        Ok(())
    }
}

/// `02:62:62:00:00:02`.
pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}
