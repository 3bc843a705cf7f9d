//! A synchronous host-side client for one agent connection.
//!
//! One request is in flight per client; run several clients for concurrency (the gVisor shim
//! multiplexes many connections onto one agent). Every answer is checked against the client's
//! [`Limits`]: the agent is inside the sandbox, and so is anything that can forge its frames.

use crate::frame::{encode_header, read_frame, write_frame, write_raw, Frame, FrameError, MAX_HEADER};
use crate::limits::{Limits, MAX_WALK_LINE, PROC_TAIL, SHIM_HEADER_ROOM};
use crate::message::*;
use crate::{CHUNK, PROTOCOL_VERSION};
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

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
    /// The answer broke a limit the host enforces; the call was stopped. Either the request
    /// asked for more than the limit allows, or something in the sandbox forged the agent's
    /// frames.
    #[error("{what} went over the host's limit of {limit} bytes, so the call was stopped (a process in the sandbox may be writing to the agent's pipes)")]
    LimitExceeded {
        /// What went over.
        what: &'static str,
        /// The limit.
        limit: u64,
    },
    /// No frame of the answer arrived in time.
    #[error("the sandbox's agent sent nothing for {} s, so the call was abandoned; check that the sandbox still runs (`branchbox ls`) and retry", .waited.as_secs())]
    Timeout {
        /// How long the client waited.
        waited: Duration,
    },
    /// The host's random source failed, so no fresh identity could be made for the sandbox;
    /// nothing was sent.
    #[error("the host could not draw random bytes for the sandbox's new identity ({0}); check the host's getrandom(2) and retry")]
    Entropy(io::Error),
    /// The request is too large for one frame; nothing was sent.
    #[error("the request takes {len} bytes, over the limit of {limit} bytes for one request ({what} together): pass long data through stdin or a file")]
    RequestTooLarge {
        /// What the request holds.
        what: &'static str,
        /// Its encoded size.
        len: usize,
        /// The limit.
        limit: usize,
    },
}

/// A byte stream to an agent whose reads can be bounded in time.
pub trait Transport: Read + Write {
    /// Bounds each following read to `timeout` (`None`: no bound). Transports without
    /// timeouts keep the default, which bounds nothing.
    fn set_read_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        let _ = timeout;
        Ok(())
    }
}

impl Transport for UnixStream {
    fn set_read_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        UnixStream::set_read_timeout(self, timeout)
    }
}

/// Reads from a transport until a deadline, then fails with `TimedOut`.
struct Within<'a, S> {
    stream: &'a mut S,
    deadline: Option<Instant>,
}

impl<S: Transport> Read for Within<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = match self.deadline {
            None => None,
            Some(d) => {
                // A zero timeout means "none" to the socket: never hand it one.
                let left = d.saturating_duration_since(Instant::now());
                if left < Duration::from_millis(1) {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                Some(left)
            }
        };
        self.stream.set_read_timeout(left)?;
        match self.stream.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(io::ErrorKind::TimedOut.into()),
            r => r,
        }
    }
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
pub struct AgentClient<S: Transport> {
    stream: S,
    next_id: u64,
    limits: Limits,
    on_violation: Option<ViolationHook>,
}

/// Called when an answer breaks a limit the host enforces ([`ClientError::LimitExceeded`]):
/// the engine uses it to flag the sandbox, since an honest agent never does that.
pub type ViolationHook = std::sync::Arc<dyn Fn(&ClientError) + Send + Sync>;

/// Bytes counted against a limit.
struct Budget {
    what: &'static str,
    used: u64,
    limit: u64,
}

impl Budget {
    fn new(what: &'static str, limit: u64) -> Self {
        Budget { what, used: 0, limit }
    }

    fn take(&mut self, n: usize) -> Result<(), ClientError> {
        self.used = self.used.saturating_add(n as u64);
        if self.used > self.limit {
            return Err(ClientError::LimitExceeded { what: self.what, limit: self.limit });
        }
        Ok(())
    }
}

impl<S: Transport> AgentClient<S> {
    /// Wraps a connected stream, with the default [`Limits`].
    pub fn new(stream: S) -> Self {
        AgentClient { stream, next_id: 1, limits: Limits::default(), on_violation: None }
    }

