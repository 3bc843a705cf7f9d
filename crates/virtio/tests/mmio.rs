//! The virtio-mmio transport's registers and handshake, virtio-rng, VMGenID, and the fuzz
//! bodies run on random input.

use std::sync::Arc;

use branchbox_devices::BusDevice;
use branchbox_persist::{NoContext, Snapshottable};
use branchbox_virtio::mmio::MmioTransport;
use branchbox_virtio::rng::{Rng, MAX_REQUEST_BYTES};
use branchbox_virtio::testing::*;
use branchbox_virtio::vmgenid::VmGenId;
use branchbox_virtio::{fuzz, VirtioDevice};
use proptest::prelude::*;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const FEATURES: u64 = (1 << 32) | (1 << 29);
const ACK: u32 = 1;
const DRIVER: u32 = 2;
const DRIVER_OK: u32 = 4;
const FEATURES_OK: u32 = 8;
const NEEDS_RESET: u32 = 64;

type Dev = MmioTransport<Rng, Arc<GuestMemoryMmap>>;

fn rng_dev() -> (Arc<GuestMemoryMmap>, Dev, CountingInterrupt) {
    let mem = guest_memory();
    let irq = CountingInterrupt::default();
    let dev = MmioTransport::new(Rng::new(), mem.clone(), Box::new(irq.clone()));
    (mem, dev, irq)
}

#[test]
fn mmio_identity_and_feature_words() {
    let (_, mut dev, _) = rng_dev();
    assert_eq!(read32(&mut dev, 0x0), 0x7472_6976, "magic 'virt'");
    assert_eq!(read32(&mut dev, 0x4), 2, "modern transport");
    assert_eq!(read32(&mut dev, 0x8), 4, "rng device id");
    write32(&mut dev, 0x14, 1);
    assert_eq!(read32(&mut dev, 0x10), 1, "VERSION_1 in the high word");
    write32(&mut dev, 0x14, 0);
    assert_eq!(read32(&mut dev, 0x10), 1 << 29, "EVENT_IDX in the low word");
    write32(&mut dev, 0x14, 7);
    assert_eq!(read32(&mut dev, 0x10), 0, "words past the second are empty");
    write32(&mut dev, 0x30, 0);
    assert_eq!(read32(&mut dev, 0x34), 256);
    write32(&mut dev, 0x30, 1);
    assert_eq!(read32(&mut dev, 0x34), 0, "a queue the device lacks has size 0");
}

#[test]
fn mmio_status_handshake_refuses_out_of_order_steps() {
    let (_, mut dev, _) = rng_dev();
    write32(&mut dev, 0x70, DRIVER);
    assert_eq!(read32(&mut dev, 0x70), 0, "DRIVER needs ACKNOWLEDGE");
    write32(&mut dev, 0x70, ACK);
    write32(&mut dev, 0x70, ACK | FEATURES_OK);
    assert_eq!(read32(&mut dev, 0x70), ACK, "FEATURES_OK needs DRIVER");
    write32(&mut dev, 0x70, ACK | DRIVER | DRIVER_OK);
    assert_eq!(read32(&mut dev, 0x70), ACK, "DRIVER_OK needs FEATURES_OK");
    // All at once with features the device refuses: neither FEATURES_OK nor DRIVER_OK sticks.
    write32(&mut dev, 0x70, ACK | DRIVER | FEATURES_OK | DRIVER_OK);
    assert_eq!(read32(&mut dev, 0x70), ACK | DRIVER);
    // Without VERSION_1 the features are refused: FEATURES_OK does not stick.
    write32(&mut dev, 0x24, 0);
    write32(&mut dev, 0x20, 1 << 29);
    write32(&mut dev, 0x70, ACK | DRIVER | FEATURES_OK);
    assert_eq!(read32(&mut dev, 0x70) & FEATURES_OK, 0);
    // A bit the device never offered is refused too.
    write32(&mut dev, 0x24, 1);
    write32(&mut dev, 0x20, 1 | 1 << 5);
    write32(&mut dev, 0x70, ACK | DRIVER | FEATURES_OK);
    assert_eq!(read32(&mut dev, 0x70) & FEATURES_OK, 0);
    write32(&mut dev, 0x20, 1);
    write32(&mut dev, 0x70, ACK | DRIVER | FEATURES_OK);
    assert_eq!(read32(&mut dev, 0x70), ACK | DRIVER | FEATURES_OK);
    let ignored = dev.counters().ignored_accesses;
    write32(&mut dev, 0x20, 0);
    assert_eq!(dev.counters().ignored_accesses, ignored + 1, "features are closed after FEATURES_OK");
    write32(&mut dev, 0x70, ACK);
    assert_eq!(read32(&mut dev, 0x70), ACK | DRIVER | FEATURES_OK, "bits clear only by reset");
    write32(&mut dev, 0x70, 0);
    assert_eq!(read32(&mut dev, 0x70), 0, "writing 0 resets");

    let q = DriverQueue::new(0x1000, 256);
    assert_eq!(
        handshake(&mut dev, FEATURES, std::slice::from_ref(&q)),
        ACK | DRIVER | FEATURES_OK | DRIVER_OK
    );
    let ignored = dev.counters().ignored_accesses;
    write32(&mut dev, 0x30, 0);
    write32(&mut dev, 0x80, 0x5000);
    write32(&mut dev, 0x38, 16);
    assert_eq!(dev.counters().ignored_accesses, ignored + 2, "queue setup is closed after DRIVER_OK");
    write32(&mut dev, 0x70, 0);
    assert_eq!(read32(&mut dev, 0x44), 0, "reset leaves queues not ready");
}

