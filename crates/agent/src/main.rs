//! branchbox-agent: the init process and protocol executor inside every sandbox.
//!
//! It reads request frames from its standard input and writes responses to its standard
//! output (under gVisor those are pipes held by the host's shim, and they survive
//! checkpoint/restore). Each request that can block runs on a thread of its own; client
//! streams (stdin, file data) are routed to it by request id. See `docs/agent-protocol.md`.
//!
//! As the init of a Linux microVM (see [`vm`]) it serves the same protocol on every vsock
//! connection instead, each with its own outbox and streams; processes are shared.

mod account;
mod cancel;
mod exec;
mod files;
mod forkbomb;
mod guest;
mod hook;
mod oom;
mod outbox;
mod procs;
mod reaper;
mod sudo;
mod vm;
mod watch;

use branchbox_protocol::frame::{decode, read_raw, FrameError};
use branchbox_protocol::{AgentInfo, ErrorCode, Frame, PtySize, Request, Response, PROTOCOL_VERSION};
use outbox::Outbox;
use procs::Procs;
use reaper::Reaper;
use std::collections::HashMap;
use std::path::Path;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Client-stream chunks buffered per request before the reader waits.
const STREAM_DEPTH: usize = 8;

/// A failed request: the error class and a message that says what to do.
#[derive(Debug)]
pub struct Failure {
    code: ErrorCode,
    message: String,
}

impl Failure {
    /// A failure of class `code`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Failure { code, message: message.into() }
    }

    /// An operating-system error.
    pub fn io(e: std::io::Error) -> Self {
        Failure::new(code_of(&e), e.to_string())
    }

    /// An operating-system error on `path`.
    pub fn io_at(e: std::io::Error, path: &Path) -> Self {
        Failure::new(code_of(&e), format!("{}: {e}", path.display()))
    }

    fn response(self) -> Response {
        Response::Error { code: self.code, message: self.message }
    }
}

fn code_of(e: &std::io::Error) -> ErrorCode {
    match e.kind() {
        std::io::ErrorKind::NotFound => ErrorCode::NotFound,
        std::io::ErrorKind::AlreadyExists => ErrorCode::AlreadyExists,
        std::io::ErrorKind::PermissionDenied => ErrorCode::PermissionDenied,
        _ => ErrorCode::Io,
    }
}

/// What every connection shares: the children and the sandbox's identity.
struct Shared {
    reaper: Arc<Reaper>,
    procs: Arc<Procs>,
    started: Instant,
    sandbox_id: Mutex<String>,
    /// PID 1 of a microVM: `shutdown` powers it off.
    vm: bool,
}

/// A terminal of a running `exec` with `pty`, as `resize` finds it.
enum Pty {
    /// Open: its master side.
    Open(std::fs::File),
    /// Not open yet: the size to give it once it is (a resize sent right after the `exec`
    /// reaches the agent before the worker has opened the terminal).
    Pending(PtySize),
}

/// One connection's state.
struct Agent {
    out: Outbox,
    shared: Arc<Shared>,
    streams: Mutex<HashMap<u64, SyncSender<Option<Vec<u8>>>>>,
    running: cancel::Registry,
    /// The master side of the terminal of each running `exec` with `pty`, for `resize`; or,
    /// for a request whose terminal is not open yet, the last size asked for meanwhile.
    ptys: Mutex<HashMap<u64, Pty>>,
}

impl Agent {
    fn reply(&self, id: u64, r: Result<Response, Failure>) {
        let msg = r.unwrap_or_else(Failure::response);
        self.out.send(id, &msg, &[]);
    }

    fn open_stream(&self, id: u64) -> std::sync::mpsc::Receiver<Option<Vec<u8>>> {
        let (tx, rx) = sync_channel(STREAM_DEPTH);
        self.streams.lock().unwrap_or_else(|e| e.into_inner()).insert(id, tx);
        rx
    }

    /// Forgets request `id`'s client stream; later chunks for it are dropped.
    fn end_stream(&self, id: u64) {
        self.streams.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    }

    fn route(&self, id: u64, chunk: Option<Vec<u8>>) {
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        let end = chunk.is_none();
        let tx = if end { streams.remove(&id) } else { streams.get(&id).cloned() };
        drop(streams);
        if let Some(tx) = tx {
            let _ = tx.send(chunk);
        }
    }

