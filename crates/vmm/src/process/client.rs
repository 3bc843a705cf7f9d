//! The engine's side of one VMM process: starting it, the handshake, typed requests, and
//! telling a dead process (and how it died) from a failed request.

use super::protocol::{
    decode, read_frame, write_message, BootLinux, FrameError, RemoteError, Request, Response, RestoreLinux,
    Status, PROTOCOL_VERSION,
};
use crate::config::VmConfig;
use crate::synthetic::testguest::{Answer, Command};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};

/// The descriptor number the VMM process finds its control socket at.
pub const CONTROL_FD: i32 = 3;

/// Environment variable naming the `branchbox-vmm` program to start.
pub const VMM_ENV: &str = "BRANCHBOX_VMM";

/// Why talking to a VMM process failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The program could not be started.
    #[error("cannot start the VMM program {program}: {source}; build it (`cargo build -p branchbox-vmm`) or set {VMM_ENV} to its path")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The process is gone; its VM with it.
    #[error("VMM process {pid} {how}; its VM is gone: restore or fork the sandbox again")]
    Exited {
        /// Its process id.
        pid: u32,
        /// How it ended ("was killed by signal 9 (SIGKILL)", "exited with status 1").
        how: String,
    },
    /// A frame could not be exchanged.
    #[error("VMM process {pid}: {source}")]
    Frame {
        /// Its process id.
        pid: u32,
        /// What went wrong.
        #[source]
        source: FrameError,
    },
    /// The process refused the request.
    #[error("VMM process {pid} refused the request: {error}")]
    Remote {
        /// Its process id.
        pid: u32,
        /// Its typed error.
        error: RemoteError,
    },
    /// A pool did not reach its target of idle processes in time.
    #[error("{ready} of {target} VMM processes ready after {waited:?}; last failure: {last}")]
    PoolNotReady {
        /// Idle processes when the wait ended.
        ready: usize,
        /// The pool's target.
        target: usize,
        /// How long the caller waited.
        waited: std::time::Duration,
        /// The last start failure, if any.
        last: String,
    },
    /// The process answered with another kind of reply than the request calls for.
    #[error("VMM process {pid} answered {got} to a request expecting {expected}; it is not a branchbox VMM of this build")]
    Unexpected {
        /// Its process id.
        pid: u32,
        /// The reply expected.
        expected: &'static str,
        /// What came (its debug form, cut to 200 characters).
        got: String,
    },
}