#[test]
fn mmio_odd_offsets_and_sizes_are_ignored() {
    let (_, mut dev, _) = rng_dev();
    for (offset, size) in [(0x2, 4), (0x0, 2), (0x0, 8), (0x70, 1), (0x0, 0), (0xffc, 4), (u64::MAX - 3, 4)] {
        let mut buf = vec![0xaau8; size];
        dev.read(offset, &mut buf);
        assert!(buf.iter().all(|&b| b == 0), "read {offset:#x}/{size} gives zeros");
        dev.write(offset, &buf);
    }
    let mut cfg = [0xaau8; 8];
    dev.read(0x100, &mut cfg);
    assert_eq!(cfg, [0; 8], "rng has no config space");
    assert_eq!(read32(&mut dev, 0x70), 0);
}

#[test]
fn mmio_interrupt_status_ack_and_needs_reset() {
    let (mem, mut dev, irq) = rng_dev();
    let mut q = DriverQueue::new(0x1000, 256);
    handshake(&mut dev, FEATURES, std::slice::from_ref(&q));
    let mut bufs = Buffers::default();
    let b = bufs.alloc(32);
    q.add_chain(&mem, &[(b, 32, true)]);
    notify(&mut dev, 0);
    assert_eq!(q.take_used(&mem), vec![(0, 32)]);
    assert_eq!(read32(&mut dev, 0x60), 1, "used-buffer interrupt pending");
    assert_eq!(irq.count(), 1);
    write32(&mut dev, 0x64, 1);
    assert_eq!(read32(&mut dev, 0x60), 0, "acknowledged");

    // A queue whose rings lie outside guest memory: the device asks for a reset.
    write32(&mut dev, 0x70, 0);
    let far = DriverQueue::new(MEM_SIZE + 0x10000, 256);
    handshake(&mut dev, FEATURES, std::slice::from_ref(&far));
    notify(&mut dev, 0);
    assert_ne!(read32(&mut dev, 0x70) & NEEDS_RESET, 0);
    assert_eq!(read32(&mut dev, 0x60) & 2, 2, "configuration interrupt");
    let mut q = DriverQueue::new(0x1000, 256);
    assert_eq!(handshake(&mut dev, FEATURES, std::slice::from_ref(&q)), 0xf, "usable after a reset");
    q.add_chain(&mem, &[(b, 16, true)]);
    notify(&mut dev, 0);
    assert_eq!(q.take_used(&mem), vec![(0, 16)]);
}

#[test]
fn mmio_avail_index_more_than_a_queue_ahead_is_a_broken_queue_not_a_spin() {
    let (mem, mut dev, _) = rng_dev();
    let q = DriverQueue::new(0x1000, 256);
    handshake(&mut dev, FEATURES, std::slice::from_ref(&q));
    // Found by the rng/blk fuzz bodies: the old loop re-checked the available index forever.
    mem.write_obj(300u16, GuestAddress(q.avail.0 + 2)).unwrap();
    notify(&mut dev, 0);
    assert_ne!(read32(&mut dev, 0x70) & NEEDS_RESET, 0, "the driver is told to reset");
}

#[test]
fn rng_chain_that_loops_inside_a_small_queue_is_refused() {
    let (mem, mut dev, _) = rng_dev();
    let mut q = DriverQueue::new(0x1000, 4);
    handshake(&mut dev, FEATURES, std::slice::from_ref(&q));
    let b = Buffers::default().alloc(64);
    // 0 -> 1 -> 0: virtio-queue stops after 4 descriptors; the chain never ended.
    q.write_desc(&mem, 0, b.0, 16, F_WRITE | F_NEXT, 1);
    q.write_desc(&mem, 1, b.0, 16, F_WRITE | F_NEXT, 0);
    q.push_avail(&mem, 0);
    notify(&mut dev, 0);
    assert_eq!(q.take_used(&mem), vec![(0, 0)], "returned with nothing written");
    assert_eq!(dev.counters().rejected_chains, 1);
    q.write_desc(&mem, 2, b.0, 16, F_WRITE, 0);
    q.push_avail(&mem, 2);
    notify(&mut dev, 0);
    assert_eq!(q.take_used(&mem), vec![(2, 16)], "the next chain is served");
}

