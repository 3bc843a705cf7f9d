//! A synchronous host-side client for one agent connection.
//!
//! One request is in flight per client; run several clients for concurrency (the gVisor shim
//! multiplexes many connections onto one agent).

use crate::frame::{read_frame, write_frame, Frame, FrameError};
use crate::message::*;
use crate::{CHUNK, PROTOCOL_VERSION};
use std::io::{Read, Write};

/// What can go wrong talking to the agent.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Framing or transport failure.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The agent refused or failed the request.
    #[error("{message}")]
    Agent {
        /// Error class.
        code: ErrorCode,
        /// The agent's message.
        message: String,
    },
    /// The connection ended before the request's terminal response.
    #[error("the agent connection closed before the answer arrived (is the sandbox still running?)")]
    Closed,
    /// The agent answered with a response that does not fit the request.
    #[error("unexpected answer from the agent: {0}")]
    Unexpected(String),
}

/// Output of a command collected in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// Standard output.
    pub stdout: Vec<u8>,
    /// Standard error.
    pub stderr: Vec<u8>,
    /// How it ended.
    pub status: ExitStatus,
}

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// A client over any byte stream to an agent (or to a shim in front of one).
pub struct AgentClient<S: Read + Write> {
    stream: S,
    next_id: u64,
}

impl<S: Read + Write> AgentClient<S> {
    /// Wraps a connected stream.
    pub fn new(stream: S) -> Self {
        AgentClient { stream, next_id: 1 }
    }