impl ClientError {
    /// The VMM's typed error, when the process refused a request.
    pub fn remote(&self) -> Option<&RemoteError> {
        match self {
            ClientError::Remote { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// Results of this module.
pub type ClientResult<T> = std::result::Result<T, ClientError>;

/// Describes how a process ended, naming the signal.
pub fn describe_exit(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(s)) => {
            let name = match s {
                libc::SIGKILL => "SIGKILL",
                libc::SIGSYS => "SIGSYS: a seccomp filter refused a system call",
                libc::SIGSEGV => "SIGSEGV",
                libc::SIGABRT => "SIGABRT",
                libc::SIGTERM => "SIGTERM",
                _ => "signal",
            };
            format!("was killed by signal {s} ({name})")
        }
        _ => "ended".into(),
    }
}

/// A started VMM process and the engine's end of its control socket, before the handshake.
pub struct Spawned {
    /// The process.
    pub child: Child,
    /// The engine's end of the control socket.
    pub stream: UnixStream,
}

/// Starts `program` serving one VM shaped `config`, its control socket at descriptor
/// [`CONTROL_FD`]. The process gets `PR_SET_PDEATHSIG(SIGKILL)`: it dies with the thread that
/// started it (start VMMs from a thread that lives as long as the engine, as
/// [`VmmPool`](super::VmmPool) does).
pub fn spawn(program: &Path, config: VmConfig) -> ClientResult<Spawned> {
    let (ours, theirs) =
        UnixStream::pair().map_err(|source| ClientError::Spawn { program: program.into(), source })?;
    let fd = theirs.as_raw_fd();
    let parent = std::process::id() as libc::pid_t;
    let mut cmd = std::process::Command::new(program);
    cmd.arg("--fd")
        .arg(CONTROL_FD.to_string())
        .arg("--mem-bytes")
        .arg(config.mem_size.to_string())
        .arg("--vcpus")
        .arg(config.vcpus.to_string())
        .stdin(Stdio::null());
    if config.irqchip {
        cmd.arg("--irqchip");
    }
    // SAFETY: between fork and exec only async-signal-safe calls (prctl, getppid, dup2,
    // fcntl) on values computed before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The engine may have died before the prctl: then nobody would kill us.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("the engine exited while the VMM was starting"));
            }
            if fd == CONTROL_FD {
                // dup2 onto itself keeps close-on-exec: clear it instead.
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(fd, CONTROL_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|source| ClientError::Spawn { program: program.into(), source })?;
    drop(theirs);
    Ok(Spawned { child, stream: ours })
}

/// Starts `program` detached, serving one VM shaped `config` on a Unix socket it listens on
/// at `socket`, its standard error to `log`: in its own process group and without a parent
/// death signal, so it outlives the engine process (a CLI command) that started it, and ends
/// only on [`Request::Shutdown`] or a kill. Returns once the socket accepts connections,
/// within `patience`; a process that ends first is reported with how it ended and its log.
pub fn spawn_listening(
    program: &Path,
    config: VmConfig,
    socket: &Path,
    log: &Path,
    patience: std::time::Duration,
) -> ClientResult<u32> {
    let spawn_err = |source| ClientError::Spawn { program: program.into(), source };
    let err_file = std::fs::File::create(log).map_err(spawn_err)?;
    let _ = std::fs::remove_file(socket);
    let mut cmd = std::process::Command::new(program);
    cmd.arg("--listen")
        .arg(socket)
        .arg("--mem-bytes")
        .arg(config.mem_size.to_string())
        .arg("--vcpus")
        .arg(config.vcpus.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err_file)
        .process_group(0);
    if config.irqchip {
        cmd.arg("--irqchip");
    }
    let mut child = cmd.spawn().map_err(spawn_err)?;
    let pid = child.id();
    let deadline = std::time::Instant::now() + patience;
    loop {
        if UnixStream::connect(socket).is_ok() {
            // Reap it when it ends, so a long-lived engine collects no zombies; a CLI that
            // exits first leaves that to init.
            std::thread::spawn(move || child.wait());
            return Ok(pid);
        }
        if let Ok(Some(status)) = child.try_wait() {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            return Err(ClientError::Exited {
                pid,
                how: format!("{} before listening ({})", describe_exit(status), text.trim()),
            });
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(ClientError::Exited {
                pid,
                how: format!("did not listen on {} within {patience:?} and was killed", socket.display()),
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// A VMM process serving one VM. Dropping one this engine started kills the process; one
/// reached through its listening socket ([`VmmProcess::connect`]) is only disconnected from.
pub struct VmmProcess {
    /// The process, when this engine started it and owns it.
    child: Option<Child>,
    stream: UnixStream,
    pid: u32,
    config: VmConfig,
    confined: bool,
}

fn cut(r: &Response) -> String {
    format!("{r:?}").chars().take(200).collect()
}

impl VmmProcess {
    /// Starts `program` and completes the handshake.
    pub fn start(program: &Path, config: VmConfig) -> ClientResult<VmmProcess> {
        let mut pending = PendingHello::send(spawn(program, config)?)?;
        pending.finish()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The shape of the VM it serves.
    pub fn config(&self) -> VmConfig {
        self.config
    }

    /// Whether its vCPU thread runs under the `Vcpu` seccomp filter.
    pub fn confined(&self) -> bool {
        self.confined
    }

    /// Connects to a process listening at `socket` ([`spawn_listening`]) and completes the
    /// handshake.
    pub fn connect(socket: &Path) -> ClientResult<VmmProcess> {
        let stream = UnixStream::connect(socket).map_err(|source| ClientError::Frame {
            pid: 0,
            source: FrameError::Io { op: "connect", source },
        })?;
        let mut p = VmmProcess {
            child: None,
            stream,
            pid: 0,
            config: VmConfig { mem_size: 0, vcpus: 0, irqchip: false },
            confined: false,
        };
        p.send(&Request::Hello { version: PROTOCOL_VERSION })?;
        match p.recv()? {
            Response::Hello { version: PROTOCOL_VERSION, pid, config, confined } => {
                p.pid = pid;
                p.config = config;
                p.confined = confined;
                Ok(p)
            }
            other => Err(ClientError::Unexpected { pid: p.pid, expected: "Hello", got: cut(&other) }),
        }
    }

    /// Whether the process is still running (reaps it if not); for a connected process,
    /// whether its socket is still open.
    pub fn is_alive(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => self.status().is_ok(),
        }
    }

    /// Sends a request without waiting for its reply (replies come in request order, so
    /// requests to many processes can be sent first and the replies read after).
    pub fn send(&mut self, req: &Request) -> ClientResult<()> {
        let mut w = &self.stream;
        match write_message(&mut w, req) {
            Ok(()) => Ok(()),
            Err(FrameError::Io { .. }) => Err(self.gone()),
            Err(source) => Err(ClientError::Frame { pid: self.pid, source }),
        }
    }

    /// Reads the next reply; a refusal becomes [`ClientError::Remote`], a closed socket
    /// [`ClientError::Exited`] with how the process ended.
    pub fn recv(&mut self) -> ClientResult<Response> {
        let mut r = &self.stream;
        let payload = match read_frame(&mut r) {
            Ok(Some(p)) => p,
            Ok(None) | Err(FrameError::Io { .. }) | Err(FrameError::Truncated { .. }) => {
                return Err(self.gone())
            }
            Err(source) => return Err(ClientError::Frame { pid: self.pid, source }),
        };
        match decode::<Response>(&payload) {
            Ok(Response::Error(error)) => Err(ClientError::Remote { pid: self.pid, error }),
            Ok(r) => Ok(r),
            Err(source) => Err(ClientError::Frame { pid: self.pid, source }),
        }
    }

    /// Sends `req` and reads its reply.
    pub fn request(&mut self, req: &Request) -> ClientResult<Response> {
        self.send(req)?;
        self.recv()
    }

    /// The socket closed: wait for the process and say how it ended.
    fn gone(&mut self) -> ClientError {
        let how = match self.child.as_mut().map(Child::wait) {
            Some(Ok(status)) => describe_exit(status),
            Some(Err(e)) => format!("could not be waited for ({e})"),
            None => "closed its control socket".into(),
        };
        ClientError::Exited { pid: self.pid, how }
    }

    fn done(&mut self, req: &Request) -> ClientResult<()> {
        match self.request(req)? {
            Response::Done => Ok(()),
            other => Err(ClientError::Unexpected { pid: self.pid, expected: "Done", got: cut(&other) }),
        }
    }

    /// Reads the reply to a request that answers [`Response::Done`].
    pub fn recv_done(&mut self) -> ClientResult<()> {
        match self.recv()? {
            Response::Done => Ok(()),
            other => Err(ClientError::Unexpected { pid: self.pid, expected: "Done", got: cut(&other) }),
        }
    }

    /// The process's state.
    pub fn status(&mut self) -> ClientResult<Status> {
        match self.request(&Request::Status)? {
            Response::Status(s) => Ok(s),
            other => Err(ClientError::Unexpected { pid: self.pid, expected: "Status", got: cut(&other) }),
        }
    }

    /// Installs the synthetic test guest (paused).
    pub fn boot_test_guest(&mut self) -> ClientResult<()> {
        self.done(&Request::BootTestGuest)
    }

    /// Restores snapshot `name` of `dir` into the idle shell.
    pub fn restore(&mut self, dir: &Path, name: &str, resume: bool) -> ClientResult<()> {
        self.done(&Request::Restore { dir: dir.into(), name: name.into(), resume })
    }

    /// Boots a Linux guest in the idle process; it runs right away.
    pub fn boot_linux(&mut self, boot: BootLinux) -> ClientResult<()> {
        self.done(&Request::BootLinux(boot))
    }

    /// Restores a Linux guest's snapshot in the idle process.
    pub fn restore_linux(&mut self, req: RestoreLinux) -> ClientResult<()> {
        self.done(&Request::RestoreLinux(req))
    }

    /// Pauses the guest.
    pub fn pause(&mut self) -> ClientResult<()> {
        self.done(&Request::Pause)
    }

    /// Resumes the guest.
    pub fn resume(&mut self) -> ClientResult<()> {
        self.done(&Request::Resume)
    }

    /// Takes a full snapshot of the paused guest into `dir`.
    pub fn snapshot(&mut self, dir: &Path) -> ClientResult<()> {
        self.done(&Request::Snapshot { dir: dir.into() })
    }

    /// Checkpoints the paused guest as `name` in `dir`; returns the pause in microseconds.
    pub fn checkpoint(&mut self, dir: &Path, name: &str) -> ClientResult<u64> {
        match self.request(&Request::Checkpoint { dir: dir.into(), name: name.into() })? {
            Response::Checkpoint { pause_us, .. } => Ok(pause_us),
            other => Err(ClientError::Unexpected { pid: self.pid, expected: "Checkpoint", got: cut(&other) }),
        }
    }

    /// Rolls the paused guest back to snapshot `name` of `dir`.
    pub fn rollback(&mut self, dir: &Path, name: &str) -> ClientResult<()> {
        self.done(&Request::Rollback { dir: dir.into(), name: name.into() })
    }

    /// Reads the reply to a [`Request::Call`].
    pub fn recv_answer(&mut self) -> ClientResult<Answer> {
        match self.recv()? {
            Response::Answer(a) => Ok(a),
            other => Err(ClientError::Unexpected { pid: self.pid, expected: "Answer", got: cut(&other) }),
        }
    }

    /// Gives the running test guest `command` and returns its answer.
    pub fn call(&mut self, command: Command) -> ClientResult<Answer> {
        self.send(&Request::Call { command })?;
        self.recv_answer()
    }

    /// Asks the process to end and waits for it; returns how it ended (`None` for a
    /// process this engine did not start, which it cannot wait for).
    pub fn shutdown(mut self) -> ClientResult<Option<ExitStatus>> {
        self.done(&Request::Shutdown)?;
        let pid = self.pid;
        self.child
            .as_mut()
            .map(Child::wait)
            .transpose()
            .map_err(|source| ClientError::Frame { pid, source: FrameError::Io { op: "wait", source } })
    }
}

impl Drop for VmmProcess {
    fn drop(&mut self) {
        // Closing the socket alone would end an idle process, but not one whose guest is
        // busy in a long command: kill it, and reap it.
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A process whose Hello has been sent and whose answer is still to be read: lets a pool
/// start many processes and let them build their shells in parallel.
pub struct PendingHello(Option<VmmProcess>);

impl PendingHello {
    /// Sends Hello on a just-started process.
    pub fn send(spawned: Spawned) -> ClientResult<PendingHello> {
        let pid = spawned.child.id();
        let mut p = VmmProcess {
            child: Some(spawned.child),
            stream: spawned.stream,
            pid,
            config: VmConfig { mem_size: 0, vcpus: 0, irqchip: false },
            confined: false,
        };
        p.send(&Request::Hello { version: PROTOCOL_VERSION })?;
        Ok(PendingHello(Some(p)))
    }

    /// Reads the Hello answer: the process is ready.
    pub fn finish(&mut self) -> ClientResult<VmmProcess> {
        let Some(mut p) = self.0.take() else {
            return Err(ClientError::Unexpected { pid: 0, expected: "Hello", got: "a second finish".into() });
        };
        match p.recv()? {
            Response::Hello { version: PROTOCOL_VERSION, pid, config, confined } if pid == p.pid => {
                p.config = config;
                p.confined = confined;
                Ok(p)
            }
            other => Err(ClientError::Unexpected { pid: p.pid, expected: "Hello", got: cut(&other) }),
        }
    }
}
