//! virtio-net driven through the virtio-mmio transport by the host-side test driver, with a
//! datagram socket pair standing in for the tap (one frame per datagram).

use std::os::unix::net::UnixDatagram;
use std::sync::Arc;

use branchbox_persist::{NoContext, Snapshottable};
use branchbox_virtio::mmio::MmioTransport;
use branchbox_virtio::net::{Net, NetState, GUEST_MAC, HDR_LEN, MAX_PENDING, RX, TX};
use branchbox_virtio::testing::*;
use branchbox_virtio::VirtioDevice;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// VERSION_1, EVENT_IDX, MAC, STATUS.
const FEATURES: u64 = (1 << 32) | (1 << 29) | (1 << 5) | (1 << 16);
/// What Linux posts per RX buffer without mergeable buffers or offloads: header + 1,518.
const RX_BUF: u32 = HDR_LEN as u32 + 1518;

struct Rig {
    mem: Arc<GuestMemoryMmap>,
    dev: MmioTransport<Net, Arc<GuestMemoryMmap>>,
    rx: DriverQueue,
    tx: DriverQueue,
    bufs: Buffers,
    rx_bufs: Vec<(u16, GuestAddress)>,
    host: UnixDatagram,
    irq: CountingInterrupt,
}

impl Rig {
    fn new() -> Rig {
        let (host, port) = UnixDatagram::pair().unwrap();
        port.set_nonblocking(true).unwrap();
        host.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let mem = guest_memory();
        let irq = CountingInterrupt::default();
        let mut dev =
            MmioTransport::new(Net::new(Box::new(port), GUEST_MAC), mem.clone(), Box::new(irq.clone()));
        let (rx, tx) = (DriverQueue::new(0x1000, 256), DriverQueue::new(0x6000, 256));
        assert_eq!(handshake(&mut dev, FEATURES, &[rx.clone(), tx.clone()]), 0xf);
        Rig { mem, dev, rx, tx, bufs: Buffers::default(), rx_bufs: Vec::new(), host, irq }
    }

    /// Posts `n` RX buffers of `len` bytes (header included).
    fn give_rx(&mut self, n: usize, len: u32) {
        for _ in 0..n {
            let b = self.bufs.alloc(len);
            let head = self.rx.add_chain(&self.mem, &[(b, len, true)]);
            self.rx_bufs.push((head, b));
        }
        notify(&mut self.dev, RX as u32);
    }

    /// The guest sends `hdr` + `frame` as one chain of two buffers, as Linux does.
    fn send(&mut self, hdr: [u8; HDR_LEN], frame: &[u8]) -> Vec<(u16, u32)> {
        let h = self.bufs.alloc(HDR_LEN as u32);
        let d = self.bufs.alloc(frame.len() as u32);
        self.mem.write_slice(&hdr, h).unwrap();
        self.mem.write_slice(frame, d).unwrap();
        self.tx.add_chain(&self.mem, &[(h, HDR_LEN as u32, false), (d, frame.len() as u32, false)]);
        notify(&mut self.dev, TX as u32);
        self.tx.take_used(&self.mem)
    }

    /// The host side's frames reach the guest as the transport's host thread would pass them.
    fn host_events(&mut self) {
        self.dev.device_mut().handle_host_events();
        self.dev.process_pending();
    }

    /// Frames the guest received since the last call: (header, frame).
    fn received(&mut self) -> Vec<(Vec<u8>, Vec<u8>)> {
        let used = self.rx.take_used(&self.mem);
        used.into_iter()
            .map(|(head, len)| {
                let addr = self.rx_bufs.iter().find(|(h, _)| *h == head).expect("a posted buffer").1;
                let mut all = vec![0u8; len as usize];
                self.mem.read_slice(&mut all, addr).unwrap();
                let frame = all.split_off(HDR_LEN.min(all.len()));
                (all, frame)
            })
            .collect()
    }
}

fn frame(n: usize, fill: u8) -> Vec<u8> {
    let mut f = vec![fill; n];
    f[..6].copy_from_slice(&GUEST_MAC);
    f
}

#[test]
fn config_space_has_the_mac_and_a_link_that_is_up() {
    let (_, port) = UnixDatagram::pair().unwrap();
    let net = Net::new(Box::new(port), GUEST_MAC);
    assert_eq!(net.config(), vec![0x02, 0x62, 0x62, 0, 0, 2, 1, 0]);
    assert_eq!(net.features() & FEATURES, FEATURES);
    // No offloads and no mergeable buffers are offered: bits 0 (CSUM), 1 (GUEST_CSUM), 11
    // (HOST_TSO4), 15 (MRG_RXBUF), 17 (CTRL_VQ).
    for bit in [0, 1, 7, 11, 15, 17] {
        assert_eq!(net.features() & (1 << bit), 0, "feature bit {bit} offered");
    }
}

