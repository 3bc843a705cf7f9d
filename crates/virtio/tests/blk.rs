//! virtio-blk driven through the virtio-mmio transport by the host-side test driver.

use std::path::Path;
use std::sync::Arc;

use branchbox_devices::BusDevice;
use branchbox_disk::{OverlayBackend, SECTOR_SIZE};
use branchbox_persist::{NoContext, Snapshottable};
use branchbox_virtio::blk::Block;
use branchbox_virtio::mmio::MmioTransport;
use branchbox_virtio::testing::*;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const FEATURES: u64 = (1 << 32) | (1 << 9) | (1 << 29);
const DISK: u64 = 64 * 4096;
const T_IN: u32 = 0;
const T_OUT: u32 = 1;
const T_FLUSH: u32 = 4;
const T_GET_ID: u32 = 8;

type Dev = MmioTransport<Block, Arc<GuestMemoryMmap>>;

struct Rig {
    mem: Arc<GuestMemoryMmap>,
    dev: Dev,
    irq: CountingInterrupt,
    q: DriverQueue,
    bufs: Buffers,
}

fn base_file(dir: &Path) -> std::path::PathBuf {
    let base = dir.join("base.img");
    let data: Vec<u8> = (0..DISK).map(|i| (i / SECTOR_SIZE) as u8).collect();
    std::fs::write(&base, data).unwrap();
    base
}

fn device(dir: &Path) -> Block {
    let backend = OverlayBackend::open(&dir.join("base.img"), &dir.join("overlay.img")).unwrap();
    Block::new(Box::new(backend), "vda-test")
}

fn rig(dir: &Path) -> Rig {
    base_file(dir);
    let mem = guest_memory();
    let irq = CountingInterrupt::default();
    let mut dev = MmioTransport::new(device(dir), mem.clone(), Box::new(irq.clone()));
    let q = DriverQueue::new(0x1000, 256);
    assert_eq!(handshake(&mut dev, FEATURES, std::slice::from_ref(&q)), 0xf, "handshake reaches DRIVER_OK");
    Rig { mem, dev, irq, q, bufs: Buffers::default() }
}

fn header(mem: &GuestMemoryMmap, bufs: &mut Buffers, kind: u32, sector: u64) -> GuestAddress {
    let h = bufs.alloc(16);
    let mut raw = [0u8; 16];
    raw[0..4].copy_from_slice(&kind.to_le_bytes());
    raw[8..16].copy_from_slice(&sector.to_le_bytes());
    mem.write_slice(&raw, h).unwrap();
    h
}

impl Rig {
    /// Queues a request; returns (head, data buffer, status address).
    fn submit(&mut self, kind: u32, sector: u64, data: &[u8], len: u32) -> (u16, GuestAddress, GuestAddress) {
        let h = header(&self.mem, &mut self.bufs, kind, sector);
        let buf = self.bufs.alloc(len.max(1));
        self.mem.write_slice(data, buf).unwrap();
        let status = self.bufs.alloc(1);
        self.mem.write_obj(0xffu8, status).unwrap();
        let device_writes = kind == T_IN || kind == T_GET_ID;
        let mut chain = vec![(h, 16, false)];
        if len > 0 {
            chain.push((buf, len, device_writes));
        }
        chain.push((status, 1, true));
        let head = self.q.add_chain(&self.mem, &chain);
        (head, buf, status)
    }

    fn status(&self, at: GuestAddress) -> u8 {
        self.mem.read_obj(at).unwrap()
    }

    fn run(&mut self) -> Vec<(u16, u32)> {
        notify(&mut self.dev, 0);
        self.q.take_used(&self.mem)
    }
}

