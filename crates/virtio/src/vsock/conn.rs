//! One vsock connection: its host stream, protocol state and credit counters.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::os::unix::net::UnixStream;

/// Bytes each connection buffers from the guest (advertised as `buf_alloc`): data the
/// guest sends that the host client has not read yet.
pub const CONN_BUF: u32 = 256 << 10;

/// Where a connection is in the stream protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// Host-initiated, REQUEST sent or to be sent, waiting for RESPONSE.
    Connecting,
    /// Data flows both ways.
    Established,
    /// SHUTDOWN sent to the guest after the host closed; waiting for its RST.
    Closing,
}

/// A connection between a host Unix stream and a guest port.
pub(super) struct Conn {
    /// The host end.
    pub(super) stream: UnixStream,
    /// The stream's epoll token.
    pub(super) token: u64,
    pub(super) state: State,
    /// Control packets owed to the guest.
    pub(super) send_request: bool,
    pub(super) send_response: bool,
    pub(super) send_credit: bool,
    pub(super) send_shutdown: bool,
    /// The guest's buffer space and how much of what we sent it has consumed.
    pub(super) peer_buf_alloc: u32,
    pub(super) peer_fwd_cnt: u32,
    /// Bytes sent to the guest.
    pub(super) rx_cnt: u32,
    /// Bytes of the guest's written to the host stream, and the count last told the guest.
    pub(super) fwd_cnt: u32,
    pub(super) fwd_cnt_sent: u32,
    /// Guest data the host client has not taken yet, at most `CONN_BUF` bytes.
    pub(super) to_host: VecDeque<u8>,
    /// The stream may have data (set by its edge-triggered event, cleared on `WouldBlock`).
    pub(super) readable: bool,
}

impl Conn {
    pub(super) fn new(stream: UnixStream, token: u64, state: State) -> Conn {
        Conn {
            stream,
            token,
            state,
            send_request: state == State::Connecting,
            send_response: state == State::Established,
            send_credit: false,
            send_shutdown: false,
            peer_buf_alloc: 0,
            peer_fwd_cnt: 0,
            rx_cnt: 0,
            fwd_cnt: 0,
            fwd_cnt_sent: 0,
            to_host: VecDeque::new(),
            readable: state == State::Established,
        }
    }

    /// Bytes the guest can still take on this connection.
    pub(super) fn peer_credit(&self) -> u32 {
        self.peer_buf_alloc.saturating_sub(self.rx_cnt.wrapping_sub(self.peer_fwd_cnt))
    }

    /// Writes what the guest sent to the host client, as far as it takes it now.
    pub(super) fn flush_to_host(&mut self) -> io::Result<()> {
        while !self.to_host.is_empty() {
            let (front, _) = self.to_host.as_slices();
            match self.stream.write(front) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.to_host.drain(..n);
                    self.fwd_cnt = self.fwd_cnt.wrapping_add(n as u32);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if self.fwd_cnt.wrapping_sub(self.fwd_cnt_sent) >= CONN_BUF / 4 {
            self.send_credit = true;
        }
        Ok(())
    }
}