    fn info(&self) -> AgentInfo {
        // SAFETY: uname fills a plain struct.
        let mut u: libc::utsname = unsafe { std::mem::zeroed() };
        // SAFETY: valid pointer.
        unsafe { libc::uname(&mut u) };
        let field = |f: &[libc::c_char]| {
            let bytes: Vec<u8> = f.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        AgentInfo {
            sandbox_id: self.shared.sandbox_id.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            hostname: field(&u.nodename),
            pid: std::process::id() as i32,
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            protocol_version: PROTOCOL_VERSION,
            kernel: format!("{} {}", field(&u.sysname), field(&u.release)),
        }
    }

    /// Handles one request; blocking work moves to a thread.
    fn handle(self: &Arc<Self>, f: Frame<Request>) {
        let id = f.id;
        match f.msg {
            Request::Hello { version } => {
                let r = if version == PROTOCOL_VERSION {
                    Ok(Response::Hello {
                        version: PROTOCOL_VERSION,
                        agent_version: env!("CARGO_PKG_VERSION").to_string(),
                    })
                } else {
                    Err(Failure::new(
                        ErrorCode::UnsupportedVersion,
                        format!(
                            "host speaks protocol {version}, this agent speaks {PROTOCOL_VERSION}: rebuild the image"
                        ),
                    ))
                };
                self.reply(id, r);
            }
            Request::Ping => self.reply(
                id,
                Ok(Response::Pong { uptime_ms: self.shared.started.elapsed().as_millis() as u64 }),
            ),
            Request::Info => self.reply(id, Ok(Response::Info(self.info()))),
            Request::Freeze => self.out.freeze(id),
            Request::Thaw { after_fork } => {
                let hook = after_fork.map(|a| {
                    *self.shared.sandbox_id.lock().unwrap_or_else(|e| e.into_inner()) = a.sandbox_id.clone();
                    hook::apply(&a, &f.body)
                });
                self.out.thaw(id, &Response::Thawed { hook });
            }
            Request::Shutdown { reboot } => {
                if !self.shared.vm {
                    let msg = "shutdown is for the agent of a microVM; stop this sandbox from the host";
                    return self.reply(id, Err(Failure::new(ErrorCode::BadRequest, msg)));
                }
                self.reply(id, Ok(Response::Ok));
                let e = vm::shutdown(reboot);
                eprintln!("branchbox-agent: shutdown failed: {e}");
            }
            Request::Resize(size) => {
                // A size out of bounds, or for a request that is not running (or has just
                // ended), changes nothing: resize has no answer to carry an error.
                let Ok(size) = PtySize::new(size.cols, size.rows) else { return };
                let mut ptys = self.ptys.lock().unwrap_or_else(|e| e.into_inner());
                match ptys.get(&id) {
                    Some(Pty::Open(master)) => {
                        let _ = exec::set_size(master, size);
                    }
                    _ if self.running.is_running(id) => {
                        ptys.insert(id, Pty::Pending(size));
                    }
                    _ => {}
                }
            }
            Request::Data => self.route(id, Some(f.body)),
            Request::Eof => self.route(id, None),
            Request::Cancel => {
                if self.running.cancel(id) {
                    // Closing the request's client stream ends a write or a command's stdin.
                    self.end_stream(id);
                }
            }
            Request::ProcInput { pid, eof } => {
                // A write may block on a full pipe: off the reading thread. A client sends the
                // next write after this one's answer, so writes of one client stay in order.
                let me = Arc::clone(self);
                std::thread::spawn(move || {
                    let r = me.shared.procs.input(pid, &f.body, eof).map(|()| Response::Ok);
                    me.reply(id, r);
                });
            }
            other => {
                let stream = match &other {
                    Request::WriteFile { .. } => Some(self.open_stream(id)),
                    Request::Exec(spec) if spec.stdin => Some(self.open_stream(id)),
                    _ => None,
                };
                let token = self.running.start(id);
                let me = Arc::clone(self);
                std::thread::spawn(move || {
                    me.work(id, other, stream, &token);
                    me.running.finish(id);
                    // A size a late resize left for this request (between its terminal's end
                    // and here) is forgotten; from now on resizes for it change nothing.
                    me.ptys.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
                });
            }
        }
    }

    fn work(
        &self,
        id: u64,
        req: Request,
        stream: Option<std::sync::mpsc::Receiver<Option<Vec<u8>>>>,
        token: &cancel::Token,
    ) {
        // Frames of a cancelled request reach nobody: stop sending them.
        let emit = |kind: &Response, c: &[u8]| {
            if !token.is_cancelled() {
                self.out.send(id, kind, c)
            }
        };
        let r = match req {
            Request::Exec(spec) => self.exec(id, spec, stream, token, &emit),
            Request::Spawn(spec) => {
                self.shared.procs.spawn(&self.shared.reaper, spec).map(|pid| Response::Spawned { pid })
            }
            Request::ListProcs => Ok(Response::Procs { procs: self.shared.procs.list() }),
            Request::Signal { pid, signal, group } => {
                self.shared.procs.signal(pid, signal, group).map(|()| Response::Ok)
            }
            Request::Wait { pid, timeout_ms } => {
                self.shared.procs.wait(pid, timeout_ms.map(Duration::from_millis)).map(|done| match done {
                    Some(done) => {
                        self.send_chunks(id, &Response::Stdout, &done.stdout);
                        self.send_chunks(id, &Response::Stderr, &done.stderr);
                        Response::Exited(done.status)
                    }
                    None => Response::StillRunning,
                })
            }
            Request::Attach { pid, replay } => self.attach(pid, replay, token, &emit),
            Request::Watch { path, recursive } => {
                watch::watch(&path, recursive, token, &mut |c| emit(&Response::Data, c))
                    .map(|size| Response::FileEnd { size })
            }
            Request::ReadFile { path, max, user } => {
                files::read(&path, max, user.as_deref(), token, &mut |c| emit(&Response::Data, c))
                    .map(|size| Response::FileEnd { size })
            }
            Request::WriteFile { path, mode, append, parents, user } => match stream {
                Some(rx) => {
                    let user = user.as_deref();
                    files::write(&files::WriteTarget { path: &path, mode, append, parents, user }, &rx, token)
                        .map(|size| Response::Written { size })
                }
                None => Err(Failure::new(ErrorCode::BadRequest, "write_file needs a data stream")),
            },
            Request::ListDir { path, user } => files::list(&path, user.as_deref())
                .map(|(entries, truncated)| Response::Entries { entries, truncated }),
            Request::Stat { path, user } => files::stat(&path, user.as_deref()).map(Response::Stat),
            Request::Resolve { path, user } => files::resolve(&path, user.as_deref()).map(Response::Stat),
            Request::Walk { path, exclude } => {
                files::walk(&path, &exclude, token, &mut |c| emit(&Response::Data, c))
                    .map(|size| Response::FileEnd { size })
            }
            Request::Remove { path, recursive, user } => {
                files::remove(&path, recursive, user.as_deref()).map(|()| Response::Ok)
            }
            Request::Rename { from, to, user } => {
                files::rename(&from, &to, user.as_deref()).map(|()| Response::Ok)
            }
            Request::Mkdir { path, parents, user } => {
                files::mkdir(&path, parents, user.as_deref()).map(|()| Response::Ok)
            }
            _ => Err(Failure::new(ErrorCode::BadRequest, "this operation is handled elsewhere")),
        };
        self.reply(id, r);
    }

    /// Streams a background process's output from now on (with `replay`, its kept output
    /// first), then how it ended.
    fn attach(
        &self,
        pid: i32,
        replay: bool,
        token: &cancel::Token,
        emit: &dyn Fn(&Response, &[u8]),
    ) -> Result<Response, Failure> {
        use std::sync::mpsc::RecvTimeoutError;
        let attached = self.shared.procs.attach(pid, replay)?;
        if let Some((stdout, stderr)) = attached.kept {
            for (kind, kept) in [(Response::Stdout, stdout), (Response::Stderr, stderr)] {
                for c in kept.chunks(branchbox_protocol::CHUNK) {
                    emit(&kind, c);
                }
            }
        }
        let rx = match attached.live {
            Ok(rx) => rx,
            Err(status) => return Ok(Response::Exited(status)),
        };
        // In place: an empty data frame tells the client every later byte will reach it.
        emit(&Response::Data, &[]);
        loop {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(procs::Output::Chunk(which, bytes)) => {
                    let kind = match which {
                        exec::Stream::Stdout => Response::Stdout,
                        exec::Stream::Stderr => Response::Stderr,
                    };
                    emit(&kind, &bytes);
                }
                Ok(procs::Output::Exit(status)) => return Ok(Response::Exited(status)),
                Err(RecvTimeoutError::Timeout) if token.is_cancelled() => return Err(cancel::cancelled()),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return match self.shared.procs.status(pid) {
                        Some(status) => Ok(Response::Exited(status)),
                        None if self.shared.procs.list().iter().any(|p| p.pid == pid) => Err(Failure::new(
                            ErrorCode::Io,
                            format!(
                                "the reader fell behind process {pid}'s output and was dropped; attach again (wait returns the last 1 MiB of each stream)"
                            ),
                        )),
                        None => Err(Failure::new(
                            ErrorCode::NotFound,
                            format!("process {pid} ended and was waited for while attached"),
                        )),
                    };
                }
            }
        }
    }

    fn send_chunks(&self, id: u64, kind: &Response, data: &[u8]) {
        for c in data.chunks(branchbox_protocol::CHUNK) {
            self.out.send(id, kind, c);
        }
    }

    fn exec(
        &self,
        id: u64,
        spec: branchbox_protocol::ExecSpec,
        stream: Option<std::sync::mpsc::Receiver<Option<Vec<u8>>>>,
        token: &cancel::Token,
        emit: &dyn Fn(&Response, &[u8]),
    ) -> Result<Response, Failure> {
        let cap = spec.output_cap.unwrap_or(exec::DEFAULT_OUTPUT_CAP);
        let timeout = spec.timeout_ms.map(Duration::from_millis);
        let started = match exec::start(&self.shared.reaper, &spec) {
            Ok(s) => s,
            Err(e) => {
                self.ptys.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
                match stream {
                    // A terminal's keys never end by themselves: forget the stream instead.
                    Some(_) if spec.pty.is_some() => self.end_stream(id),
                    Some(rx) => while let Ok(Some(_)) = rx.recv() {},
                    None => {}
                }
                return Err(e);
            }
        };
        let mut started = started;
        token.watch_group(started.child.id() as i32);
        let master = started.pty.as_ref().map(|m| (m.try_clone(), m.try_clone()));
        match (stream, master) {
            (Some(rx), Some((Ok(typing), Ok(sizing)))) => {
                exec::feed_pty(typing, rx);
                let mut ptys = self.ptys.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(Pty::Pending(size)) = ptys.get(&id) {
                    let _ = exec::set_size(&sizing, *size);
                }
                ptys.insert(id, Pty::Open(sizing));
            }
            (Some(rx), None) => exec::feed_stdin(&mut started.child, rx),
            // A terminal whose master could not be shared: its keys are dropped as they come.
            (Some(rx), Some(_)) => drop(rx),
            (None, _) => {}
        }
        let status = exec::pump(started, timeout, cap, &mut |which, chunk| {
            let kind = match which {
                exec::Stream::Stdout => Response::Stdout,
                exec::Stream::Stderr => Response::Stderr,
            };
            emit(&kind, chunk);
        });
        if let Some(Pty::Open(_)) = self.ptys.lock().unwrap_or_else(|e| e.into_inner()).remove(&id) {
            self.end_stream(id);
        }
        if token.is_cancelled() {
            return Err(cancel::cancelled());
        }
        Ok(Response::Exited(status))
    }
}

