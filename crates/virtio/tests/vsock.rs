//! virtio-vsock driven through the virtio-mmio transport by the host-side test driver, with
//! real Unix socket clients on the host side.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use branchbox_persist::{NoContext, Snapshottable};
use branchbox_virtio::mmio::MmioTransport;
use branchbox_virtio::testing::*;
use branchbox_virtio::vsock::{Vsock, CONN_BUF, MAX_CONNECTIONS};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const CID: u64 = 3;
const FEATURES: u64 = (1 << 32) | (1 << 29);
const HDR: u32 = 44;
const REQUEST: u16 = 1;
const RESPONSE: u16 = 2;
const RST: u16 = 3;
const SHUTDOWN: u16 = 4;
const RW: u16 = 5;
const CREDIT_UPDATE: u16 = 6;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Pkt {
    src_cid: u64,
    dst_cid: u64,
    src_port: u32,
    dst_port: u32,
    len: u32,
    type_: u16,
    op: u16,
    flags: u32,
    buf_alloc: u32,
    fwd_cnt: u32,
}

impl Pkt {
    fn guest(src_port: u32, dst_port: u32, op: u16) -> Pkt {
        Pkt {
            src_cid: CID,
            dst_cid: 2,
            src_port,
            dst_port,
            type_: 1,
            op,
            buf_alloc: CONN_BUF,
            ..Pkt::default()
        }
    }

    fn bytes(&self) -> [u8; 44] {
        let mut b = [0u8; 44];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.type_.to_le_bytes());
        b[30..32].copy_from_slice(&self.op.to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }

    fn parse(b: &[u8]) -> Pkt {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u16_at = |i: usize| u16::from_le_bytes(b[i..i + 2].try_into().unwrap());
        Pkt {
            src_cid: u64_at(0),
            dst_cid: u64_at(8),
            src_port: u32_at(16),
            dst_port: u32_at(20),
            len: u32_at(24),
            type_: u16_at(28),
            op: u16_at(30),
            flags: u32_at(32),
            buf_alloc: u32_at(36),
            fwd_cnt: u32_at(40),
        }
    }
}

struct Rig {
    mem: Arc<GuestMemoryMmap>,
    dev: MmioTransport<Vsock, Arc<GuestMemoryMmap>>,
    rx: DriverQueue,
    tx: DriverQueue,
    ev: DriverQueue,
    bufs: Buffers,
    rx_bufs: Vec<(u16, GuestAddress)>,
    path: PathBuf,
}

impl Rig {
    fn new(dir: &Path) -> Rig {
        let path = dir.join("vsock.sock");
        let mem = guest_memory();
        let vsock = Vsock::new(CID, &path).unwrap();
        let mut dev = MmioTransport::new(vsock, mem.clone(), Box::new(CountingInterrupt::default()));
        let (rx, tx, ev) =
            (DriverQueue::new(0x1000, 256), DriverQueue::new(0x6000, 256), DriverQueue::new(0xb000, 256));
        assert_eq!(handshake(&mut dev, FEATURES, &[rx.clone(), tx.clone(), ev.clone()]), 0xf);
        let mut rig = Rig { mem, dev, rx, tx, ev, bufs: Buffers::default(), rx_bufs: Vec::new(), path };
        rig.give_rx(16);
        rig
    }

    /// Gives the device `n` RX buffers (header and 4 KiB of data, as Linux lays them out).
    fn give_rx(&mut self, n: usize) {
        for _ in 0..n {
            let h = self.bufs.alloc(HDR);
            let d = self.bufs.alloc(4096);
            let head = self.rx.add_chain(&self.mem, &[(h, HDR, true), (d, 4096, true)]);
            self.rx_bufs.push((head, h));
        }
        notify(&mut self.dev, 0);
    }

    fn send(&mut self, mut pkt: Pkt, data: &[u8]) {
        pkt.len = data.len() as u32;
        let h = self.bufs.alloc(HDR);
        self.mem.write_slice(&pkt.bytes(), h).unwrap();
        let mut chain = vec![(h, HDR, false)];
        if !data.is_empty() {
            let d = self.bufs.alloc(data.len() as u32);
            self.mem.write_slice(data, d).unwrap();
            chain.push((d, data.len() as u32, false));
        }
        self.tx.add_chain(&self.mem, &chain);
        notify(&mut self.dev, 1);
        assert_eq!(self.tx.take_used(&self.mem).len(), 1, "every TX chain is returned");
    }

