//! virtio-blk: one request queue over a [`BlockBackend`].
//!
//! Requests served: `VIRTIO_BLK_T_IN`, `VIRTIO_BLK_T_OUT`, `VIRTIO_BLK_T_FLUSH` and
//! `VIRTIO_BLK_T_GET_ID`; any other type is answered `VIRTIO_BLK_S_UNSUPP`. A request whose
//! sectors run past the capacity, whose data is not whole sectors, or whose chain is malformed
//! is answered `VIRTIO_BLK_S_IOERR` when the chain has a writable status byte, and returned
//! with nothing written otherwise.

use branchbox_disk::{BlockBackend, SECTOR_SIZE};
use branchbox_persist::{NoContext, RestoreError, Snapshottable};
use serde::{Deserialize, Serialize};
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK,
    VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_queue::{DescriptorChain, Queue};
use vm_memory::GuestMemory;

use crate::chain::{parse_chain, ChainLimits, ParsedChain};
use crate::queue::{process_chains, Answer, QueueOutcome};
use crate::{DeviceError, VirtioDevice, FEATURE_EVENT_IDX, FEATURE_VERSION_1};

/// Size of the one request queue.
pub const QUEUE_SIZE: u16 = 256;
/// Most data segments in one request (offered as `seg_max`, so Linux never sends more); with
/// the header and status descriptors a chain has at most 128 descriptors.
pub const SEG_MAX: u32 = 126;
/// Most data bytes in one request. Linux sends at most 1280 KiB per request by default.
pub const MAX_REQUEST_BYTES: u32 = 4 << 20;
/// Bytes of the request header (type, reserved, sector).
pub const HEADER_LEN: u32 = 16;
/// Data is moved between guest memory and the backend in pieces of this size, so a request
/// never needs more host memory than this.
const CHUNK: usize = 64 << 10;

const LIMITS: ChainLimits = ChainLimits {
    max_descriptors: SEG_MAX as usize + 2,
    max_readable: HEADER_LEN + MAX_REQUEST_BYTES,
    max_writable: MAX_REQUEST_BYTES + 1,
};

/// The virtio-blk device.
pub struct Block {
    backend: Box<dyn BlockBackend>,
    id: [u8; VIRTIO_BLK_ID_BYTES as usize],
    acked_features: u64,
}

/// Saved state of a block device: what the driver negotiated. The disk's contents live in the
/// backend's files, which the VMM reopens before restoring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockState {
    /// Features the driver accepted.
    pub acked_features: u64,
    /// The disk's size in sectors when saved; a restore onto another size is refused.
    pub sectors: u64,
}

impl Block {
    /// A block device over `backend`, answering `GET_ID` with `id` (at most 20 bytes are
    /// used).
    pub fn new(backend: Box<dyn BlockBackend>, id: &str) -> Block {
        let mut id_bytes = [0u8; VIRTIO_BLK_ID_BYTES as usize];
        let n = id.len().min(id_bytes.len());
        id_bytes[..n].copy_from_slice(&id.as_bytes()[..n]);
        Block { backend, id: id_bytes, acked_features: 0 }
    }

    /// Serves one chain: parses it, runs the request, writes the status byte last.
    pub fn serve_chain<M: GuestMemory>(&mut self, mem: &M, chain: DescriptorChain<&M>) -> Answer {
        let Ok(req) = parse_chain(mem, chain, LIMITS) else {
            return Answer::Rejected(0);
        };
        if req.writable_len() == 0 {
            return Answer::Rejected(0);
        }
        let status_at = req.writable_len() - 1;
        let (status, data_written) = match self.execute(mem, &req) {
            Ok(written) => (VIRTIO_BLK_S_OK, written),
            Err(status) => (status, 0),
        };
        if req.write_at(mem, status_at, &[status as u8]).is_err() {
            return Answer::Rejected(0);
        }
        if status == VIRTIO_BLK_S_OK {
            Answer::Done(data_written + 1)
        } else {
            Answer::Rejected(1)
        }
    }

