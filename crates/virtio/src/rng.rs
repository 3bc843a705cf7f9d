//! virtio-rng (entropy device): one queue whose writable buffers the device fills from the
//! host's `getrandom`.

use std::io;

use branchbox_persist::{NoContext, RestoreError, Snapshottable};
use serde::{Deserialize, Serialize};
use virtio_bindings::virtio_ids::VIRTIO_ID_RNG;
use virtio_queue::{DescriptorChain, Queue};
use vm_memory::GuestMemory;

use crate::chain::{parse_chain, ChainLimits};
use crate::queue::{process_chains, Answer, QueueOutcome};
use crate::{DeviceError, VirtioDevice, FEATURE_EVENT_IDX, FEATURE_VERSION_1};

/// Size of the one request queue.
pub const QUEUE_SIZE: u16 = 256;
/// Most bytes given for one request: a larger buffer is filled only this far (the driver
/// accepts a short answer), so one request costs the host a bounded amount of entropy.
pub const MAX_REQUEST_BYTES: u32 = 64 << 10;

const LIMITS: ChainLimits = ChainLimits {
    max_descriptors: QUEUE_SIZE as usize,
    max_readable: 0,
    // A chain may offer more than the cap; only the first MAX_REQUEST_BYTES are filled.
    max_writable: u32::MAX,
};

/// The virtio-rng device.
#[derive(Debug, Default)]
pub struct Rng {
    acked_features: u64,
}

/// Saved state of the rng: what the driver negotiated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RngState {
    /// Features the driver accepted.
    pub acked_features: u64,
}

impl Rng {
    /// A new rng device.
    pub fn new() -> Rng {
        Rng::default()
    }

    /// Serves one chain: fills its writable buffers (up to the cap) with random bytes. A chain
    /// with device-readable buffers is malformed for this device and is refused.
    pub fn serve_chain<M: GuestMemory>(&mut self, mem: &M, chain: DescriptorChain<&M>) -> Answer {
        let Ok(req) = parse_chain(mem, chain, LIMITS) else {
            return Answer::Rejected(0);
        };
        let len = req.writable_len().min(MAX_REQUEST_BYTES);
        let mut buf = vec![0u8; len as usize];
        if fill_random(&mut buf).is_err() || req.write_at(mem, 0, &buf).is_err() {
            return Answer::Rejected(0);
        }
        Answer::Done(len)
    }
}

/// Fills `buf` from the kernel's random pool, retrying short reads and interruptions.
pub(crate) fn fill_random(buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: getrandom writes at most `rest.len()` bytes into `rest`, which we own.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        done += n as usize;
    }
    Ok(())
}

impl VirtioDevice for Rng {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_RNG
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn features(&self) -> u64 {
        FEATURE_VERSION_1 | FEATURE_EVENT_IDX
    }

    fn ack_features(&mut self, features: u64) {
        self.acked_features = features & self.features();
    }

    fn config(&self) -> Vec<u8> {
        Vec::new()
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

impl Snapshottable for Rng {
    type State = RngState;
    type SaveCtx = NoContext;
    type RestoreCtx = NoContext;
    type Error = RestoreError;

    fn save(&mut self, _ctx: &mut NoContext) -> Result<RngState, RestoreError> {
        Ok(RngState { acked_features: self.acked_features })
    }

    fn restore(&mut self, state: &RngState, _ctx: &NoContext) -> Result<(), RestoreError> {
        self.acked_features = state.acked_features & self.features();
        Ok(())
    }
}