/// Reads request frames from `input` until it ends, answering on `agent`'s outbox.
fn serve(agent: &Arc<Agent>, input: &mut impl std::io::Read) {
    loop {
        match read_raw(input) {
            Ok(Some(raw)) => match decode::<Request>(raw) {
                Ok(frame) => agent.handle(frame),
                Err(FrameError::BadHeader { id, source }) => {
                    let msg = Response::Error {
                        code: ErrorCode::BadRequest,
                        message: format!("malformed request: {source}"),
                    };
                    agent.out.send(id.unwrap_or(0), &msg, &[]);
                }
                Err(e) => eprintln!("branchbox-agent: {e}"),
            },
            Ok(None) => break,
            Err(e) => {
                // A broken frame means the stream lost sync; nothing after it can be trusted.
                eprintln!("branchbox-agent: {e}; stopping");
                break;
            }
        }
    }
}

fn connection(shared: &Arc<Shared>, out: Box<dyn std::io::Write + Send>) -> Arc<Agent> {
    Arc::new(Agent {
        out: Outbox::new(out),
        shared: Arc::clone(shared),
        streams: Mutex::new(HashMap::new()),
        running: cancel::Registry::default(),
        ptys: Mutex::new(HashMap::new()),
    })
}

fn main() {
    let argv0 = std::env::args().next().unwrap_or_default();
    if sudo::invoked_as_sudo(&argv0) {
        sudo::client(std::env::args().skip(1).collect());
    }
    let vm = vm::is_vm_init(std::process::id(), &argv0);
    if vm {
        vm::boot();
    }
    // Under gVisor the bundle passes the limits; a VM's kernel passes its unknown command-line
    // words, which are not ours.
    let args: Vec<String> = if vm { Vec::new() } else { std::env::args().skip(1).collect() };
    guest::boot(&args);
    let shared = Arc::new(Shared {
        reaper: Reaper::start(),
        procs: Arc::new(Procs::default()),
        started: Instant::now(),
        sandbox_id: Mutex::new(String::new()),
        vm,
    });
    sudo::serve(shared.reaper.clone());
    if vm {
        vm::run(move |conn| {
            let write_half = match conn.try_clone() {
                Ok(w) => w,
                Err(e) => return eprintln!("branchbox-agent: cannot use a vsock connection: {e}"),
            };
            let agent = connection(&shared, Box::new(write_half));
            serve(&agent, &mut std::io::BufReader::new(conn));
        });
    }
    let agent = connection(&shared, Box::new(std::io::stdout()));
    serve(&agent, &mut std::io::stdin().lock());
}