    /// Runs the request; returns the data bytes written into the chain, or the error status.
    fn execute<M: GuestMemory>(&mut self, mem: &M, req: &ParsedChain) -> Result<u32, u32> {
        let mut header = [0u8; HEADER_LEN as usize];
        req.read_at(mem, 0, &mut header).map_err(|_| VIRTIO_BLK_S_IOERR)?;
        let kind = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        let mut sector_bytes = [0u8; 8];
        sector_bytes.copy_from_slice(&header[8..16]);
        let sector = u64::from_le_bytes(sector_bytes);
        match kind {
            VIRTIO_BLK_T_IN => {
                let len = req.writable_len() - 1;
                self.check_range(sector, len)?;
                if req.readable_len() != HEADER_LEN {
                    return Err(VIRTIO_BLK_S_IOERR);
                }
                let mut buf = vec![0u8; (len as usize).min(CHUNK)];
                let mut done = 0u32;
                while done < len {
                    let n = ((len - done) as usize).min(CHUNK);
                    let at = sector + u64::from(done) / SECTOR_SIZE;
                    self.backend.read(at, &mut buf[..n]).map_err(|_| VIRTIO_BLK_S_IOERR)?;
                    req.write_at(mem, done, &buf[..n]).map_err(|_| VIRTIO_BLK_S_IOERR)?;
                    done += n as u32;
                }
                Ok(len)
            }
            VIRTIO_BLK_T_OUT => {
                let len = req.readable_len() - HEADER_LEN;
                self.check_range(sector, len)?;
                if req.writable_len() != 1 {
                    return Err(VIRTIO_BLK_S_IOERR);
                }
                let mut buf = vec![0u8; (len as usize).min(CHUNK)];
                let mut done = 0u32;
                while done < len {
                    let n = ((len - done) as usize).min(CHUNK);
                    req.read_at(mem, HEADER_LEN + done, &mut buf[..n]).map_err(|_| VIRTIO_BLK_S_IOERR)?;
                    let at = sector + u64::from(done) / SECTOR_SIZE;
                    self.backend.write(at, &buf[..n]).map_err(|_| VIRTIO_BLK_S_IOERR)?;
                    done += n as u32;
                }
                Ok(0)
            }
            VIRTIO_BLK_T_FLUSH => {
                self.backend.flush().map_err(|_| VIRTIO_BLK_S_IOERR)?;
                Ok(0)
            }
            VIRTIO_BLK_T_GET_ID => {
                let room = (req.writable_len() - 1).min(VIRTIO_BLK_ID_BYTES);
                req.write_at(mem, 0, &self.id[..room as usize]).map_err(|_| VIRTIO_BLK_S_IOERR)?;
                Ok(room)
            }
            _ => Err(VIRTIO_BLK_S_UNSUPP),
        }
    }

    /// Refuses data that is not whole sectors or runs past the disk.
    fn check_range(&self, sector: u64, len: u32) -> Result<(), u32> {
        if u64::from(len) % SECTOR_SIZE != 0 {
            return Err(VIRTIO_BLK_S_IOERR);
        }
        let end = sector.checked_add(u64::from(len) / SECTOR_SIZE).ok_or(VIRTIO_BLK_S_IOERR)?;
        if end > self.backend.sectors() {
            return Err(VIRTIO_BLK_S_IOERR);
        }
        Ok(())
    }
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn features(&self) -> u64 {
        FEATURE_VERSION_1 | FEATURE_EVENT_IDX | (1 << VIRTIO_BLK_F_FLUSH) | (1 << VIRTIO_BLK_F_SEG_MAX)
    }

    fn ack_features(&mut self, features: u64) {
        self.acked_features = features & self.features();
    }

    /// `capacity` (u64, sectors), `size_max` (u32, not offered: 0), `seg_max` (u32).
    fn config(&self) -> Vec<u8> {
        let mut config = Vec::with_capacity(16);
        config.extend_from_slice(&self.backend.sectors().to_le_bytes());
        config.extend_from_slice(&0u32.to_le_bytes());
        config.extend_from_slice(&SEG_MAX.to_le_bytes());
        config
    }

    fn process_queue<M: GuestMemory>(
        &mut self,
        index: usize,
        queue: &mut Queue,
        mem: &M,
    ) -> Result<QueueOutcome, DeviceError> {
        if index != 0 {
            return Err(DeviceError::NoSuchQueue { index, count: 1 });
        }
        process_chains(index, queue, mem, |chain| self.serve_chain(mem, chain))
    }

    fn reset(&mut self) {
        self.acked_features = 0;
    }
}

impl Snapshottable for Block {
    type State = BlockState;
    type SaveCtx = NoContext;
    type RestoreCtx = NoContext;
    type Error = RestoreError;

    fn save(&mut self, _ctx: &mut NoContext) -> Result<BlockState, RestoreError> {
        Ok(BlockState { acked_features: self.acked_features, sectors: self.backend.sectors() })
    }

    fn restore(&mut self, state: &BlockState, _ctx: &NoContext) -> Result<(), RestoreError> {
        if state.sectors != self.backend.sectors() {
            return Err(RestoreError::new(
                "virtio-blk",
                format!(
                    "saved disk has {} sectors but the disk given has {}",
                    state.sectors,
                    self.backend.sectors()
                ),
            ));
        }
        self.acked_features = state.acked_features & self.features();
        Ok(())
    }
}