#[test]
fn blk_reads_base_writes_overlay_flushes_and_identifies() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = rig(dir.path());
    let mut cfg = [0u8; 8];
    r.dev.read(0x100, &mut cfg);
    assert_eq!(u64::from_le_bytes(cfg), DISK / SECTOR_SIZE, "capacity in config space");

    let (_, rbuf, rst) = r.submit(T_IN, 3, &[], 1024);
    let used = r.run();
    assert_eq!(used.len(), 1);
    assert_eq!(used[0].1, 1025, "data plus status byte");
    assert_eq!(r.status(rst), 0);
    let mut got = vec![0u8; 1024];
    r.mem.read_slice(&mut got, rbuf).unwrap();
    assert!(got[..512].iter().all(|&b| b == 3) && got[512..].iter().all(|&b| b == 4));

    let (_, _, wst) = r.submit(T_OUT, 9, &[0xab; 512], 512);
    let (_, _, fst) = r.submit(T_FLUSH, 0, &[], 0);
    let (_, idbuf, ist) = r.submit(T_GET_ID, 0, &[], 20);
    let (_, back, bst) = r.submit(T_IN, 8, &[], 1536);
    assert_eq!(r.run().len(), 4);
    for st in [wst, fst, ist, bst] {
        assert_eq!(r.status(st), 0);
    }
    let mut id = [0u8; 8];
    r.mem.read_slice(&mut id, idbuf).unwrap();
    assert_eq!(&id, b"vda-test");
    let mut got = vec![0u8; 1536];
    r.mem.read_slice(&mut got, back).unwrap();
    assert!(got[..512].iter().all(|&b| b == 8), "unwritten sector of a written cluster is the base's");
    assert!(got[512..1024].iter().all(|&b| b == 0xab), "written sector reads back");
    assert!(got[1024..].iter().all(|&b| b == 10));
    assert!(r.irq.count() >= 2);

    let base = std::fs::read(dir.path().join("base.img")).unwrap();
    assert!(base[9 * 512..10 * 512].iter().all(|&b| b == 9), "the base is never written");
    drop(r);
    // Reopening the overlay finds the written cluster again.
    let mem = guest_memory();
    let mut dev = MmioTransport::new(device(dir.path()), mem.clone(), Box::new(CountingInterrupt::default()));
    let mut q = DriverQueue::new(0x1000, 256);
    handshake(&mut dev, FEATURES, std::slice::from_ref(&q));
    let mut bufs = Buffers::default();
    let h = header(&mem, &mut bufs, T_IN, 8);
    let data = bufs.alloc(1024);
    let st = bufs.alloc(1);
    q.add_chain(&mem, &[(h, 16, false), (data, 1024, true), (st, 1, true)]);
    notify(&mut dev, 0);
    assert_eq!(q.take_used(&mem).len(), 1);
    let mut got = vec![0u8; 1024];
    mem.read_slice(&mut got, data).unwrap();
    assert!(got[..512].iter().all(|&b| b == 8) && got[512..].iter().all(|&b| b == 0xab));
}

#[test]
fn blk_refuses_out_of_range_partial_and_unknown_requests() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = rig(dir.path());
    let last = DISK / SECTOR_SIZE - 1;
    let (_, _, past) = r.submit(T_IN, last, &[], 1024);
    let (_, _, wrap) = r.submit(T_OUT, u64::MAX, &[0; 512], 512);
    let (_, _, partial) = r.submit(T_OUT, 0, &[0; 100], 100);
    let (_, _, unknown) = r.submit(11, 0, &[], 0);
    let (_, _, ok) = r.submit(T_IN, last, &[], 512);
    let used = r.run();
    assert_eq!(used.len(), 5);
    assert_eq!(r.status(past), 1, "read past capacity is IOERR");
    assert_eq!(r.status(wrap), 1, "sector overflow is IOERR");
    assert_eq!(r.status(partial), 1, "data not whole sectors is IOERR");
    assert_eq!(r.status(unknown), 2, "discard is UNSUPP");
    assert_eq!(r.status(ok), 0, "last sector is readable");
    assert_eq!(r.dev.counters().rejected_chains, 4);
}

#[test]
fn blk_malformed_chains_are_rejected_and_the_device_stays_usable() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = rig(dir.path());
    let h = header(&r.mem, &mut r.bufs, T_IN, 0);
    let data = r.bufs.alloc(512);
    let st = r.bufs.alloc(1);
    let q = r.q.clone();
    let mem = r.mem.clone();
    // A loop: 200 -> 201 -> 200.
    q.write_desc(&mem, 200, h.0, 16, F_NEXT, 201);
    q.write_desc(&mem, 201, data.0, 512, F_NEXT | F_WRITE, 200);
    r.q.push_avail(&mem, 200);
    // A buffer outside guest memory.
    q.write_desc(&mem, 202, h.0, 16, F_NEXT, 203);
    q.write_desc(&mem, 203, MEM_SIZE - 256, 512, F_NEXT | F_WRITE, 204);
    q.write_desc(&mem, 204, st.0, 1, F_WRITE, 0);
    r.q.push_avail(&mem, 202);
    // An address that wraps around the address space.
    q.write_desc(&mem, 205, u64::MAX - 8, 16, F_NEXT, 206);
    q.write_desc(&mem, 206, st.0, 1, F_WRITE, 0);
    r.q.push_avail(&mem, 205);
    // An oversized length (4 GiB - 1).
    q.write_desc(&mem, 207, h.0, 16, F_NEXT, 208);
    q.write_desc(&mem, 208, data.0, u32::MAX, F_NEXT | F_WRITE, 209);
    q.write_desc(&mem, 209, st.0, 1, F_WRITE, 0);
    r.q.push_avail(&mem, 207);
    // Wrong direction: a readable buffer after a writable one.
    q.write_desc(&mem, 210, h.0, 16, F_NEXT | F_WRITE, 211);
    q.write_desc(&mem, 211, st.0, 1, 0, 0);
    r.q.push_avail(&mem, 210);
    // A next index past the queue.
    q.write_desc(&mem, 212, h.0, 16, F_NEXT, 4000);
    r.q.push_avail(&mem, 212);
    // A head index past the queue.
    r.q.push_avail(&mem, 999);
    // No writable status byte at all.
    q.write_desc(&mem, 213, h.0, 16, 0, 0);
    r.q.push_avail(&mem, 213);
    // A broken indirect table (outside memory).
    q.write_desc(&mem, 214, MEM_SIZE + 4096, 64, F_INDIRECT, 0);
    r.q.push_avail(&mem, 214);
    let used = r.run();
    let heads: Vec<u16> = used.iter().map(|u| u.0).collect();
    assert_eq!(heads, vec![200, 202, 205, 207, 210, 212, 213, 214], "every named chain is returned once");
    assert!(used.iter().all(|u| u.1 <= 1), "nothing but a status byte written: {used:?}");
    assert_eq!(r.dev.counters().rejected_chains, 9);

    // Too many descriptors: a straight chain of 200, past the 128 the device accepts.
    for i in 0..199u16 {
        q.write_desc(&mem, i, data.0, 512, F_NEXT | F_WRITE, i + 1);
    }
    q.write_desc(&mem, 199, st.0, 1, F_WRITE, 0);
    r.q.push_avail(&mem, 0);
    let used = r.run();
    assert_eq!(used, vec![(0, 0)]);

    let (_, buf, st) = r.submit(T_IN, 5, &[], 512);
    assert_eq!(r.run().len(), 1, "a good request after the bad ones is served");
    assert_eq!(r.status(st), 0);
    let mut got = [0u8; 512];
    r.mem.read_slice(&mut got, buf).unwrap();
    assert!(got.iter().all(|&b| b == 5));
}

