//! virtio-vsock (stream sockets) with a Unix socket per sandbox on the host side.
//!
//! Queues: 0 RX (host to guest), 1 TX (guest to host), 2 event. Packets are parsed by the
//! `virtio-vsock` crate; connections, credit and the Unix sockets live in [`Muxer`].
//!
//! Host events (a client connecting, data arriving from a client) do not come through a
//! queue: the transport watches [`Vsock::host_event_fd`], calls
//! [`Vsock::handle_host_events`], then processes the queues [`VirtioDevice::queues_with_work`]
//! names.

mod conn;
mod muxer;

pub use conn::CONN_BUF;
pub use muxer::{Header, Muxer, VsockCounters, HOST_CID, MAX_CONNECTIONS, MAX_LINE, MAX_PENDING_CONTROL};

use std::os::unix::io::RawFd;
use std::path::Path;

use branchbox_persist::{NoContext, RestoreError, Snapshottable};
use serde::{Deserialize, Serialize};
use virtio_bindings::virtio_ids::VIRTIO_ID_VSOCK;
use virtio_queue::{DescriptorChain, Queue};
use virtio_vsock::packet::{VsockPacket, PKT_HEADER_SIZE};
use vm_memory::{Bytes, GuestMemory};

use crate::chain::{parse_chain, ChainLimits};
use crate::queue::{fill_chains, process_chains, Answer, Fill, QueueOutcome};
use crate::{DeviceError, VirtioDevice, FEATURE_EVENT_IDX, FEATURE_VERSION_1};

/// The RX queue's index.
pub const RX: usize = 0;
/// The TX queue's index.
pub const TX: usize = 1;
/// The event queue's index.
pub const EVENT: usize = 2;
/// Size of each queue.
pub const QUEUE_SIZE: u16 = 256;
/// Most payload bytes in one packet, either way (Linux sends at most 64 KiB).
pub const MAX_PKT_DATA: u32 = 64 << 10;
/// `VIRTIO_VSOCK_EVENT_TRANSPORT_RESET`.
const EVENT_TRANSPORT_RESET: u32 = 0;

/// Why a vsock device cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum VsockError {
    /// The guest CID is reserved.
    #[error("guest CID {0} is reserved (0, 1, 2 and 2^32-1); give a CID of 3 or more")]
    ReservedCid(u64),
    /// The Unix socket could not be set up.
    #[error("cannot listen on {path}: {source}; check the directory exists and is writable")]
    Listen {
        /// The socket path.
        path: String,
        /// The system's error.
        source: std::io::Error,
    },
}

/// The virtio-vsock device.
pub struct Vsock {
    muxer: Muxer,
    acked_features: u64,
    reset_event_pending: bool,
}

/// Saved state of a vsock device. The connections are recorded but cannot be restored: their
/// host ends are Unix sockets of the process that saved them. A restore drops them and sends
/// the guest `VIRTIO_VSOCK_EVENT_TRANSPORT_RESET`, so its sockets see a reset and reconnect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VsockState {
    /// The guest's CID.
    pub guest_cid: u64,
    /// Features the driver accepted.
    pub acked_features: u64,
    /// Connections open when saved: `(host port, guest port)`.
    pub connections: Vec<(u32, u32)>,
}

impl Vsock {
    /// A vsock device for a guest with CID `guest_cid`, whose host side listens on the Unix
    /// socket `path`.
    pub fn new(guest_cid: u64, path: &Path) -> Result<Vsock, VsockError> {
        if guest_cid <= HOST_CID || guest_cid >= u64::from(u32::MAX) {
            return Err(VsockError::ReservedCid(guest_cid));
        }
        let muxer = Muxer::new(guest_cid, path)
            .map_err(|source| VsockError::Listen { path: path.display().to_string(), source })?;
        Ok(Vsock { muxer, acked_features: 0, reset_event_pending: false })
    }

    /// The fd that becomes readable when the host side has work (an epoll fd).
    pub fn host_event_fd(&self) -> RawFd {
        self.muxer.event_fd()
    }

    /// Serves host-side events: new clients, `CONNECT` lines, streams ready to read or write.
    pub fn handle_host_events(&mut self) {
        self.muxer.handle_host_events();
    }

    /// What the host side refused or dropped so far.
    pub fn counters(&self) -> VsockCounters {
        self.muxer.counters()
    }

    /// Open connections.
    pub fn connections(&self) -> usize {
        self.muxer.connections()
    }

    /// Serves one TX chain: parses the packet and hands it to the muxer.
    pub fn serve_tx<M: GuestMemory>(&mut self, mem: &M, mut chain: DescriptorChain<&M>) -> Answer {
        let Ok(pkt) = VsockPacket::from_tx_virtq_chain(mem, &mut chain, MAX_PKT_DATA) else {
            return Answer::Rejected(0);
        };
        let hdr = Header {
            src_cid: pkt.src_cid(),
            dst_cid: pkt.dst_cid(),
            src_port: pkt.src_port(),
            dst_port: pkt.dst_port(),
            type_: pkt.type_(),
            op: pkt.op(),
            flags: pkt.flags(),
            buf_alloc: pkt.buf_alloc(),
            fwd_cnt: pkt.fwd_cnt(),
        };
        let mut data = vec![0u8; pkt.len() as usize];
        if let Some(slice) = pkt.data_slice() {
            if slice.read_slice(&mut data, 0).is_err() {
                return Answer::Rejected(0);
            }
        }
        self.muxer.handle_tx(&hdr, &data);
        Answer::Done(0)
    }

