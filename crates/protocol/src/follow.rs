//! Following what runs on in a sandbox: typing into a background process's stdin, attaching to
//! its output, and watching a directory. Each streams for as long as the thing it follows, so
//! none has a call timeout: the caller ends an attach or a watch by closing the connection.

use crate::client::{AgentClient, ClientError, OutStream, Transport};
use crate::message::{ExitStatus, Request, Response, WatchEvent};
use crate::CHUNK;

/// Longest line of a watch event: a path of 4096 bytes, every byte escaped, plus the rest.
const MAX_WATCH_LINE: usize = 6 * crate::limits::MAX_GUEST_PATH + 64;

impl<S: Transport> AgentClient<S> {
    /// Writes `bytes` to the stdin of background process `pid` (started with `stdin`), in
    /// requests of at most [`CHUNK`] bytes; with `eof`, closes its stdin after them.
    pub fn proc_input(&mut self, pid: i32, bytes: &[u8], eof: bool) -> Result<(), ClientError> {
        let mut chunks: Vec<&[u8]> = bytes.chunks(CHUNK).collect();
        if chunks.is_empty() {
            chunks.push(&[]);
        }
        let last = chunks.len() - 1;
        for (i, chunk) in chunks.into_iter().enumerate() {
            let req = Request::ProcInput { pid, eof: eof && i == last };
            match self.call(req, chunk.to_vec())? {
                Response::Ok => {}
                other => return Err(ClientError::Unexpected(format!("{other:?}"))),
            }
        }
        Ok(())
    }

    /// Hands background process `pid`'s output from now on (with `replay`, first the output it
    /// kept so far) to `on_output` and returns how it ended (at once when it already has).
    /// Output is passed on, never collected.
    pub fn attach(
        &mut self,
        pid: i32,
        replay: bool,
        on_output: &mut dyn FnMut(OutStream, &[u8]),
    ) -> Result<ExitStatus, ClientError> {
        self.attach_then(pid, replay, &mut || {}, on_output)
    }

    /// As [`attach`](Self::attach), and calls `on_attached` once the agent has the reader in
    /// place: every byte the process prints after that reaches `on_output`. A caller that
    /// answers its own client only then (the service's follow streams) can promise "from now
    /// on" without a window in which output is lost. An agent too old to say so calls it never;
    /// its first output or the exit then stands for it.
    pub fn attach_then(
        &mut self,
        pid: i32,
        replay: bool,
        on_attached: &mut dyn FnMut(),
        on_output: &mut dyn FnMut(OutStream, &[u8]),
    ) -> Result<ExitStatus, ClientError> {
        let id = self.send(Request::Attach { pid, replay }, Vec::new())?;
        loop {
            let f = self.recv_within(id, None)?;
            match f.msg {
                Response::Data if f.body.is_empty() => on_attached(),
                Response::Stdout => on_output(OutStream::Stdout, &f.body),
                Response::Stderr => on_output(OutStream::Stderr, &f.body),
                Response::Exited(status) => return Ok(status),
                other => return Err(ClientError::Unexpected(format!("{other:?}"))),
            }
        }
    }

    /// Hands each change under directory `path` (and its subdirectories with `recursive`) to
    /// `on_event` until `on_event` returns false (the caller then drops the connection, which
    /// cancels the watch) or the directory goes (`Ok` with the number of events). `on_event`
    /// first gets `None` once the watch is in place: every change after that is reported. Each
    /// event's line is bounded and must parse.
    pub fn watch(
        &mut self,
        path: &str,
        recursive: bool,
        on_event: &mut dyn FnMut(Option<WatchEvent>) -> bool,
    ) -> Result<u64, ClientError> {
        let id = self.send(Request::Watch { path: path.to_string(), recursive }, Vec::new())?;
        loop {
            let f = self.recv_within(id, None)?;
            match f.msg {
                Response::Data if f.body.is_empty() => {
                    if !on_event(None) {
                        return Ok(0);
                    }
                }
                Response::Data => {
                    for line in f.body.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                        if line.len() > MAX_WATCH_LINE {
                            return Err(ClientError::LimitExceeded {
                                what: "a watch event",
                                limit: MAX_WATCH_LINE as u64,
                            });
                        }
                        let event: WatchEvent = serde_json::from_slice(line).map_err(|e| {
                            ClientError::Unexpected(format!("a watch event that does not parse: {e}"))
                        })?;
                        if !on_event(Some(event)) {
                            return Ok(0);
                        }
                    }
                }
                Response::FileEnd { size } => return Ok(size),
                other => return Err(ClientError::Unexpected(format!("{other:?}"))),
            }
        }
    }
}
