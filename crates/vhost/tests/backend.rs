//! The vhost-user back end driven host-side, without QEMU: rings laid out in test guest memory
//! by branchbox-virtio's test driver, handed to the back end the way vhost-user-backend hands
//! them over after the front end's SET_VRING_* messages.

use std::fs::File;
use std::os::fd::{FromRawFd, IntoRawFd};

use branchbox_disk::OverlayBackend;
use branchbox_vhost::Backend;
use branchbox_virtio::blk::Block;
use branchbox_virtio::rng::Rng;
use branchbox_virtio::testing::{guest_memory, Buffers, DriverQueue};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackendMut, VringRwLock, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_INDIRECT_DESC;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

struct Ring {
    driver: DriverQueue,
    vring: VringRwLock,
    call: EventFd,
}

/// A ready, enabled ring of 16 entries at 64 KiB, with a call eventfd we can read.
fn ring(mem: &GuestMemoryAtomic<GuestMemoryMmap>) -> Ring {
    let driver = DriverQueue::new(0x10000, 16);
    let vring = VringRwLock::new(mem.clone(), 256).expect("vring");
    vring.set_queue_size(driver.size);
    vring.set_queue_info(driver.desc.0, driver.avail.0, driver.used.0).expect("queue addresses");
    vring.set_queue_ready(true);
    vring.set_enabled(true);
    let call = EventFd::new(EFD_NONBLOCK).expect("eventfd");
    let dup = call.try_clone().expect("dup eventfd");
    // SAFETY: `into_raw_fd` hands over sole ownership of a valid, open descriptor.
    vring.set_call(Some(unsafe { File::from_raw_fd(dup.into_raw_fd()) }));
    Ring { driver, vring, call }
}

fn kick(backend: &mut Backend<Rng>, ring: &Ring) {
    backend.handle_event(0, EventSet::IN, std::slice::from_ref(&ring.vring), 0).expect("handle the kick");
}

#[test]
fn a_kick_runs_the_device_logic_and_interrupts_the_guest() {
    let mem = guest_memory();
    let atomic = GuestMemoryAtomic::from(mem.clone());
    let mut backend = Backend::new(Rng::new());
    backend.update_memory(atomic.clone()).expect("memory");
    let counters = backend.counters();
    let mut r = ring(&atomic);
    let mut bufs = Buffers::default();
    let buf = bufs.alloc(64);
    let head = r.driver.add_chain(&mem, &[(buf, 64, true)]);

    kick(&mut backend, &r);

    assert_eq!(r.driver.take_used(&mem), vec![(head, 64)]);
    assert_eq!(counters.chains(0), 1);
    assert_eq!(counters.bytes_to_guest(0), 64);
    assert_eq!(r.call.read().expect("the guest was interrupted"), 1);
}

#[test]
fn a_ring_the_front_end_has_not_enabled_is_left_alone() {
    let mem = guest_memory();
    let atomic = GuestMemoryAtomic::from(mem.clone());
    let mut backend = Backend::new(Rng::new());
    backend.update_memory(atomic.clone()).expect("memory");
    let mut r = ring(&atomic);
    r.vring.set_enabled(false);
    let buf = Buffers::default().alloc(16);
    let head = r.driver.add_chain(&mem, &[(buf, 16, true)]);

    kick(&mut backend, &r);
    assert!(r.driver.take_used(&mem).is_empty(), "a disabled ring was processed");
    assert!(r.call.read().is_err(), "a disabled ring interrupted the guest");

    r.vring.set_enabled(true);
    kick(&mut backend, &r);
    assert_eq!(r.driver.take_used(&mem), vec![(head, 16)]);
}

#[test]
fn malformed_chains_are_refused_counted_and_serving_goes_on() {
    let mem = guest_memory();
    let atomic = GuestMemoryAtomic::from(mem.clone());
    let mut backend = Backend::new(Rng::new());
    backend.update_memory(atomic.clone()).expect("memory");
    let counters = backend.counters();
    let mut r = ring(&atomic);
    let mut bufs = Buffers::default();
    // An rng request must be device-writable; a device-readable buffer is malformed.
    let (bad, good) = (bufs.alloc(32), bufs.alloc(32));
    let bad_head = r.driver.add_chain(&mem, &[(bad, 32, false)]);
    let good_head = r.driver.add_chain(&mem, &[(good, 32, true)]);
    // A chain whose descriptor points past guest memory.
    let oob_head = r.driver.add_chain(&mem, &[(vm_memory::GuestAddress(u64::MAX - 8), 32, true)]);

    kick(&mut backend, &r);

    assert_eq!(r.driver.take_used(&mem), vec![(bad_head, 0), (good_head, 32), (oob_head, 0)]);
    assert_eq!(counters.rejected(0), 2);
    assert_eq!(counters.bytes_to_guest(0), 32);
}

#[test]
fn a_chain_through_an_indirect_table_is_served() {
    use branchbox_virtio::testing::{F_INDIRECT, F_WRITE};
    use vm_memory::Bytes;

    let mem = guest_memory();
    let atomic = GuestMemoryAtomic::from(mem.clone());
    let mut backend = Backend::new(Rng::new());
    backend.update_memory(atomic.clone()).expect("memory");
    let mut r = ring(&atomic);
    let mut bufs = Buffers::default();
    let (table, buf) = (bufs.alloc(16), bufs.alloc(48));
    // The indirect table: one device-writable buffer of 48 bytes.
    let mut desc = [0u8; 16];
    desc[0..8].copy_from_slice(&buf.0.to_le_bytes());
    desc[8..12].copy_from_slice(&48u32.to_le_bytes());
    desc[12..14].copy_from_slice(&F_WRITE.to_le_bytes());
    mem.write_slice(&desc, table).expect("indirect table");
    r.driver.write_desc(&mem, 0, table.0, 16, F_INDIRECT, 0);
    r.driver.push_avail(&mem, 0);

    kick(&mut backend, &r);
    assert_eq!(r.driver.take_used(&mem), vec![(0, 48)]);
}