#[test]
fn frames_pass_both_ways_with_the_header_stripped_and_added() {
    let mut rig = Rig::new();
    let out = frame(1514, 0xab);
    assert_eq!(rig.send([0; HDR_LEN], &out).len(), 1);
    let mut got = vec![0u8; 70_000];
    let n = rig.host.recv(&mut got).unwrap();
    assert_eq!(&got[..n], &out[..], "the host side got the frame without the virtio header");

    rig.give_rx(4, RX_BUF);
    let before = rig.irq.count();
    for (len, fill) in [(60, 1u8), (1514, 2), (342, 3)] {
        rig.host.send(&frame(len, fill)).unwrap();
    }
    rig.host_events();
    let got = rig.received();
    assert_eq!(got.len(), 3);
    for ((hdr, f), (len, fill)) in got.iter().zip([(60, 1u8), (1514, 2), (342, 3)]) {
        assert_eq!(hdr, &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0], "num_buffers is 1, nothing else set");
        assert_eq!(f, &frame(len, fill));
    }
    assert!(rig.irq.count() > before, "the guest was interrupted for its frames");
    let c = rig.dev.device().counters();
    assert_eq!((c.tx_frames, c.rx_frames, c.tx_dropped, c.rx_dropped), (1, 3, 0, 0));
}

#[test]
fn frames_wait_for_buffers_and_a_full_list_drops_instead_of_growing() {
    let mut rig = Rig::new();
    rig.host.send(&frame(100, 7)).unwrap();
    rig.host_events();
    assert!(rig.received().is_empty(), "no buffers posted yet");
    assert_eq!(rig.dev.device().queues_with_work(), 1 << RX, "the frame waits");
    // The guest posting buffers (and kicking RX) delivers what waited.
    rig.give_rx(1, RX_BUF);
    let got = rig.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, frame(100, 7));

    for i in 0..MAX_PENDING + 10 {
        rig.host.send(&frame(60, i as u8)).unwrap();
        if i % 8 == 7 {
            rig.host_events();
        }
    }
    rig.host_events();
    let c = rig.dev.device().counters();
    assert_eq!(c.rx_dropped, 10, "frames past the pending list's bound are dropped");
    rig.give_rx(MAX_PENDING, RX_BUF);
    assert_eq!(rig.received().len(), MAX_PENDING);
    assert_eq!(rig.dev.device().queues_with_work(), 0);
}

#[test]
fn a_buffer_too_small_for_the_frame_is_returned_empty_and_the_frame_counted_lost() {
    let mut rig = Rig::new();
    rig.give_rx(1, 64);
    rig.host.send(&frame(1514, 9)).unwrap();
    rig.host_events();
    let used = rig.rx.take_used(&rig.mem);
    assert_eq!(used.len(), 1);
    assert_eq!(used[0].1, 0, "nothing written into a buffer the frame does not fit");
    assert_eq!(rig.dev.device().counters().rx_dropped, 1);
    // The device carries on with the next frame.
    rig.give_rx(1, RX_BUF);
    rig.host.send(&frame(80, 4)).unwrap();
    rig.host_events();
    assert_eq!(rig.received()[0].1, frame(80, 4));
}

#[test]
fn tx_chains_asking_for_offloads_or_holding_no_frame_are_refused_and_the_device_goes_on() {
    let mut rig = Rig::new();
    let needs_csum = {
        let mut h = [0u8; HDR_LEN];
        h[0] = 1;
        h
    };
    let gso = {
        let mut h = [0u8; HDR_LEN];
        h[1] = 1;
        h
    };
    for hdr in [needs_csum, gso] {
        assert_eq!(rig.send(hdr, &frame(100, 1)).len(), 1, "the refused chain is still returned");
    }
    // A chain of only part of a header.
    let h = rig.bufs.alloc(8);
    rig.tx.add_chain(&rig.mem, &[(h, 8, false)]);
    notify(&mut rig.dev, TX as u32);
    assert_eq!(rig.tx.take_used(&rig.mem).len(), 1);
    // A chain with a device-writable buffer is malformed for TX.
    let w = rig.bufs.alloc(64);
    rig.tx.add_chain(&rig.mem, &[(w, 64, true)]);
    notify(&mut rig.dev, TX as u32);
    assert_eq!(rig.tx.take_used(&rig.mem).len(), 1);
    let c = rig.dev.device().counters();
    assert_eq!((c.tx_frames, c.tx_dropped), (0, 4));
    rig.host.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 2048];
    assert!(rig.host.recv(&mut buf).is_err(), "nothing refused reached the host side");
    rig.host.set_nonblocking(false).unwrap();
    assert_eq!(rig.send([0; HDR_LEN], &frame(60, 5)).len(), 1);
    assert_eq!(rig.host.recv(&mut buf).unwrap(), 60);
}

#[test]
fn a_saved_device_restores_with_its_mac_and_refuses_another() {
    let mut rig = Rig::new();
    let state = rig.dev.device_mut().save(&mut NoContext).unwrap();
    assert_eq!(state.mac, GUEST_MAC);
    let (_, port) = UnixDatagram::pair().unwrap();
    let mut other = Net::new(Box::new(port), [2, 0, 0, 0, 0, 9]);
    let err = other.restore(&state, &NoContext).unwrap_err().to_string();
    assert!(err.contains("02:62:62:00:00:02"), "{err}");
    let (_, port) = UnixDatagram::pair().unwrap();
    let mut same = Net::new(Box::new(port), GUEST_MAC);
    same.restore(&NetState { mac: GUEST_MAC, acked_features: u64::MAX }, &NoContext).unwrap();
    assert_eq!(
        same.save(&mut NoContext).unwrap().acked_features,
        same.features(),
        "acks masked to the offer"
    );
}