    fn host_events(&mut self) {
        self.dev.device_mut().handle_host_events();
        self.dev.process_pending();
    }

    /// Packets the device put on the RX ring since the last call, with their payload.
    fn received(&mut self) -> Vec<(Pkt, Vec<u8>)> {
        let used = self.rx.take_used(&self.mem);
        let mut out = Vec::new();
        for (head, len) in used {
            let &(_, h) = self.rx_bufs.iter().find(|(hd, _)| *hd == head).unwrap();
            let mut raw = [0u8; 44];
            self.mem.read_slice(&mut raw, h).unwrap();
            let pkt = Pkt::parse(&raw);
            assert_eq!(len, HDR + pkt.len);
            let mut data = vec![0u8; pkt.len as usize];
            self.mem.read_slice(&mut data, GuestAddress(h.0 + 48)).unwrap();
            out.push((pkt, data));
        }
        let n = out.len();
        self.give_rx(n);
        out
    }

    /// A host client connects to guest port `port`; returns the stream and the host port.
    fn host_connect(&mut self, port: u32) -> (UnixStream, u32) {
        let mut client = UnixStream::connect(&self.path).unwrap();
        client.write_all(format!("CONNECT {port}\n").as_bytes()).unwrap();
        self.host_events();
        let got = self.received();
        assert_eq!(got.len(), 1);
        let req = got[0].0;
        assert_eq!((req.op, req.dst_port, req.dst_cid, req.src_cid), (REQUEST, port, CID, 2));
        self.send(Pkt::guest(port, req.src_port, RESPONSE), &[]);
        let mut line = vec![0u8; format!("OK {}\n", req.src_port).len()];
        client.read_exact(&mut line).unwrap();
        assert_eq!(String::from_utf8(line).unwrap(), format!("OK {}\n", req.src_port));
        (client, req.src_port)
    }
}

#[test]
fn vsock_host_connect_then_data_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Rig::new(dir.path());
    let mut cfg = [0u8; 8];
    branchbox_devices::BusDevice::read(&mut r.dev, 0x100, &mut cfg);
    assert_eq!(u64::from_le_bytes(cfg), CID);
    let (mut client, host_port) = r.host_connect(1024);

    client.write_all(b"ping from host").unwrap();
    r.host_events();
    let got = r.received();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].0.op, got[0].0.src_port, got[0].0.dst_port), (RW, host_port, 1024));
    assert_eq!(got[0].1, b"ping from host");

    r.send(Pkt::guest(1024, host_port, RW), b"pong from guest");
    let mut buf = [0u8; 15];
    client.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"pong from guest");

    // The host closes: the guest is told both directions are done, then resets.
    drop(client);
    r.host_events();
    let got = r.received();
    assert_eq!(got.iter().map(|p| p.0.op).collect::<Vec<_>>(), vec![SHUTDOWN]);
    r.send(Pkt::guest(1024, host_port, RST), &[]);
    assert_eq!(r.dev.device().connections(), 0);
}

#[test]
fn vsock_guest_connects_to_path_port_or_gets_reset() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Rig::new(dir.path());
    let listener = UnixListener::bind(format!("{}_5000", r.path.display())).unwrap();
    r.send(Pkt::guest(40000, 5000, REQUEST), &[]);
    let got = r.received();
    assert_eq!(got.iter().map(|p| (p.0.op, p.0.dst_port)).collect::<Vec<_>>(), vec![(RESPONSE, 40000)]);
    let (mut server, _) = listener.accept().unwrap();
    r.send(Pkt::guest(40000, 5000, RW), b"hello service");
    let mut buf = [0u8; 13];
    server.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"hello service");

    // The same REQUEST again on the live connection: both ends are dropped.
    r.send(Pkt::guest(40000, 5000, REQUEST), &[]);
    let got = r.received();
    assert_eq!(got.iter().map(|p| (p.0.op, p.0.dst_port)).collect::<Vec<_>>(), vec![(RST, 40000)]);
    assert_eq!(r.dev.device().connections(), 0);
    let mut rest = Vec::new();
    assert_eq!(server.read_to_end(&mut rest).unwrap(), 0, "the service sees the close");

    r.send(Pkt::guest(40001, 5001, REQUEST), &[]);
    let got = r.received();
    assert_eq!(
        got.iter().map(|p| (p.0.op, p.0.dst_port)).collect::<Vec<_>>(),
        vec![(RST, 40001)],
        "nothing listens on _5001"
    );
}

