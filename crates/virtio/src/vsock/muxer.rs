//! The host side of vsock: a Unix socket per sandbox, its connections, and the stream
//! protocol's state and credit, independent of queues and guest memory.
//!
//! Host-initiated: a client connects to the socket at `path`, writes `CONNECT <port>\n`; the
//! muxer sends the guest a REQUEST for `<port>` from a fresh host port, and when the guest
//! answers RESPONSE writes `OK <host_port>\n` to the client; the stream is then the guest
//! connection. A refused or malformed request closes the client's socket.
//! Guest-initiated: a REQUEST for host port `P` connects to the Unix socket `<path>_<P>`;
//! if nothing listens there the guest gets RST.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use super::conn::{Conn, State, CONN_BUF};

/// The host's CID.
pub const HOST_CID: u64 = 2;
/// Most connections (including clients still sending their `CONNECT` line) per device.
pub const MAX_CONNECTIONS: usize = 64;
/// Longest `CONNECT <port>\n` line accepted.
pub const MAX_LINE: usize = 32;
/// Most control packets (resets for unknown connections) waiting for RX buffers; more are
/// dropped, and the guest's connect attempt times out instead.
pub const MAX_PENDING_CONTROL: usize = 256;
/// Host ports handed to host-initiated connections start here, far from well-known ports.
const FIRST_HOST_PORT: u32 = 1 << 30;
const LISTENER_TOKEN: u64 = 0;

pub(crate) const TYPE_STREAM: u16 = 1;
pub(crate) const OP_REQUEST: u16 = 1;
pub(crate) const OP_RESPONSE: u16 = 2;
pub(crate) const OP_RST: u16 = 3;
pub(crate) const OP_SHUTDOWN: u16 = 4;
pub(crate) const OP_RW: u16 = 5;
pub(crate) const OP_CREDIT_UPDATE: u16 = 6;
pub(crate) const OP_CREDIT_REQUEST: u16 = 7;
const SHUTDOWN_RCV: u32 = 1;
const SHUTDOWN_SEND: u32 = 2;

/// A packet's header fields, as the guest sent them or as the muxer answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Header {
    /// Source CID.
    pub src_cid: u64,
    /// Destination CID.
    pub dst_cid: u64,
    /// Source port.
    pub src_port: u32,
    /// Destination port.
    pub dst_port: u32,
    /// Socket type (1: stream).
    pub type_: u16,
    /// Operation.
    pub op: u16,
    /// Operation flags (shutdown direction).
    pub flags: u32,
    /// Sender's buffer space.
    pub buf_alloc: u32,
    /// Bytes the sender has consumed.
    pub fwd_cnt: u32,
}

/// Counters of what the host side refused or dropped.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct VsockCounters {
    /// Host clients refused: over the connection cap, or a bad `CONNECT` line.
    pub refused_clients: u64,
    /// Guest packets answered with RST (unknown connection, wrong CID or type, nothing
    /// listening, over the cap, or data beyond the credit given).
    pub resets_sent: u64,
    /// Control packets dropped because too many were waiting.
    pub dropped_control: u64,
    /// Connections dropped by a restore (their host sockets cannot be carried over).
    pub dropped_on_restore: u64,
}

/// (host port, guest port).
type Key = (u32, u32);

struct Handshake {
    stream: UnixStream,
    line: Vec<u8>,
}

/// The host side of one vsock device.
pub struct Muxer {
    guest_cid: u64,
    path: PathBuf,
    /// The socket file this muxer bound (device and inode): dropping it removes `path` only
    /// while the file there is still that one.
    bound: Option<(u64, u64)>,
    listener: UnixListener,
    epoll: Epoll,
    next_token: u64,
    tokens: HashMap<u64, Option<Key>>,
    handshakes: HashMap<u64, Handshake>,
    conns: HashMap<Key, Conn>,
    control: VecDeque<Header>,
    next_host_port: u32,
    counters: VsockCounters,
}

impl Muxer {
    /// Listens on `path` (a stale socket file there is replaced).
    pub fn new(guest_cid: u64, path: &Path) -> io::Result<Muxer> {
        if std::fs::symlink_metadata(path)
            .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
        {
            std::fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path)?;
        let bound = file_id(path);
        listener.set_nonblocking(true)?;
        let epoll = Epoll::new()?;
        epoll.ctl(
            ControlOperation::Add,
            listener.as_raw_fd(),
            EpollEvent::new(EventSet::IN, LISTENER_TOKEN),
        )?;
        Ok(Muxer {
            guest_cid,
            path: path.to_path_buf(),
            bound,
            listener,
            epoll,
            next_token: LISTENER_TOKEN + 1,
            tokens: HashMap::new(),
            handshakes: HashMap::new(),
            conns: HashMap::new(),
            control: VecDeque::new(),
            next_host_port: FIRST_HOST_PORT,
            counters: VsockCounters::default(),
        })
    }