    /// The underlying stream.
    pub fn stream_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    fn send(&mut self, req: Request, body: Vec<u8>) -> Result<u64, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        write_frame(&mut self.stream, &Frame::with_body(id, req, body))?;
        Ok(id)
    }

    fn send_stream(&mut self, id: u64, src: &mut dyn Read) -> Result<(), ClientError> {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = match src.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(FrameError::Io(e).into()),
            };
            if n == 0 {
                break;
            }
            write_frame(&mut self.stream, &Frame::with_body(id, Request::Data, buf[..n].to_vec()))?;
        }
        write_frame(&mut self.stream, &Frame::new(id, Request::Eof))?;
        Ok(())
    }

    /// Reads the next frame for `id`, skipping frames of other ids (answers to requests whose
    /// caller gave up, e.g. after a restore).
    fn recv(&mut self, id: u64) -> Result<Frame<Response>, ClientError> {
        loop {
            match read_frame::<Response, _>(&mut self.stream)? {
                None => return Err(ClientError::Closed),
                Some(f) if f.id == id => {
                    if let Response::Error { code, message } = f.msg {
                        return Err(ClientError::Agent { code, message });
                    }
                    return Ok(f);
                }
                Some(_) => continue,
            }
        }
    }

    /// Sends a request with no streams and returns its terminal response.
    pub fn call(&mut self, req: Request, body: Vec<u8>) -> Result<Response, ClientError> {
        let id = self.send(req, body)?;
        loop {
            let f = self.recv(id)?;
            if f.msg.is_terminal() {
                return Ok(f.msg);
            }
        }
    }

    /// Version handshake.
    pub fn hello(&mut self) -> Result<(), ClientError> {
        match self.call(Request::Hello { version: PROTOCOL_VERSION }, Vec::new())? {
            Response::Hello { .. } => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Liveness check; returns the agent's uptime in milliseconds.
    pub fn ping(&mut self) -> Result<u64, ClientError> {
        match self.call(Request::Ping, Vec::new())? {
            Response::Pong { uptime_ms } => Ok(uptime_ms),
            other => Err(unexpected(other)),
        }
    }

    /// Agent and sandbox facts.
    pub fn info(&mut self) -> Result<AgentInfo, ClientError> {
        match self.call(Request::Info, Vec::new())? {
            Response::Info(i) => Ok(i),
            other => Err(unexpected(other)),
        }
    }

    /// Runs a command, handing each output chunk to `on_output` as it arrives.
    pub fn exec_streaming(
        &mut self,
        mut spec: ExecSpec,
        stdin: Option<&mut dyn Read>,
        on_output: &mut dyn FnMut(OutStream, &[u8]),
    ) -> Result<ExitStatus, ClientError> {
        spec.stdin = stdin.is_some();
        let id = self.send(Request::Exec(spec), Vec::new())?;
        if let Some(src) = stdin {
            self.send_stream(id, src)?;
        }
        loop {
            let f = self.recv(id)?;
            match f.msg {
                Response::Stdout => on_output(OutStream::Stdout, &f.body),
                Response::Stderr => on_output(OutStream::Stderr, &f.body),
                Response::Exited(status) => return Ok(status),
                other => return Err(unexpected(other)),
            }
        }
    }

    /// Runs a command and collects its output in memory.
    pub fn exec(&mut self, spec: ExecSpec, stdin: Option<&[u8]>) -> Result<ExecOutput, ClientError> {
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let mut src = stdin;
        let status =
            self.exec_streaming(spec, src.as_mut().map(|s| s as &mut dyn Read), &mut |which, chunk| {
                match which {
                    OutStream::Stdout => stdout.extend_from_slice(chunk),
                    OutStream::Stderr => stderr.extend_from_slice(chunk),
                }
            })?;
        Ok(ExecOutput { stdout, stderr, status })
    }

    /// Starts a background process and returns its pid.
    pub fn spawn(&mut self, spec: ExecSpec) -> Result<i32, ClientError> {
        match self.call(Request::Spawn(spec), Vec::new())? {
            Response::Spawned { pid } => Ok(pid),
            other => Err(unexpected(other)),
        }
    }

    /// Lists background processes.
    pub fn list_procs(&mut self) -> Result<Vec<ProcInfo>, ClientError> {
        match self.call(Request::ListProcs, Vec::new())? {
            Response::Procs { procs } => Ok(procs),
            other => Err(unexpected(other)),
        }
    }

    /// Signals a background process (or its process group).
    pub fn signal(&mut self, pid: i32, signal: i32, group: bool) -> Result<(), ClientError> {
        expect_ok(self.call(Request::Signal { pid, signal, group }, Vec::new())?)
    }

    /// Waits for a background process; `None` when `timeout_ms` passed first.
    pub fn wait(&mut self, pid: i32, timeout_ms: Option<u64>) -> Result<Option<ExecOutput>, ClientError> {
        let id = self.send(Request::Wait { pid, timeout_ms }, Vec::new())?;
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        loop {
            let f = self.recv(id)?;
            match f.msg {
                Response::Stdout => stdout.extend_from_slice(&f.body),
                Response::Stderr => stderr.extend_from_slice(&f.body),
                Response::Exited(status) => return Ok(Some(ExecOutput { stdout, stderr, status })),
                Response::StillRunning => return Ok(None),
                other => return Err(unexpected(other)),
            }
        }
    }

    /// Streams a file into `sink`; returns its size.
    pub fn read_file(&mut self, path: &str, sink: &mut dyn Write) -> Result<u64, ClientError> {
        let id = self.send(Request::ReadFile { path: path.to_string() }, Vec::new())?;
        loop {
            let f = self.recv(id)?;
            match f.msg {
                Response::Data => sink.write_all(&f.body).map_err(FrameError::Io)?,
                Response::FileEnd { size } => return Ok(size),
                other => return Err(unexpected(other)),
            }
        }
    }

    /// Reads a whole file into memory.
    pub fn read_file_bytes(&mut self, path: &str) -> Result<Vec<u8>, ClientError> {
        let mut out = Vec::new();
        self.read_file(path, &mut out)?;
        Ok(out)
    }

    /// Streams `src` into a file; returns the bytes written.
    pub fn write_file(
        &mut self,
        path: &str,
        src: &mut dyn Read,
        mode: Option<u32>,
        append: bool,
        parents: bool,
    ) -> Result<u64, ClientError> {
        let id =
            self.send(Request::WriteFile { path: path.to_string(), mode, append, parents }, Vec::new())?;
        self.send_stream(id, src)?;
        match self.recv(id)?.msg {
            Response::Written { size } => Ok(size),
            other => Err(unexpected(other)),
        }
    }

    /// Lists a directory.
    pub fn list_dir(&mut self, path: &str) -> Result<Vec<FileStat>, ClientError> {
        match self.call(Request::ListDir { path: path.to_string() }, Vec::new())? {
            Response::Entries { entries, .. } => Ok(entries),
            other => Err(unexpected(other)),
        }
    }

    /// Walks a directory tree; every entry carries its full path in `name`.
    pub fn walk(&mut self, path: &str, exclude: &[String]) -> Result<Vec<FileStat>, ClientError> {
        let id =
            self.send(Request::Walk { path: path.to_string(), exclude: exclude.to_vec() }, Vec::new())?;
        let mut out = Vec::new();
        let mut partial: Vec<u8> = Vec::new();
        loop {
            let f = self.recv(id)?;
            match f.msg {
                Response::Data => {
                    partial.extend_from_slice(&f.body);
                    while let Some(nl) = partial.iter().position(|b| *b == b'\n') {
                        let line: Vec<u8> = partial.drain(..=nl).collect();
                        let entry = serde_json::from_slice(&line[..line.len() - 1])
                            .map_err(|e| ClientError::Unexpected(format!("bad walk entry: {e}")))?;
                        out.push(entry);
                    }
                }
                Response::FileEnd { .. } => return Ok(out),
                other => return Err(unexpected(other)),
            }
        }
    }

    /// Stats a path.
    pub fn stat(&mut self, path: &str) -> Result<FileStat, ClientError> {
        match self.call(Request::Stat { path: path.to_string() }, Vec::new())? {
            Response::Stat(s) => Ok(s),
            other => Err(unexpected(other)),
        }
    }

    /// Removes a path.
    pub fn remove(&mut self, path: &str, recursive: bool) -> Result<(), ClientError> {
        expect_ok(self.call(Request::Remove { path: path.to_string(), recursive }, Vec::new())?)
    }

    /// Renames a path.
    pub fn rename(&mut self, from: &str, to: &str) -> Result<(), ClientError> {
        expect_ok(self.call(Request::Rename { from: from.to_string(), to: to.to_string() }, Vec::new())?)
    }

    /// Creates a directory.
    pub fn mkdir(&mut self, path: &str, parents: bool) -> Result<(), ClientError> {
        expect_ok(self.call(Request::Mkdir { path: path.to_string(), parents }, Vec::new())?)
    }
}

fn unexpected(r: Response) -> ClientError {
    ClientError::Unexpected(format!("{r:?}"))
}

fn expect_ok(r: Response) -> Result<(), ClientError> {
    match r {
        Response::Ok => Ok(()),
        other => Err(unexpected(other)),
    }
}