#[test]
fn vsock_host_to_guest_data_respects_guest_credit() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Rig::new(dir.path());
    let (mut client, host_port) = r.host_connect(1024);
    // The guest grants 10 bytes.
    let mut credit = Pkt::guest(1024, host_port, CREDIT_UPDATE);
    credit.buf_alloc = 10;
    r.send(credit, &[]);
    client.write_all(&[7u8; 100]).unwrap();
    r.host_events();
    let got = r.received();
    let total: usize = got.iter().map(|p| p.1.len()).sum();
    assert_eq!(total, 10, "no more than the credit given");
    // The guest consumed them and grants 10 more.
    credit.fwd_cnt = 10;
    r.send(credit, &[]);
    let got = r.received();
    assert_eq!(got.iter().map(|p| p.1.len()).sum::<usize>(), 10);
}

#[test]
fn vsock_guest_beyond_credit_is_reset_and_connection_cap_holds() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Rig::new(dir.path());
    let (mut client, host_port) = r.host_connect(1024);
    // The host client does not read; the guest sends more than buf_alloc.
    let chunk = vec![1u8; 60 << 10];
    let mut reset = false;
    for _ in 0..(2 * CONN_BUF as usize / chunk.len() + 8) {
        r.send(Pkt::guest(1024, host_port, RW), &chunk);
        if r.received().iter().any(|p| p.0.op == RST) {
            reset = true;
            break;
        }
    }
    assert!(reset, "a guest ignoring the credit is reset");
    assert_eq!(r.dev.device().connections(), 0);
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).unwrap();
    assert!(rest.len() <= 2 * CONN_BUF as usize + (1 << 20), "buffered bytes stay bounded");

    let mut clients = Vec::new();
    for _ in 0..MAX_CONNECTIONS + 1 {
        let mut c = UnixStream::connect(&r.path).unwrap();
        c.write_all(b"CONNECT 7\n").unwrap();
        clients.push(c);
    }
    r.host_events();
    r.received();
    assert_eq!(r.dev.device().connections(), MAX_CONNECTIONS);
    assert_eq!(r.dev.device().counters().refused_clients, 1);
}

#[test]
fn vsock_malformed_packets_and_lines_are_refused_without_harm() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Rig::new(dir.path());
    let mem = r.mem.clone();
    let h = r.bufs.alloc(64);
    mem.write_slice(&Pkt::guest(1, 2, RW).bytes(), h).unwrap();
    let q = r.tx.clone();
    // Header descriptor too short; device-writable header; len beyond 64 KiB; data missing.
    q.write_desc(&mem, 100, h.0, 20, 0, 0);
    r.tx.push_avail(&mem, 100);
    q.write_desc(&mem, 101, h.0, 44, F_WRITE, 0);
    r.tx.push_avail(&mem, 101);
    let mut big = Pkt::guest(1, 2, RW);
    big.len = 1 << 20;
    let hb = r.bufs.alloc(44);
    mem.write_slice(&big.bytes(), hb).unwrap();
    q.write_desc(&mem, 102, hb.0, 44, 0, 0);
    r.tx.push_avail(&mem, 102);
    let mut short = Pkt::guest(1, 2, RW);
    short.len = 100;
    let hs = r.bufs.alloc(44);
    mem.write_slice(&short.bytes(), hs).unwrap();
    q.write_desc(&mem, 103, hs.0, 44, 0, 0);
    r.tx.push_avail(&mem, 103);
    q.write_desc(&mem, 104, MEM_SIZE - 8, 44, 0, 0);
    r.tx.push_avail(&mem, 104);
    notify(&mut r.dev, 1);
    assert_eq!(r.tx.take_used(&mem).len(), 5);
    assert_eq!(r.dev.counters().rejected_chains, 5);

    // A packet from the wrong CID, and a stream packet for no connection, get RST.
    let mut spoof = Pkt::guest(9, 9, RW);
    spoof.src_cid = 77;
    r.send(spoof, b"x");
    r.send(Pkt::guest(9, 9, RW), b"x");
    let got = r.received();
    assert_eq!(got.iter().map(|p| p.0.op).collect::<Vec<_>>(), vec![RST, RST]);

    for line in [&b"HELLO\n"[..], b"CONNECT x\n", &[b'A'; 200][..]] {
        let mut c = UnixStream::connect(&r.path).unwrap();
        c.write_all(line).unwrap();
        r.host_events();
        let mut rest = Vec::new();
        // Closed with unread bytes still queued reads as a reset; either way nothing came.
        match c.read_to_end(&mut rest) {
            Ok(n) => assert_eq!(n, 0, "bad line {line:?} closes the client"),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset),
        }
    }
    assert_eq!(r.dev.device().counters().refused_clients, 3);
    let (_c, _) = r.host_connect(2048);
}