    /// Calls `hook` whenever a call of this client ends because the answer broke a host limit.
    pub fn on_violation(&mut self, hook: ViolationHook) {
        self.on_violation = Some(hook);
    }

    /// Passes a call's result through, telling the violation hook about a broken limit.
    fn checked<T>(&self, r: Result<T, ClientError>) -> Result<T, ClientError> {
        if let (Err(e @ ClientError::LimitExceeded { .. }), Some(hook)) = (&r, &self.on_violation) {
            hook(e);
        }
        r
    }

    /// The underlying stream. Its read timeout is set from [`Limits::timeout`] before every
    /// read, so bound a call's waits with [`AgentClient::set_wait`], not on the stream.
    pub fn stream_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    /// The limits this client enforces.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Replaces the limits this client enforces.
    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    /// Sets the longest wait for the next frame of an answer ([`Limits::timeout`]).
    pub fn set_wait(&mut self, wait: Option<Duration>) {
        self.limits.timeout = wait;
    }

    /// How long to wait for each frame of an answer to a request with its own timeout
    /// (`exec`, `wait`): that timeout plus the grace, or the client's timeout if longer; no
    /// bound when the request has none.
    fn wait_for(&self, own_ms: Option<u64>) -> Option<Duration> {
        let own = Duration::from_millis(own_ms?).saturating_add(self.limits.grace);
        Some(self.limits.timeout.map_or(own, |t| t.max(own)))
    }

    pub(crate) fn send(&mut self, req: Request, body: Vec<u8>) -> Result<u64, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        let header = encode_header(id, &req);
        let limit = MAX_HEADER - SHIM_HEADER_ROOM;
        if header.len() > limit {
            let what = match req {
                Request::Exec(_) | Request::Spawn(_) => "argv or shell line, environment and cwd",
                _ => "paths and names",
            };
            return Err(ClientError::RequestTooLarge { what, len: header.len(), limit });
        }
        write_raw(&mut self.stream, &header, &body)?;
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
    /// caller gave up, e.g. after a restore). Fails when no frame for `id` arrives within
    /// `wait`: skipped frames do not extend it.
    pub(crate) fn recv_within(
        &mut self,
        id: u64,
        wait: Option<Duration>,
    ) -> Result<Frame<Response>, ClientError> {
        let mut r = Within { stream: &mut self.stream, deadline: wait.map(|w| Instant::now() + w) };
        let timed_out =
            |e: &FrameError| matches!(e, FrameError::Io(e) if e.kind() == io::ErrorKind::TimedOut);
        loop {
            match read_frame::<Response, _>(&mut r) {
                Err(e) if timed_out(&e) => {
                    return Err(ClientError::Timeout { waited: wait.unwrap_or_default() })
                }
                Err(e) => return Err(e.into()),
                Ok(None) => return Err(ClientError::Closed),
                Ok(Some(f)) if f.id == id => {
                    if let Response::Error { code, message } = f.msg {
                        return Err(ClientError::Agent { code, message });
                    }
                    return Ok(f);
                }
                Ok(Some(_)) => continue,
            }
        }
    }

    fn recv(&mut self, id: u64) -> Result<Frame<Response>, ClientError> {
        self.recv_within(id, self.limits.timeout)
    }

    /// Sends a request with no streams and returns its terminal response; a streamed answer
    /// (`data`, `stdout`, `stderr`) is refused.
    pub fn call(&mut self, req: Request, body: Vec<u8>) -> Result<Response, ClientError> {
        let id = self.send(req, body)?;
        let f = self.recv(id)?;
        if f.msg.is_terminal() {
            return Ok(f.msg);
        }
        Err(unexpected(f.msg))
    }