#[test]
fn rng_fills_buffers_caps_requests_and_refuses_readable_buffers() {
    let (mem, mut dev, _) = rng_dev();
    let mut q = DriverQueue::new(0x1000, 256);
    handshake(&mut dev, FEATURES, std::slice::from_ref(&q));
    let mut bufs = Buffers::default();
    let small = bufs.alloc(64);
    let big = bufs.alloc(MAX_REQUEST_BYTES * 2);
    let bad = bufs.alloc(16);
    q.add_chain(&mem, &[(small, 64, true)]);
    q.add_chain(&mem, &[(big, MAX_REQUEST_BYTES * 2, true)]);
    q.add_chain(&mem, &[(bad, 16, false)]);
    notify(&mut dev, 0);
    let used = q.take_used(&mem);
    assert_eq!(used.iter().map(|u| u.1).collect::<Vec<_>>(), vec![64, MAX_REQUEST_BYTES, 0]);
    let mut got = [0u8; 64];
    mem.read_slice(&mut got, small).unwrap();
    assert!(got.iter().any(|&b| b != 0), "random bytes arrived");
    let mut tail = vec![0u8; 64];
    mem.read_slice(&mut tail, GuestAddress(big.0 + u64::from(MAX_REQUEST_BYTES))).unwrap();
    assert!(tail.iter().all(|&b| b == 0), "nothing written past the cap");
    assert_eq!(dev.counters().rejected_chains, 1);

    // Save with one request pending, restore into a fresh device, and it is served once.
    q.add_chain(&mem, &[(small, 8, true)]);
    let saved = dev.save(&mut NoContext).unwrap();
    let mut fresh = MmioTransport::new(Rng::new(), mem.clone(), Box::new(CountingInterrupt::default()));
    fresh.restore(&saved, &NoContext).unwrap();
    notify(&mut fresh, 0);
    notify(&mut fresh, 0);
    assert_eq!(q.take_used(&mem).len(), 1);
    assert_eq!(fresh.device().features() & saved.device.acked_features, saved.device.acked_features);
}

#[test]
fn vmgenid_writes_a_new_id_and_interrupts_on_fork_and_restore() {
    let mem = guest_memory();
    let irq = CountingInterrupt::default();
    let addr = GuestAddress(0xff000);
    let mut gen = VmGenId::new(mem.clone(), addr, Box::new(irq.clone())).unwrap();
    let read = |mem: &GuestMemoryMmap| {
        let mut id = [0u8; 16];
        mem.read_slice(&mut id, addr).unwrap();
        id
    };
    let first = read(&mem);
    assert_eq!(first, gen.generation_id());
    assert_ne!(first, [0; 16]);
    gen.regenerate().unwrap();
    assert_ne!(read(&mem), first, "fork: a new id");
    assert_eq!(irq.count(), 1);
    let saved = gen.save(&mut NoContext).unwrap();
    let before = read(&mem);
    gen.restore(&saved, &NoContext).unwrap();
    assert_ne!(read(&mem), before, "restore: a new generation");
    assert_eq!(irq.count(), 2);
    let mut moved = saved.clone();
    moved.addr += 8;
    assert!(gen.restore(&moved, &NoContext).is_err());
    assert!(VmGenId::new(mem.clone(), GuestAddress(0xff004), Box::new(irq.clone())).is_err(), "unaligned");
    assert!(VmGenId::new(mem, GuestAddress(MEM_SIZE - 8), Box::new(irq)).is_err(), "past memory");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn fuzz_body_mmio_registers(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
        fuzz::mmio_registers(&data);
    }

    #[test]
    fn fuzz_body_blk_requests(data in proptest::collection::vec(any::<u8>(), 0..1024)) {
        fuzz::blk_requests(&data);
    }

    #[test]
    fn fuzz_body_rng_chains(data in proptest::collection::vec(any::<u8>(), 0..1024)) {
        fuzz::rng_chains(&data);
    }

    #[test]
    fn fuzz_body_net_frames(data in proptest::collection::vec(any::<u8>(), 0..1024)) {
        fuzz::net_frames(&data);
    }

    #[test]
    fn fuzz_body_vsock_packets(data in proptest::collection::vec(any::<u8>(), 0..1024)) {
        fuzz::vsock_packets(&data);
    }
}