#[test]
fn vsock_restore_drops_host_connections_and_resets_the_guest_transport() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Rig::new(dir.path());
    let (mut client, _) = r.host_connect(1024);
    let ev_buf = r.bufs.alloc(8);
    r.ev.add_chain(&r.mem, &[(ev_buf, 8, true)]);
    notify(&mut r.dev, 2);
    let saved = r.dev.save(&mut NoContext).unwrap();
    assert_eq!(saved.device.connections.len(), 1);
    let Rig { mem, dev, mut ev, path, .. } = r;
    drop(dev);
    let mut rest = Vec::new();
    assert_eq!(client.read_to_end(&mut rest).unwrap(), 0, "the old process's socket is gone");

    let vsock = Vsock::new(CID, &path).unwrap();
    let mut fresh = MmioTransport::new(vsock, mem.clone(), Box::new(CountingInterrupt::default()));
    fresh.restore(&saved, &NoContext).unwrap();
    assert_eq!(fresh.device().counters().dropped_on_restore, 1);
    fresh.process_pending();
    let used = ev.take_used(&mem);
    assert_eq!(used.len(), 1);
    assert_eq!(mem.read_obj::<u32>(ev_buf).unwrap(), 0, "TRANSPORT_RESET event");
    // The restored device serves new clients.
    let mut c = UnixStream::connect(&path).unwrap();
    c.write_all(b"CONNECT 1024\n").unwrap();
    fresh.device_mut().handle_host_events();
    fresh.process_pending();
    assert_eq!(fresh.device().connections(), 1);
}

#[test]
fn vsock_rx_queue_not_ready_is_left_alone() {
    use branchbox_virtio::VirtioDevice;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.sock");
    let mut vsock = Vsock::new(CID, &path).unwrap();
    let mut client = UnixStream::connect(&path).unwrap();
    client.write_all(b"CONNECT 1024\n").unwrap();
    vsock.handle_host_events();
    assert_ne!(vsock.queues_with_work() & 1, 0, "a REQUEST waits for the guest");
    let mem = guest_memory();
    mem.write_slice(&[0xff; 64], GuestAddress(0)).unwrap();
    // A queue the driver has not set up: its ring addresses are all zero.
    let mut queue = <virtio_queue::Queue as virtio_queue::QueueT>::new(256).unwrap();
    let out = vsock.process_queue(0, &mut queue, &*mem).unwrap();
    assert!(out.used.is_empty());
    let mut low = [0u8; 64];
    mem.read_slice(&mut low, GuestAddress(0)).unwrap();
    assert_eq!(low, [0xff; 64], "nothing written at guest address 0");
}

#[test]
fn vsock_dropped_keeps_a_socket_another_device_bound_at_its_path_since() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vsock.sock");
    let old = Vsock::new(CID, &path).unwrap();
    // As a microvm rollback does: the old socket gets a second name, a new device binds the
    // sandbox's path, then the old device goes.
    std::fs::hard_link(&path, dir.path().join("vsock.sock.prev")).unwrap();
    let new = Vsock::new(CID, &path).unwrap();
    drop(old);
    assert!(path.exists(), "the old device removed the new device's socket");
    assert!(UnixStream::connect(&path).is_ok(), "the path is the new device's listener");
    drop(new);
    assert!(!path.exists(), "a device removes its own socket when it goes");
}