#[test]
fn blk_save_restore_mid_queue_answers_every_request_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = rig(dir.path());
    let mut statuses = Vec::new();
    let mut heads = Vec::new();
    for i in 0..3u8 {
        let (h, _, st) = r.submit(T_OUT, u64::from(i) * 8, &[0x10 + i; 512], 512);
        heads.push(h);
        statuses.push(st);
    }
    let first = r.run();
    assert_eq!(first.len(), 3);
    // Five more made available, never notified: the snapshot holds them unprocessed.
    for i in 3..8u8 {
        let (h, _, st) = r.submit(T_OUT, u64::from(i) * 8, &[0x10 + i; 512], 512);
        heads.push(h);
        statuses.push(st);
    }
    let saved = r.dev.save(&mut NoContext).unwrap();
    assert_eq!(saved.queues[0].next_avail, 3, "saved with five requests pending");
    let Rig { mem, mut q, dev, .. } = r;
    drop(dev);

    let irq = CountingInterrupt::default();
    let mut fresh = MmioTransport::new(device(dir.path()), mem.clone(), Box::new(irq.clone()));
    fresh.restore(&saved, &NoContext).unwrap();
    assert_eq!(fresh.registers().status, 0xf, "restored at DRIVER_OK");
    notify(&mut fresh, 0);
    let second = q.take_used(&mem);
    let mut all: Vec<u16> = first.iter().chain(&second).map(|u| u.0).collect();
    all.sort_unstable();
    let mut want = heads.clone();
    want.sort_unstable();
    assert_eq!(all, want, "every request answered exactly once across the restore");
    for st in statuses {
        assert_eq!(mem.read_obj::<u8>(st).unwrap(), 0);
    }
    let overlay = std::fs::read(dir.path().join("overlay.img")).unwrap();
    for i in 0..8u64 {
        assert_eq!(overlay[(i * 8 * 512) as usize], 0x10 + i as u8, "write {i} reached the disk");
    }
}

#[test]
fn blk_restore_refuses_a_state_for_another_disk() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = rig(dir.path());
    let mut saved = r.dev.save(&mut NoContext).unwrap();
    saved.device.sectors += 1;
    let err = r.dev.restore(&saved, &NoContext).unwrap_err();
    assert!(err.to_string().contains("sectors"), "{err}");
    saved.device.sectors -= 1;
    saved.queues[0].max_size = 1024;
    assert!(r.dev.restore(&saved, &NoContext).is_err());
}

#[test]
fn overlay_refuses_an_unaligned_base_and_a_foreign_overlay() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("odd.img");
    std::fs::write(&base, vec![0u8; 4096 + 512]).unwrap();
    let err = OverlayBackend::open(&base, &dir.path().join("o1.img")).err().unwrap();
    assert!(err.to_string().contains("not a multiple of 4096"), "{err}");
    let base = base_file(dir.path());
    let foreign = dir.path().join("o2.img");
    std::fs::write(&foreign, vec![0u8; 8192]).unwrap();
    let err = OverlayBackend::open(&base, &foreign).err().unwrap();
    assert!(err.to_string().contains("belongs to one base"), "{err}");
}