#[cfg(test)]
mod tests {
    use super::*;
    use branchbox_protocol::{AgentClient, ClientError, Command, ExecSpec};
    use std::os::unix::net::{UnixListener, UnixStream};

    /// The microVM's accept loop and per-connection serving, over a Unix socket (this host
    /// has no vsock loopback): connections answer independently and share processes.
    #[test]
    fn every_connection_is_served_and_processes_are_shared() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        let listener: std::os::fd::OwnedFd = UnixListener::bind(&path).unwrap().into();
        let shared = Arc::new(Shared {
            reaper: Reaper::start(),
            procs: Arc::new(Procs::default()),
            started: Instant::now(),
            sandbox_id: Mutex::new(String::new()),
            vm: false,
        });
        std::thread::spawn(move || {
            vm::accept_loop(&listener, move |conn| {
                let agent = connection(&shared, Box::new(conn.try_clone().unwrap()));
                serve(&agent, &mut std::io::BufReader::new(conn));
            })
        });
        let mut a = AgentClient::new(UnixStream::connect(&path).unwrap());
        let mut b = AgentClient::new(UnixStream::connect(&path).unwrap());
        a.hello().unwrap();
        b.hello().unwrap();
        let pid = a.spawn(ExecSpec::new(Command::Argv(vec!["sleep".into(), "30".into()]))).unwrap();
        assert!(b.list_procs().unwrap().iter().any(|p| p.pid == pid && p.exit.is_none()));
        let out = b.exec(ExecSpec::new(Command::Shell("echo from-b".into())), None).unwrap();
        assert_eq!(out.stdout, b"from-b\n");
        b.signal(pid, libc::SIGKILL, false).unwrap();
        // A closed connection ends only its own serving.
        drop(b);
        assert!(a.ping().is_ok());
        // Outside a microVM, shutdown is refused rather than powering anything off.
        match a.shutdown(false) {
            Err(ClientError::Agent { code: ErrorCode::BadRequest, .. }) => {}
            other => panic!("shutdown outside a VM answered {other:?}"),
        }
        assert!(a.ping().is_ok());
    }
}