    /// The fd that becomes readable when the host side has work: watch it and call
    /// [`handle_host_events`](Self::handle_host_events).
    pub fn event_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// What was refused or dropped so far.
    pub fn counters(&self) -> VsockCounters {
        self.counters
    }

    /// Open connections (established, connecting or closing), not counting clients still
    /// sending their `CONNECT` line.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// `(host port, guest port)` of each open connection.
    pub fn connection_keys(&self) -> Vec<(u32, u32)> {
        let mut keys: Vec<(u32, u32)> = self.conns.keys().copied().collect();
        keys.sort_unstable();
        keys
    }

    pub(crate) fn guest_cid(&self) -> u64 {
        self.guest_cid
    }

    /// Drops every connection and pending packet (device reset or restore).
    pub(crate) fn drop_all(&mut self) -> usize {
        let n = self.conns.len();
        for (_, conn) in self.conns.drain() {
            let _ = self.epoll.ctl(ControlOperation::Delete, conn.stream.as_raw_fd(), EpollEvent::default());
        }
        for (_, hs) in self.handshakes.drain() {
            let _ = self.epoll.ctl(ControlOperation::Delete, hs.stream.as_raw_fd(), EpollEvent::default());
        }
        self.tokens.clear();
        self.control.clear();
        n
    }

    pub(crate) fn count_dropped_on_restore(&mut self, n: usize) {
        self.counters.dropped_on_restore += n as u64;
    }

