//! Bodies of the fuzz targets (`fuzz/` at the repository root runs them under libFuzzer) and
//! of the random-input tests that run the same bodies in `cargo test`.
//!
//! Each body turns arbitrary bytes into guest-controlled input for one surface and runs it;
//! the only assertion is the one that matters for hostile input: nothing panics, and what
//! the device reports stays within bounds. Built only with the `testing` feature.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use branchbox_devices::BusDevice;
use branchbox_disk::{BlockBackend, SECTOR_SIZE};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::blk::Block;
use crate::mmio::MmioTransport;
use crate::net::Net;
use crate::rng::Rng;
use crate::testing::{handshake, notify, CountingInterrupt, DriverQueue};
use crate::vsock::Vsock;
use crate::VirtioDevice;

/// Guest memory of the fuzz bodies: small, so each run maps little.
const MEM: usize = 256 << 10;
/// Where the queue under test lives: 16 entries, descriptor table then available ring.
const QUEUE_BASE: u64 = 0x1000;
const QUEUE_SIZE: u16 = 16;
/// Bytes of the descriptor table and available ring that the input overwrites.
const RING_BYTES: usize = 16 * QUEUE_SIZE as usize + 6 + 2 * QUEUE_SIZE as usize;
/// Where the rest of the input lands: buffers the descriptors may point at.
const DATA_BASE: u64 = 0x8000;

fn memory() -> Arc<GuestMemoryMmap> {
    Arc::new(
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)])
            .expect("256 KiB of anonymous memory for a fuzz run"),
    )
}

/// A disk in memory, for the block bodies.
pub struct MemBackend(pub Vec<u8>);

impl BlockBackend for MemBackend {
    fn sectors(&self) -> u64 {
        self.0.len() as u64 / SECTOR_SIZE
    }

    fn read(&mut self, sector: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let at = (sector * SECTOR_SIZE) as usize;
        buf.copy_from_slice(&self.0[at..at + buf.len()]);
        Ok(())
    }

    fn write(&mut self, sector: u64, data: &[u8]) -> std::io::Result<()> {
        let at = (sector * SECTOR_SIZE) as usize;
        self.0[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Sets `device` up on a transport with every queue at [`QUEUE_BASE`]-relative places, then
/// overwrites queue `index`'s descriptor table and available ring with the start of `data`
/// and guest memory from [`DATA_BASE`] with the rest, and notifies the queue twice.
fn run_queue<D: VirtioDevice>(device: D, index: usize, data: &[u8]) {
    let mem = memory();
    let queues: Vec<DriverQueue> = (0..device.queue_max_sizes().len())
        .map(|i| DriverQueue::new(QUEUE_BASE + 0x1000 * i as u64, QUEUE_SIZE))
        .collect();
    let features = device.features();
    let mut dev = MmioTransport::new(device, mem.clone(), Box::new(CountingInterrupt::default()));
    handshake(&mut dev, features, &queues);
    let (rings, rest) = data.split_at(data.len().min(RING_BYTES));
    let base = GuestAddress(QUEUE_BASE + 0x1000 * index as u64);
    mem.write_slice(rings, base).expect("rings inside fuzz memory");
    let room = MEM - DATA_BASE as usize;
    mem.write_slice(&rest[..rest.len().min(room)], GuestAddress(DATA_BASE))
        .expect("buffers inside fuzz memory");
    for _ in 0..2 {
        notify(&mut dev, index as u32);
    }
    let status = dev.registers().interrupt_status;
    assert!(status & !3 == 0, "interrupt status {status:#x} has undefined bits");
}

/// virtio-blk request chains and headers from arbitrary bytes.
pub fn blk_requests(data: &[u8]) {
    let disk = MemBackend(vec![0u8; 64 * SECTOR_SIZE as usize]);
    run_queue(Block::new(Box::new(disk), "fuzz"), 0, data);
}

/// virtio-rng chains from arbitrary bytes.
pub fn rng_chains(data: &[u8]) {
    run_queue(Rng::new(), 0, data);
}

static SOCKETS: AtomicU64 = AtomicU64::new(0);

/// virtio-vsock TX packets (headers, chains, payloads) from arbitrary bytes; the host side
/// listens on a fresh Unix socket in the temporary directory.
pub fn vsock_packets(data: &[u8]) {
    let n = SOCKETS.fetch_add(1, Ordering::Relaxed);
    let path: PathBuf = std::env::temp_dir().join(format!("bb-fuzz-{}-{n}.sock", std::process::id()));
    let vsock = Vsock::new(3, &path).expect("a Unix socket in the temporary directory");
    run_queue(vsock, crate::vsock::TX, data);
}

/// virtio-net TX chains (headers, frames, chain shapes) from arbitrary bytes; the host side is
/// a datagram socket pair whose far end is dropped, so sends fail and are counted.
pub fn net_frames(data: &[u8]) {
    let (port, _) = std::os::unix::net::UnixDatagram::pair().expect("a socket pair");
    port.set_nonblocking(true).expect("a non-blocking socket");
    run_queue(Net::new(Box::new(port), crate::net::GUEST_MAC), crate::net::TX, data);
}

/// virtio-mmio register accesses from arbitrary bytes: each 8-byte record is
/// `[op, offset lo, offset hi, size, value x4]`; op bit 0 picks read or write, and op bit 1
/// instead writes the value into guest memory at `offset * 4` (so queues can point at
/// something). Runs on an rng device, whose queue the accesses may set up and notify.
pub fn mmio_registers(data: &[u8]) {
    let mem = memory();
    let mut dev = MmioTransport::new(Rng::new(), mem.clone(), Box::new(CountingInterrupt::default()));
    for rec in data.chunks_exact(8) {
        let offset = u64::from(u16::from_le_bytes([rec[1], rec[2]]));
        let size = usize::from(rec[3] % 9);
        let value = [rec[4], rec[5], rec[6], rec[7]];
        if rec[0] & 2 != 0 {
            let _ = mem.write_slice(&value, GuestAddress(offset * 4));
        } else if rec[0] & 1 != 0 {
            let mut buf = [0u8; 8];
            buf[..size.min(4)].copy_from_slice(&value[..size.min(4)]);
            dev.write(offset, &buf[..size]);
        } else {
            let mut buf = [0u8; 8];
            dev.read(offset, &mut buf[..size]);
        }
    }
    let regs = dev.registers();
    assert!(regs.interrupt_status & !3 == 0, "only the two defined interrupt bits");
}