    /// Version handshake.
    pub fn hello(&mut self) -> Result<(), ClientError> {
        match self.call(Request::Hello { version: PROTOCOL_VERSION }, Vec::new())? {
            Response::Hello { .. } => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Runs the after-fork hook (`thaw`) with a fresh identity ([`AfterFork::fresh`]) for
    /// sandbox `sandbox_id` called `hostname`, and returns what the hook did.
    pub fn after_fork(&mut self, sandbox_id: &str, hostname: &str) -> Result<HookReport, ClientError> {
        let (after_fork, entropy) = AfterFork::fresh(sandbox_id, hostname).map_err(ClientError::Entropy)?;
        self.apply_identity(after_fork, entropy)
    }

    /// Runs the after-fork hook with an identity the caller built (a rollback keeps the
    /// guest's own machine id) and `entropy`; returns the hook's report.
    pub fn apply_identity(
        &mut self,
        after_fork: AfterFork,
        entropy: Vec<u8>,
    ) -> Result<HookReport, ClientError> {
        match self.call(Request::Thaw { after_fork: Some(after_fork) }, entropy)? {
            Response::Thawed { hook: Some(report) } => Ok(report),
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

    /// Runs a command, handing each output chunk to `on_output` as it arrives. At most the
    /// spec's `output_cap` (the client's default when it sets none) is accepted: the agent
    /// truncates there, so more is a violation and ends the call.
    pub fn exec_streaming(
        &mut self,
        spec: ExecSpec,
        stdin: Option<&mut dyn Read>,
        on_output: &mut dyn FnMut(OutStream, &[u8]),
    ) -> Result<ExitStatus, ClientError> {
        let r = self.exec_streaming_unchecked(spec, stdin, on_output);
        self.checked(r)
    }

    fn exec_streaming_unchecked(
        &mut self,
        mut spec: ExecSpec,
        stdin: Option<&mut dyn Read>,
        on_output: &mut dyn FnMut(OutStream, &[u8]),
    ) -> Result<ExitStatus, ClientError> {
        spec.stdin = stdin.is_some();
        let cap = *spec.output_cap.get_or_insert(self.limits.output_bytes);
        let wait = self.wait_for(spec.timeout_ms);
        let id = self.send(Request::Exec(spec), Vec::new())?;
        if let Some(src) = stdin {
            self.send_stream(id, src)?;
        }
        let mut budget = Budget::new("the command's output", cap);
        loop {
            let f = self.recv_within(id, wait)?;
            match f.msg {
                Response::Stdout => {
                    budget.take(f.body.len())?;
                    on_output(OutStream::Stdout, &f.body)
                }
                Response::Stderr => {
                    budget.take(f.body.len())?;
                    on_output(OutStream::Stderr, &f.body)
                }
                Response::Exited(status) => return Ok(status),
                other => return Err(unexpected(other)),
            }
        }
    }

    /// Runs a command and collects its output in memory (at most its `output_cap`).
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

    /// Waits for a background process; `None` when `timeout_ms` passed first. Its output
    /// tails are at most [`PROC_TAIL`] bytes each.
    pub fn wait(&mut self, pid: i32, timeout_ms: Option<u64>) -> Result<Option<ExecOutput>, ClientError> {
        let r = self.wait_unchecked(pid, timeout_ms);
        self.checked(r)
    }

    fn wait_unchecked(
        &mut self,
        pid: i32,
        timeout_ms: Option<u64>,
    ) -> Result<Option<ExecOutput>, ClientError> {
        let wait = self.wait_for(timeout_ms);
        let id = self.send(Request::Wait { pid, timeout_ms }, Vec::new())?;
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let mut out_budget = Budget::new("a background process's stdout tail", PROC_TAIL as u64);
        let mut err_budget = Budget::new("a background process's stderr tail", PROC_TAIL as u64);
        loop {
            let f = self.recv_within(id, wait)?;
            match f.msg {
                Response::Stdout => {
                    out_budget.take(f.body.len())?;
                    stdout.extend_from_slice(&f.body)
                }
                Response::Stderr => {
                    err_budget.take(f.body.len())?;
                    stderr.extend_from_slice(&f.body)
                }
                Response::Exited(status) => return Ok(Some(ExecOutput { stdout, stderr, status })),
                Response::StillRunning => return Ok(None),
                other => return Err(unexpected(other)),
            }
        }
    }

    /// Streams a file into `sink`; returns its size. At most the client's `file_bytes` limit.
    pub fn read_file(&mut self, path: &str, sink: &mut dyn Write) -> Result<u64, ClientError> {
        self.read_file_max(path, sink, self.limits.file_bytes)
    }

    /// Streams a file of at most `max` bytes into `sink`; returns its size. The agent refuses
    /// a larger file up front; a stream that goes past `max` anyway ends the call.
    pub fn read_file_max(&mut self, path: &str, sink: &mut dyn Write, max: u64) -> Result<u64, ClientError> {
        self.read_file_as(path, sink, max, None)
    }

    /// Like [`Self::read_file_max`], the file opened as the image's account `user` (root when
    /// `None`): what the account may not read is refused.
    pub fn read_file_as(
        &mut self,
        path: &str,
        sink: &mut dyn Write,
        max: u64,
        user: Option<&str>,
    ) -> Result<u64, ClientError> {
        let r = self.read_file_unchecked(path, sink, max, user);
        self.checked(r)
    }

    fn read_file_unchecked(
        &mut self,
        path: &str,
        sink: &mut dyn Write,
        max: u64,
        user: Option<&str>,
    ) -> Result<u64, ClientError> {
        let req =
            Request::ReadFile { path: path.to_string(), max: Some(max), user: user.map(str::to_string) };
        let id = self.send(req, Vec::new())?;
        let mut budget = Budget::new("the file's data", max);
        loop {
            let f = self.recv(id)?;
            match f.msg {
                Response::Data => {
                    budget.take(f.body.len())?;
                    sink.write_all(&f.body).map_err(FrameError::Io)?
                }
                Response::FileEnd { size } if size == budget.used => return Ok(size),
                Response::FileEnd { size } => {
                    return Err(ClientError::Unexpected(format!(
                        "the agent reported {size} bytes of {path} but sent {}",
                        budget.used
                    )))
                }
                other => return Err(unexpected(other)),
            }
        }
    }

    /// Reads a whole file of at most `max` bytes into memory.
    pub fn read_file_bytes(&mut self, path: &str, max: u64) -> Result<Vec<u8>, ClientError> {
        let mut out = Vec::new();
        self.read_file_max(path, &mut out, max)?;
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
        self.write_file_as(path, src, mode, append, parents, None)
    }

    /// Like [`Self::write_file`], written as the image's account `user` (root when `None`):
    /// the file and the directories made for it are the account's, and what the account may
    /// not write is refused.
    pub fn write_file_as(
        &mut self,
        path: &str,
        src: &mut dyn Read,
        mode: Option<u32>,
        append: bool,
        parents: bool,
        user: Option<&str>,
    ) -> Result<u64, ClientError> {
        let user = user.map(str::to_string);
        let id = self
            .send(Request::WriteFile { path: path.to_string(), mode, append, parents, user }, Vec::new())?;
        self.send_stream(id, src)?;
        match self.recv(id)?.msg {
            Response::Written { size } => Ok(size),
            other => Err(unexpected(other)),
        }
    }

    /// Lists a directory.
    pub fn list_dir(&mut self, path: &str) -> Result<Vec<FileStat>, ClientError> {
        self.list_dir_as(path, None)
    }

    /// Lists a directory as the image's account `user` (root when `None`).
    pub fn list_dir_as(&mut self, path: &str, user: Option<&str>) -> Result<Vec<FileStat>, ClientError> {
        let req = Request::ListDir { path: path.to_string(), user: user.map(str::to_string) };
        match self.call(req, Vec::new())? {
            Response::Entries { entries, .. } => Ok(entries),
            other => Err(unexpected(other)),
        }
    }

    /// Walks a directory tree; every entry carries its full path in `name`. At most the
    /// client's `walk_entries` entries and `walk_bytes` bytes of them, each line at most
    /// [`MAX_WALK_LINE`] bytes.
    pub fn walk(&mut self, path: &str, exclude: &[String]) -> Result<Vec<FileStat>, ClientError> {
        let r = self.walk_unchecked(path, exclude);
        self.checked(r)
    }

    fn walk_unchecked(&mut self, path: &str, exclude: &[String]) -> Result<Vec<FileStat>, ClientError> {
        let id =
            self.send(Request::Walk { path: path.to_string(), exclude: exclude.to_vec() }, Vec::new())?;
        let mut out = Vec::new();
        let mut partial: Vec<u8> = Vec::new();
        let mut bytes = Budget::new("the walk's entries", self.limits.walk_bytes);
        let entries = self.limits.walk_entries;
        let too_many = || ClientError::LimitExceeded { what: "the number of walk entries", limit: entries };
        loop {
            let f = self.recv(id)?;
            match f.msg {
                Response::Data => {
                    bytes.take(f.body.len())?;
                    partial.extend_from_slice(&f.body);
                    let too_long =
                        ClientError::LimitExceeded { what: "one walk entry", limit: MAX_WALK_LINE as u64 };
                    let mut start = 0;
                    while let Some(nl) = partial[start..].iter().position(|b| *b == b'\n') {
                        if nl > MAX_WALK_LINE {
                            return Err(too_long);
                        }
                        let entry = serde_json::from_slice(&partial[start..start + nl])
                            .map_err(|e| ClientError::Unexpected(format!("bad walk entry: {e}")))?;
                        start += nl + 1;
                        if out.len() as u64 >= self.limits.walk_entries {
                            return Err(too_many());
                        }
                        out.push(entry);
                    }
                    partial.drain(..start);
                    if partial.len() > MAX_WALK_LINE {
                        return Err(too_long);
                    }
                }
                Response::FileEnd { size } if size == out.len() as u64 && partial.is_empty() => {
                    return Ok(out)
                }
                Response::FileEnd { size } => {
                    return Err(ClientError::Unexpected(format!(
                        "the agent reported {size} walk entries but sent {}",
                        out.len()
                    )))
                }
                other => return Err(unexpected(other)),
            }
        }
    }

    /// Stats a path.
    pub fn stat(&mut self, path: &str) -> Result<FileStat, ClientError> {
        self.stat_as(path, None)
    }

    /// Stats a path as the image's account `user` (root when `None`).
    pub fn stat_as(&mut self, path: &str, user: Option<&str>) -> Result<FileStat, ClientError> {
        match self
            .call(Request::Stat { path: path.to_string(), user: user.map(str::to_string) }, Vec::new())?
        {
            Response::Stat(s) => Ok(s),
            other => Err(unexpected(other)),
        }
    }

    /// Follows every symbolic link of `path` as `user`: the stat of where it leads, named by
    /// the absolute path reached.
    pub fn resolve_as(&mut self, path: &str, user: Option<&str>) -> Result<FileStat, ClientError> {
        match self
            .call(Request::Resolve { path: path.to_string(), user: user.map(str::to_string) }, Vec::new())?
        {
            Response::Stat(s) => Ok(s),
            other => Err(unexpected(other)),
        }
    }

    /// Removes a path.
    pub fn remove(&mut self, path: &str, recursive: bool) -> Result<(), ClientError> {
        self.remove_as(path, recursive, None)
    }

    /// Removes a path as the image's account `user` (root when `None`).
    pub fn remove_as(&mut self, path: &str, recursive: bool, user: Option<&str>) -> Result<(), ClientError> {
        let req = Request::Remove { path: path.to_string(), recursive, user: user.map(str::to_string) };
        expect_ok(self.call(req, Vec::new())?)
    }

    /// Renames a path.
    pub fn rename(&mut self, from: &str, to: &str) -> Result<(), ClientError> {
        self.rename_as(from, to, None)
    }

    /// Renames a path as the image's account `user` (root when `None`).
    pub fn rename_as(&mut self, from: &str, to: &str, user: Option<&str>) -> Result<(), ClientError> {
        let req =
            Request::Rename { from: from.to_string(), to: to.to_string(), user: user.map(str::to_string) };
        expect_ok(self.call(req, Vec::new())?)
    }

    /// Creates a directory.
    pub fn mkdir(&mut self, path: &str, parents: bool) -> Result<(), ClientError> {
        self.mkdir_as(path, parents, None)
    }

    /// Like [`Self::mkdir`], made as the image's account `user` (root when `None`).
    pub fn mkdir_as(&mut self, path: &str, parents: bool, user: Option<&str>) -> Result<(), ClientError> {
        let user = user.map(str::to_string);
        expect_ok(self.call(Request::Mkdir { path: path.to_string(), parents, user }, Vec::new())?)
    }

    /// Powers a microVM's guest off (or restarts it) once its disks are synced.
    pub fn shutdown(&mut self, reboot: bool) -> Result<(), ClientError> {
        expect_ok(self.call(Request::Shutdown { reboot }, Vec::new())?)
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