#[test]
fn events_before_the_front_end_shared_memory_do_nothing() {
    let mem = guest_memory();
    let atomic = GuestMemoryAtomic::from(mem.clone());
    let mut backend = Backend::new(Rng::new());
    let mut r = ring(&atomic);
    let buf = Buffers::default().alloc(16);
    r.driver.add_chain(&mem, &[(buf, 16, true)]);

    kick(&mut backend, &r);
    assert!(r.driver.take_used(&mem).is_empty());
}

fn block() -> (tempfile::TempDir, Backend<Block>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path().join("base.img");
    std::fs::write(&base, vec![0u8; 1 << 20]).expect("base disk");
    let disk = OverlayBackend::open(&base, &dir.path().join("overlay.img")).expect("open disk");
    (dir, Backend::new(Block::new(Box::new(disk), "test")))
}

#[test]
fn config_reads_answer_exactly_the_size_asked_within_a_bound() {
    let (_dir, backend) = block();
    let sectors = (1u64 << 20) / 512;
    assert_eq!(backend.get_config(0, 8), sectors.to_le_bytes());
    // QEMU asks for its whole virtio_blk_config; past our fields it reads zeros.
    let whole = backend.get_config(0, 60);
    assert_eq!(whole.len(), 60);
    assert!(whole[16..].iter().all(|&b| b == 0));
    assert_eq!(backend.get_config(u32::MAX, 4), vec![0; 4]);
    assert!(backend.get_config(0, 1 << 20).is_empty(), "an oversized read must fail, not allocate");
}

#[test]
fn features_carry_vhost_user_protocol_features_and_config_only_where_there_is_one() {
    let (_dir, blk) = block();
    let rng = Backend::new(Rng::new());
    for features in [blk.features(), rng.features()] {
        assert_ne!(features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits(), 0);
        assert_ne!(features & (1 << VIRTIO_F_VERSION_1), 0);
        assert_ne!(features & (1 << VIRTIO_RING_F_INDIRECT_DESC), 0);
    }
    assert!(blk.protocol_features().contains(VhostUserProtocolFeatures::CONFIG));
    assert!(!rng.protocol_features().contains(VhostUserProtocolFeatures::CONFIG));
}

/// A vsock packet header (44 bytes, little-endian) as a guest driver writes it.
fn vsock_header(src_port: u32, dst_port: u32, op: u16) -> [u8; 44] {
    let mut h = [0u8; 44];
    h[0..8].copy_from_slice(&3u64.to_le_bytes()); // src_cid: the guest
    h[8..16].copy_from_slice(&2u64.to_le_bytes()); // dst_cid: the host
    h[16..20].copy_from_slice(&src_port.to_le_bytes());
    h[20..24].copy_from_slice(&dst_port.to_le_bytes());
    h[28..30].copy_from_slice(&1u16.to_le_bytes()); // type: stream
    h[30..32].copy_from_slice(&op.to_le_bytes());
    h[36..40].copy_from_slice(&(64u32 << 10).to_le_bytes()); // buf_alloc
    h
}

#[test]
fn a_vsock_answer_to_a_tx_packet_reaches_rx_within_the_same_kick() {
    use branchbox_virtio::vsock::{Vsock, RX, TX};
    use vm_memory::Bytes;
    const OP_REQUEST: u16 = 1;
    const OP_RST: u16 = 3;

    let dir = tempfile::tempdir().expect("tempdir");
    let mem = guest_memory();
    let atomic = GuestMemoryAtomic::from(mem.clone());
    let mut backend = Backend::new(Vsock::new(3, &dir.path().join("vsock.host")).expect("vsock"));
    backend.update_memory(atomic.clone()).expect("memory");
    let mut rx = ring(&atomic);
    let mut tx = Ring { driver: DriverQueue::new(0x20000, 16), ..ring(&atomic) };
    tx.vring.set_queue_info(tx.driver.desc.0, tx.driver.avail.0, tx.driver.used.0).expect("tx addresses");
    let mut bufs = Buffers::default();
    let rx_buf = bufs.alloc(4096);
    rx.driver.add_chain(&mem, &[(rx_buf, 4096, true)]);
    // The guest connects to a host port nobody serves: the device must answer RST on rx.
    let pkt = bufs.alloc(44);
    mem.write_slice(&vsock_header(5000, 6000, OP_REQUEST), pkt).expect("write the packet");
    tx.driver.add_chain(&mem, &[(pkt, 44, false)]);

    let vrings = [rx.vring.clone(), tx.vring.clone()];
    backend.handle_event(TX as u16, EventSet::IN, &vrings, 0).expect("handle the tx kick");

    assert_eq!(tx.driver.take_used(&mem).len(), 1);
    let answered = rx.driver.take_used(&mem);
    assert_eq!(answered.len(), 1, "the answer waited for another event");
    let mut op = [0u8; 2];
    mem.read_slice(&mut op, vm_memory::GuestAddress(rx_buf.0 + 30)).expect("read the answer");
    assert_eq!(u16::from_le_bytes(op), OP_RST);
    assert_eq!(backend.counters().chains(RX), 1);
}