    /// Fills one RX chain with the next packet the host side has for the guest; a chain the
    /// next packet cannot use goes back to the driver.
    fn fill_rx<M: GuestMemory>(&mut self, mem: &M, mut chain: DescriptorChain<&M>) -> Fill {
        let Ok(mut pkt) = VsockPacket::from_rx_virtq_chain(mem, &mut chain, MAX_PKT_DATA) else {
            return Fill::Rejected(0);
        };
        let room = pkt.data_slice().map_or(0, |s| s.len() as u32).min(MAX_PKT_DATA);
        let Some((hdr, data)) = self.muxer.next_rx(room) else {
            return Fill::PutBack;
        };
        pkt.set_src_cid(hdr.src_cid)
            .set_dst_cid(hdr.dst_cid)
            .set_src_port(hdr.src_port)
            .set_dst_port(hdr.dst_port)
            .set_type(hdr.type_)
            .set_op(hdr.op)
            .set_flags(hdr.flags)
            .set_buf_alloc(hdr.buf_alloc)
            .set_fwd_cnt(hdr.fwd_cnt)
            .set_len(data.len() as u32);
        match pkt.data_slice() {
            Some(slice) if !data.is_empty() && slice.write_slice(&data, 0).is_err() => Fill::Used(0),
            _ => Fill::Used(PKT_HEADER_SIZE as u32 + data.len() as u32),
        }
    }

    /// Delivers the pending transport-reset event into one event chain.
    fn fill_event<M: GuestMemory>(&mut self, mem: &M, chain: DescriptorChain<&M>) -> Fill {
        let limits = ChainLimits { max_descriptors: 4, max_readable: 0, max_writable: 64 };
        match parse_chain(mem, chain, limits) {
            Ok(c) if c.write_at(mem, 0, &EVENT_TRANSPORT_RESET.to_le_bytes()).is_ok() => {
                self.reset_event_pending = false;
                Fill::Used(4)
            }
            _ => Fill::Rejected(0),
        }
    }
}

impl VirtioDevice for Vsock {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_VSOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; 3]
    }

    fn features(&self) -> u64 {
        FEATURE_VERSION_1 | FEATURE_EVENT_IDX
    }

    fn ack_features(&mut self, features: u64) {
        self.acked_features = features & self.features();
    }

    /// `guest_cid` (u64).
    fn config(&self) -> Vec<u8> {
        self.muxer.guest_cid().to_le_bytes().to_vec()
    }

    fn process_queue<M: GuestMemory>(
        &mut self,
        index: usize,
        queue: &mut Queue,
        mem: &M,
    ) -> Result<QueueOutcome, DeviceError> {
        match index {
            RX => fill_chains(RX, queue, mem, self, |v| v.muxer.has_rx_work(), Vsock::fill_rx),
            TX => process_chains(index, queue, mem, |chain| self.serve_tx(mem, chain)),
            EVENT => fill_chains(EVENT, queue, mem, self, |v| v.reset_event_pending, Vsock::fill_event),
            _ => Err(DeviceError::NoSuchQueue { index, count: 3 }),
        }
    }

    fn queues_with_work(&self) -> u64 {
        let rx = if self.muxer.has_rx_work() { 1 << RX } else { 0 };
        let event = if self.reset_event_pending { 1 << EVENT } else { 0 };
        rx | event
    }

    fn reset(&mut self) {
        self.muxer.drop_all();
        self.acked_features = 0;
        self.reset_event_pending = false;
    }
}

impl Snapshottable for Vsock {
    type State = VsockState;
    type SaveCtx = NoContext;
    type RestoreCtx = NoContext;
    type Error = RestoreError;

    fn save(&mut self, _ctx: &mut NoContext) -> Result<VsockState, RestoreError> {
        Ok(VsockState {
            guest_cid: self.muxer.guest_cid(),
            acked_features: self.acked_features,
            connections: self.muxer.connection_keys(),
        })
    }

    fn restore(&mut self, state: &VsockState, _ctx: &NoContext) -> Result<(), RestoreError> {
        if state.guest_cid != self.muxer.guest_cid() {
            return Err(RestoreError::new(
                "virtio-vsock",
                format!(
                    "saved guest CID {} differs from this device's {}; build the device with \
                     the saved CID",
                    state.guest_cid,
                    self.muxer.guest_cid()
                ),
            ));
        }
        self.muxer.drop_all();
        self.muxer.count_dropped_on_restore(state.connections.len());
        self.acked_features = state.acked_features & self.features();
        self.reset_event_pending = true;
        Ok(())
    }
}