    /// Accepts clients, reads `CONNECT` lines, flushes buffered data and notes readable
    /// streams. Afterwards the RX queue may have work.
    pub fn handle_host_events(&mut self) {
        let mut events = [EpollEvent::default(); 32];
        loop {
            let n = match self.epoll.wait(0, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            for ev in &events[..n] {
                match ev.data() {
                    LISTENER_TOKEN => self.accept_clients(),
                    token => match self.tokens.get(&token).copied() {
                        Some(None) => self.read_handshake(token),
                        Some(Some(key)) => self.stream_event(key, ev.event_set()),
                        None => {}
                    },
                }
            }
            if n < events.len() {
                return;
            }
        }
    }

    fn register(&mut self, stream: &UnixStream, key: Option<Key>) -> io::Result<u64> {
        let token = self.next_token;
        self.next_token += 1;
        let events = EventSet::IN | EventSet::OUT | EventSet::EDGE_TRIGGERED | EventSet::READ_HANG_UP;
        self.epoll.ctl(ControlOperation::Add, stream.as_raw_fd(), EpollEvent::new(events, token))?;
        self.tokens.insert(token, key);
        Ok(token)
    }

    fn accept_clients(&mut self) {
        loop {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            if self.conns.len() + self.handshakes.len() >= MAX_CONNECTIONS
                || stream.set_nonblocking(true).is_err()
            {
                self.counters.refused_clients += 1;
                continue;
            }
            match self.register(&stream, None) {
                Ok(token) => {
                    self.handshakes.insert(token, Handshake { stream, line: Vec::new() });
                    self.read_handshake(token);
                }
                Err(_) => self.counters.refused_clients += 1,
            }
        }
    }

    /// Reads the client's `CONNECT <port>\n` one byte at a time, so data the client sends
    /// right after the line stays in the socket for the guest.
    fn read_handshake(&mut self, token: u64) {
        let Some(hs) = self.handshakes.get_mut(&token) else { return };
        let mut byte = [0u8; 1];
        let port = loop {
            match hs.stream.read(&mut byte) {
                Ok(1) if byte[0] == b'\n' => break parse_connect(&hs.line),
                Ok(1) if hs.line.len() < MAX_LINE => hs.line.push(byte[0]),
                Ok(_) => break None,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break None,
            }
        };
        let Some(hs) = self.handshakes.remove(&token) else { return };
        let Some(port) = port else {
            self.forget(token, &hs.stream);
            self.counters.refused_clients += 1;
            return;
        };
        let host_port = self.allocate_host_port(port);
        self.tokens.insert(token, Some((host_port, port)));
        self.conns.insert((host_port, port), Conn::new(hs.stream, token, State::Connecting));
    }

    fn allocate_host_port(&mut self, guest_port: u32) -> u32 {
        loop {
            let port = self.next_host_port;
            self.next_host_port = self.next_host_port.checked_add(1).unwrap_or(FIRST_HOST_PORT);
            if !self.conns.contains_key(&(port, guest_port)) {
                return port;
            }
        }
    }

    fn forget(&mut self, token: u64, stream: &UnixStream) {
        let _ = self.epoll.ctl(ControlOperation::Delete, stream.as_raw_fd(), EpollEvent::default());
        self.tokens.remove(&token);
    }

    fn remove(&mut self, key: Key) {
        if let Some(conn) = self.conns.remove(&key) {
            self.forget(conn.token, &conn.stream);
        }
    }

    fn stream_event(&mut self, key: Key, events: EventSet) {
        let Some(conn) = self.conns.get_mut(&key) else { return };
        if events.intersects(EventSet::IN | EventSet::READ_HANG_UP | EventSet::HANG_UP) {
            conn.readable = true;
        }
        if events.contains(EventSet::OUT) && conn.flush_to_host().is_err() {
            self.reset(key);
        }
    }

    /// Drops the connection and tells the guest.
    fn reset(&mut self, key: Key) {
        self.remove(key);
        self.push_control(key, OP_RST, 0);
    }

    fn push_control(&mut self, (host_port, guest_port): Key, op: u16, flags: u32) {
        if self.control.len() >= MAX_PENDING_CONTROL {
            self.counters.dropped_control += 1;
            return;
        }
        if op == OP_RST {
            self.counters.resets_sent += 1;
        }
        self.control.push_back(self.header(host_port, guest_port, op, flags, 0));
    }

    fn header(&self, host_port: u32, guest_port: u32, op: u16, flags: u32, fwd_cnt: u32) -> Header {
        Header {
            src_cid: HOST_CID,
            dst_cid: self.guest_cid,
            src_port: host_port,
            dst_port: guest_port,
            type_: TYPE_STREAM,
            op,
            flags,
            buf_alloc: CONN_BUF,
            fwd_cnt,
        }
    }

    /// Handles one packet the guest sent (`data` is its payload).
    pub fn handle_tx(&mut self, hdr: &Header, data: &[u8]) {
        let key = (hdr.dst_port, hdr.src_port);
        if hdr.src_cid != self.guest_cid || hdr.dst_cid != HOST_CID || hdr.type_ != TYPE_STREAM {
            if hdr.op != OP_RST {
                self.push_control(key, OP_RST, 0);
            }
            return;
        }
        if hdr.op == OP_REQUEST {
            self.guest_connect(key);
            return;
        }
        let Some(conn) = self.conns.get_mut(&key) else {
            if hdr.op != OP_RST {
                self.push_control(key, OP_RST, 0);
            }
            return;
        };
        conn.peer_buf_alloc = hdr.buf_alloc;
        conn.peer_fwd_cnt = hdr.fwd_cnt;
        match (hdr.op, conn.state) {
            (OP_RESPONSE, State::Connecting) => {
                conn.state = State::Established;
                // The client may have written before the guest answered; its edge is gone.
                conn.readable = true;
                let ok = format!("OK {}\n", key.0);
                if conn.stream.write_all(ok.as_bytes()).is_err() {
                    self.reset(key);
                }
            }
            (OP_RW, State::Established) => {
                let room = (CONN_BUF as usize).saturating_sub(conn.to_host.len());
                if data.len() > room {
                    // The guest sent beyond the credit it was given.
                    self.reset(key);
                    return;
                }
                conn.to_host.extend(data);
                if conn.flush_to_host().is_err() {
                    self.reset(key);
                }
            }
            (OP_SHUTDOWN, _) => {
                if hdr.flags & SHUTDOWN_SEND != 0 {
                    let _ = conn.flush_to_host();
                    let _ = conn.stream.shutdown(std::net::Shutdown::Write);
                }
                if hdr.flags & (SHUTDOWN_RCV | SHUTDOWN_SEND) == SHUTDOWN_RCV | SHUTDOWN_SEND {
                    self.reset(key);
                }
            }
            (OP_RST, _) => self.remove(key),
            (OP_CREDIT_UPDATE, _) => conn.readable = true,
            (OP_CREDIT_REQUEST, _) => conn.send_credit = true,
            _ => self.reset(key),
        }
    }

    /// A guest REQUEST for host port `key.0`: connect to `<path>_<port>`.
    fn guest_connect(&mut self, key: Key) {
        if self.conns.contains_key(&key) {
            // A second REQUEST on a live connection: the guest lost track of it; drop both.
            self.reset(key);
            return;
        }
        if self.conns.len() + self.handshakes.len() >= MAX_CONNECTIONS {
            self.push_control(key, OP_RST, 0);
            return;
        }
        let mut target = self.path.clone().into_os_string();
        target.push(format!("_{}", key.0));
        let stream = match UnixStream::connect(&target) {
            Ok(s) if s.set_nonblocking(true).is_ok() => s,
            _ => {
                self.push_control(key, OP_RST, 0);
                return;
            }
        };
        match self.register(&stream, Some(key)) {
            Ok(token) => {
                self.conns.insert(key, Conn::new(stream, token, State::Established));
            }
            Err(_) => self.push_control(key, OP_RST, 0),
        }
    }

    /// Whether [`next_rx`](Self::next_rx) may have a packet.
    pub fn has_rx_work(&self) -> bool {
        !self.control.is_empty()
            || self.conns.values().any(|c| {
                c.send_request
                    || c.send_response
                    || c.send_credit
                    || c.send_shutdown
                    || (c.readable && c.state == State::Established && c.peer_credit() > 0)
            })
    }

    /// The next packet for the guest, with at most `max_data` bytes of payload read from the
    /// host stream; `None` when there is nothing to send now.
    pub fn next_rx(&mut self, max_data: u32) -> Option<(Header, Vec<u8>)> {
        if let Some(hdr) = self.control.pop_front() {
            return Some((hdr, Vec::new()));
        }
        let keys: Vec<Key> = self.conns.keys().copied().collect();
        for key in keys {
            if let Some(pkt) = self.conn_rx(key, max_data) {
                return Some(pkt);
            }
        }
        None
    }

    fn conn_rx(&mut self, key: Key, max_data: u32) -> Option<(Header, Vec<u8>)> {
        let conn = self.conns.get_mut(&key)?;
        let fwd_cnt = conn.fwd_cnt;
        let op = if conn.send_request {
            conn.send_request = false;
            OP_REQUEST
        } else if conn.send_response {
            conn.send_response = false;
            OP_RESPONSE
        } else if conn.send_shutdown {
            conn.send_shutdown = false;
            conn.state = State::Closing;
            let hdr = self.header(key.0, key.1, OP_SHUTDOWN, SHUTDOWN_RCV | SHUTDOWN_SEND, fwd_cnt);
            return Some((hdr, Vec::new()));
        } else if conn.readable && conn.state == State::Established && conn.peer_credit() > 0 {
            let want = conn.peer_credit().min(max_data) as usize;
            let mut buf = vec![0u8; want];
            match conn.stream.read(&mut buf) {
                Ok(0) => {
                    // The host client closed: tell the guest both directions are done.
                    conn.readable = false;
                    conn.send_shutdown = true;
                    return self.conn_rx(key, max_data);
                }
                Ok(n) => {
                    buf.truncate(n);
                    conn.rx_cnt = conn.rx_cnt.wrapping_add(n as u32);
                    conn.fwd_cnt_sent = fwd_cnt;
                    conn.send_credit = false;
                    let hdr = self.header(key.0, key.1, OP_RW, 0, fwd_cnt);
                    return Some((hdr, buf));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    conn.readable = false;
                    return None;
                }
                Err(_) => {
                    self.reset(key);
                    return self.control.pop_front().map(|h| (h, Vec::new()));
                }
            }
        } else if conn.send_credit {
            conn.send_credit = false;
            OP_CREDIT_UPDATE
        } else {
            return None;
        };
        conn.fwd_cnt_sent = fwd_cnt;
        Some((self.header(key.0, key.1, op, 0, fwd_cnt), Vec::new()))
    }
}

/// Device and inode of the file at `path` (not followed).
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

impl Drop for Muxer {
    /// Removes the socket file, unless another listener has bound that path since: a microvm
    /// rollback's new VMM binds the sandbox's vsock path while the old VMM still runs, and the
    /// old one's exit removed the new one's socket (every later connection found no file).
    fn drop(&mut self) {
        if self.bound.is_some() && file_id(&self.path) == self.bound {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// `CONNECT <port>` with a decimal port; anything else is refused.
fn parse_connect(line: &[u8]) -> Option<u32> {
    let line = std::str::from_utf8(line).ok()?;
    let port = line.strip_prefix("CONNECT ")?.trim_end_matches('\r');
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    port.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::parse_connect;

    #[test]
    fn connect_lines_are_parsed_strictly() {
        assert_eq!(parse_connect(b"CONNECT 1024"), Some(1024));
        assert_eq!(parse_connect(b"CONNECT 1024\r"), Some(1024));
        for bad in [
            &b"CONNECT"[..],
            b"CONNECT ",
            b"CONNECT -1",
            b"CONNECT 99999999999",
            b"connect 1",
            b"CONNECT +5",
            b"\xff",
        ] {
            assert_eq!(parse_connect(bad), None, "{bad:?}");
        }
    }
}
