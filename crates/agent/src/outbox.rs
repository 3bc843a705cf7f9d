//! The single writer of outgoing frames, with a freeze gate.
//!
//! Every frame is written whole under one lock, so a checkpoint taken while frozen never
//! catches half a frame in the pipe; after a restore the host's new pipe starts at a frame
//! boundary.

use branchbox_protocol::frame::{encode_header, write_raw};
use branchbox_protocol::Response;
use std::io::Write;
use std::sync::{Condvar, Mutex, MutexGuard};

struct State {
    out: Box<dyn Write + Send>,
    frozen: bool,
}

/// Serialises all outgoing frames.
pub struct Outbox {
    state: Mutex<State>,
    thawed: Condvar,
}

impl Outbox {
    /// Wraps the transport's write half.
    pub fn new(out: Box<dyn Write + Send>) -> Self {
        Outbox { state: Mutex::new(State { out, frozen: false }), thawed: Condvar::new() }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends one frame, waiting while the outbox is frozen.
    pub fn send(&self, id: u64, msg: &Response, body: &[u8]) {
        let mut st = self.lock();
        while st.frozen {
            st = self.thawed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        Self::write(&mut st, id, msg, body);
    }

    fn write(st: &mut State, id: u64, msg: &Response, body: &[u8]) {
        if let Err(e) = write_raw(&mut st.out, &encode_header(id, msg), body) {
            eprintln!("branchbox-agent: writing to the host failed: {e}");
        }
    }

    /// Holds every later frame until [`Outbox::thaw`], then confirms with `frozen`.
    pub fn freeze(&self, id: u64) {
        let mut st = self.lock();
        st.frozen = true;
        Self::write(&mut st, id, &Response::Frozen, &[]);
    }

    /// Sends `reply` and releases the held frames.
    pub fn thaw(&self, id: u64, reply: &Response) {
        let mut st = self.lock();
        st.frozen = false;
        Self::write(&mut st, id, reply, &[]);
        self.thawed.notify_all();
    }
}
