//! Interactive terminal sessions: an `exec` with `pty`, split into a writer (keys typed, new
//! sizes) and a reader (the terminal's output, then how the command ended), so that one thread
//! can type while another reads.

use crate::client::{AgentClient, ClientError};
use crate::frame::{write_frame, Frame};
use crate::message::{ExecSpec, ExitStatus, PtySize, Request, Response};
use crate::CHUNK;
use std::os::unix::net::UnixStream;

/// What a terminal session sends back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PtyEvent {
    /// Bytes the terminal printed.
    Output(Vec<u8>),
    /// The command ended; nothing follows.
    Exited(ExitStatus),
}

/// The typing side of a terminal session.
pub struct PtyInput {
    stream: UnixStream,
    id: u64,
}

impl PtyInput {
    /// Types `bytes` into the terminal (in frames of at most [`CHUNK`] bytes).
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        for chunk in bytes.chunks(CHUNK) {
            write_frame(&mut self.stream, &Frame::with_body(self.id, Request::Data, chunk.to_vec()))?;
        }
        Ok(())
    }

    /// Gives the terminal a new size; the command gets `SIGWINCH`.
    pub fn resize(&mut self, size: PtySize) -> Result<(), ClientError> {
        write_frame(&mut self.stream, &Frame::new(self.id, Request::Resize(size)))?;
        Ok(())
    }

    /// Ends the session: the connection closes, so the agent (told by the shim, or by the
    /// closed vsock connection) kills the command's whole session and the reader sees the end.
    pub fn close(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// The reading side of a terminal session.
pub struct PtyOutput {
    client: AgentClient<UnixStream>,
    id: u64,
    done: bool,
}

impl PtyOutput {
    /// The next output of the terminal, or how its command ended. Waits as long as the
    /// session lasts (a terminal may sit idle for hours): [`PtyInput::close`] ends the wait.
    /// Each frame is bounded by the framing limits; there is no cap on a session's total
    /// output, which is handed on as it comes and never held.
    pub fn recv(&mut self) -> Result<PtyEvent, ClientError> {
        if self.done {
            return Err(ClientError::Closed);
        }
        let f = self.client.recv_within(self.id, None)?;
        match f.msg {
            Response::Stdout | Response::Stderr => Ok(PtyEvent::Output(f.body)),
            Response::Exited(status) => {
                self.done = true;
                Ok(PtyEvent::Exited(status))
            }
            other => {
                self.done = true;
                Err(ClientError::Unexpected(format!("{other:?}")))
            }
        }
    }
}

impl AgentClient<UnixStream> {
    /// Starts `spec`'s command on a new terminal of `size` and returns the session's two
    /// sides. The spec's timeout applies as for any command; its output cap does not (the
    /// output is streamed, not collected).
    pub fn open_pty(
        mut self,
        mut spec: ExecSpec,
        size: PtySize,
    ) -> Result<(PtyInput, PtyOutput), ClientError> {
        spec.pty = Some(size);
        spec.stdin = true;
        spec.output_cap = Some(u64::MAX);
        let writer = self.stream_mut().try_clone().map_err(|e| ClientError::Frame(e.into()))?;
        writer.set_read_timeout(None).map_err(|e| ClientError::Frame(e.into()))?;
        let id = self.send(Request::Exec(spec), Vec::new())?;
        Ok((PtyInput { stream: writer, id }, PtyOutput { client: self, id, done: false }))
    }
}
