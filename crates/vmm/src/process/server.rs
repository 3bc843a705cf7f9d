//! The VMM process: serves one VM over its control socket.
//!
//! It starts with an empty VM shell of a given shape already built (KVM VM, RAM slot, vCPUs,
//! devices), so that a restore only maps the snapshot's layers and loads state. Two threads:
//!
//! - the **control thread** reads requests, opens snapshot files, restores, checkpoints
//!   (which `fork(2)`s the layer writer) and rolls back; it is not confined by seccomp, since
//!   it opens files and forks;
//! - the **vCPU thread** runs the guest (`KVM_RUN` and the devices it reaches) under the
//!   `Vcpu` seccomp filter of `docs/microvm.md`, installed before it first runs guest code.
//!   The VM moves to it for each guest command and back.
//!
//! The process ends cleanly on [`Request::Shutdown`] or when the socket closes, so an engine
//! that dies leaves no VM behind (and the pool's `PR_SET_PDEATHSIG` covers a guest busy in a
//! long command). A listening process ([`serve_listener`]) belongs to its sandbox instead and
//! ends only on `Shutdown`. A guest that stops on its own is kept and reported by
//! [`Request::Status`]; a Linux guest (`super::linux`) runs on threads of its own.

use super::linux::LinuxGuest;
use super::protocol::{
    decode, read_frame, write_message, ErrorKind, FrameError, RemoteError, Request, Response, Status,
    VmState, PROTOCOL_VERSION,
};
use crate::config::VmConfig;
use crate::error::{kvm, Error, Result};
use crate::hypervisor::Hypervisor;
use crate::seccomp::{self, ThreadKind};
use crate::snapshot::Snapshot;
use crate::synthetic::checkpoint::Checkpoint;
use crate::synthetic::testguest::{self, Answer, Command};
use crate::synthetic::vm::Vm;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;

/// Checkpoints a process keeps for rollback by name before dropping the oldest (each holds
/// its writer's handle and state until dropped).
const MAX_KEPT_CHECKPOINTS: usize = 64;

type Job = (Vm, Command);
type Done = (Vm, Result<Answer>);

/// The thread that runs the guest, confined by the `Vcpu` filter.
struct VcpuThread {
    jobs: mpsc::Sender<Job>,
    done: mpsc::Receiver<Done>,
    confined: bool,
}

impl VcpuThread {
    fn start() -> Result<VcpuThread> {
        // Built here: building allocates and the thread need not.
        let filter = seccomp::filter(ThreadKind::Vcpu)?;
        let (jobs, job_rx) = mpsc::channel::<Job>();
        let (done_tx, done) = mpsc::channel::<Done>();
        let (ready_tx, ready_rx) = mpsc::channel::<bool>();
        std::thread::Builder::new()
            .name("vcpu0".into())
            .spawn(move || {
                // A kernel without seccomp runs the vCPU unconfined, as the reaper does; the
                // handshake says so.
                let _ = ready_tx.send(filter.apply().is_ok());
                while let Ok((mut vm, cmd)) = job_rx.recv() {
                    let r = testguest::call(&mut vm, cmd);
                    if done_tx.send((vm, r)).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| Error::Thread(format!("cannot start the vCPU thread: {e}")))?;
        let confined = ready_rx.recv().map_err(|_| Error::Thread("the vCPU thread ended at start".into()))?;
        Ok(VcpuThread { jobs, done, confined })
    }

    fn call(&self, vm: Vm, cmd: Command) -> Result<Done> {
        self.jobs.send((vm, cmd)).map_err(|_| Error::Thread("the vCPU thread is gone".into()))?;
        self.done.recv().map_err(|_| Error::Thread("the vCPU thread ended during a guest command".into()))
    }
}

struct Server {
    hv: Arc<Hypervisor>,
    config: VmConfig,
    /// The shell or the guest; `None` only when a failed restore lost the shell and no new
    /// one could be built.
    vm: Option<Vm>,
    state: VmState,
    greeted: bool,
    checkpoints: Vec<(PathBuf, String, Checkpoint)>,
    vcpu: VcpuThread,
    /// The Linux guest, once one is booted (the shell is then dropped).
    linux: Option<LinuxGuest>,
}

fn fail(kind: ErrorKind, message: impl Into<String>) -> Response {
    Response::Error(RemoteError { kind, message: message.into() })
}

/// Serves the VM over `stream` until a shutdown request or the socket closes. Builds the
/// shell shaped `config` before reading the first request.
pub fn serve(stream: UnixStream, hv: Arc<Hypervisor>, config: VmConfig) -> Result<()> {
    let mut server = Server::new(hv, config)?;
    server.serve_connection(&stream);
    server.finish();
    Ok(())
}

/// Serves the VM on `listener`, one connection after another, until a shutdown request: a
/// closed connection does not end the process. For a VMM that outlives the engine process
/// that started it (the microvm backend's sandboxes, driven by one CLI command after
/// another). Each connection starts with its own Hello.
pub fn serve_listener(listener: UnixListener, hv: Arc<Hypervisor>, config: VmConfig) -> Result<()> {
    let mut server = Server::new(hv, config)?;
    for conn in listener.incoming() {
        // A failed accept (a client that went away at once) leaves the listener usable.
        let Ok(stream) = conn else { continue };
        server.greeted = false;
        if server.serve_connection(&stream) {
            break;
        }
    }
    server.finish();
    Ok(())
}

fn absolute(path: &Path) -> std::result::Result<(), Response> {
    if path.is_absolute() {
        Ok(())
    } else {
        Err(fail(
            ErrorKind::Argument,
            format!("{} is a relative path; the VMM's working directory is not the engine's, give an absolute path", path.display()),
        ))
    }
}

impl Server {
    fn new(hv: Arc<Hypervisor>, config: VmConfig) -> Result<Server> {
        let shell = Vm::shell(&hv, config)?;
        let vcpu = VcpuThread::start()?;
        Ok(Server {
            hv,
            config,
            vm: Some(shell),
            state: VmState::Idle,
            greeted: false,
            checkpoints: Vec::new(),
            vcpu,
            linux: None,
        })
    }

    /// Serves one connection until it closes or asks for a shutdown; true on a shutdown.
    fn serve_connection(&mut self, stream: &UnixStream) -> bool {
        let mut reader = stream;
        let mut writer = stream;
        loop {
            let payload = match read_frame(&mut reader) {
                Ok(Some(p)) => p,
                // The engine closed the socket (or died).
                Ok(None) => return false,
                Err(e @ FrameError::TooLarge { .. }) | Err(e @ FrameError::Truncated { .. }) => {
                    // The stream cannot be resynchronised: say why, then close.
                    let _ = write_message(&mut writer, &fail(ErrorKind::Protocol, format!("{e}; closing")));
                    return false;
                }
                Err(_) => return false,
            };
            let (reply, stop) = match decode::<Request>(&payload) {
                Ok(req) => {
                    let stop = req == Request::Shutdown && self.greeted;
                    (self.handle(req), stop)
                }
                Err(e) => (
                    fail(
                        ErrorKind::Protocol,
                        format!("{e}; send one JSON request per frame, as branchbox_vmm::process::protocol encodes them"),
                    ),
                    false,
                ),
            };
            let written = write_message(&mut writer, &reply).is_ok();
            // A shutdown stands even when its reply cannot be delivered.
            if stop {
                return true;
            }
            if !written {
                return false;
            }
        }
    }

    /// Stops a Linux guest and waits for it, so its serial log is complete.
    fn finish(&mut self) {
        if let Some(guest) = &mut self.linux {
            guest.stop();
        }
    }

    /// Refuses what a Linux guest cannot do yet, naming it.
    fn not_for_linux(&self, what: &str) -> std::result::Result<(), Response> {
        if self.linux.is_some() {
            return Err(fail(
                ErrorKind::Unsupported,
                format!("{what} is not built for Linux guests yet; this process runs one"),
            ));
        }
        Ok(())
    }

    fn handle(&mut self, req: Request) -> Response {
        if let Request::Hello { version } = req {
            if version != PROTOCOL_VERSION {
                return fail(
                    ErrorKind::Version,
                    format!(
                        "this VMM speaks protocol version {PROTOCOL_VERSION}, the engine {version}; \
                         run the branchbox-vmm binary built with the engine"
                    ),
                );
            }
            self.greeted = true;
            return Response::Hello {
                version: PROTOCOL_VERSION,
                pid: std::process::id(),
                config: self.config,
                confined: self.vcpu.confined,
            };
        }
        if !self.greeted {
            return fail(ErrorKind::NoHello, format!("send Hello {{ version: {PROTOCOL_VERSION} }} first"));
        }
        match self.dispatch(req) {
            Ok(r) | Err(r) => r,
        }
    }

    fn need(&self, states: &[VmState], what: &str) -> std::result::Result<(), Response> {
        if states.contains(&self.state) {
            return Ok(());
        }
        let hint = match self.state {
            VmState::Idle => "restore a snapshot or boot a guest first",
            VmState::Paused => "resume the guest first",
            VmState::Running => "pause the guest first",
            VmState::GuestExited { .. } => "the guest has stopped: shut this process down",
        };
        Err(fail(ErrorKind::State, format!("cannot {what} while the VM is {:?}; {hint}", self.state)))
    }

    fn vm(&mut self) -> std::result::Result<&mut Vm, Response> {
        self.vm.as_mut().ok_or_else(|| fail(ErrorKind::Vmm, "this process lost its VM shell; shut it down"))
    }

    fn dispatch(&mut self, req: Request) -> std::result::Result<Response, Response> {
        // A Linux guest ends on its own threads: every request sees its end.
        if let Some(reason) = self.linux.as_mut().and_then(LinuxGuest::ended) {
            self.state = VmState::GuestExited { reason };
        }
        let vmm = |e: Error| fail(ErrorKind::Vmm, e.to_string());
        match req {
            Request::Hello { .. } => Err(fail(ErrorKind::Protocol, "Hello is handled before dispatch")),
            Request::Status => Ok(Response::Status(Status {
                pid: std::process::id(),
                config: self.config,
                state: self.state.clone(),
            })),
            Request::BootLinux(boot) => {
                self.need(&[VmState::Idle], "boot a Linux guest")?;
                boot.check().map_err(|m| fail(ErrorKind::Argument, m))?;
                // The shell's RAM is not the guest's: free it first.
                self.vm = None;
                match LinuxGuest::boot(&self.hv, &boot) {
                    Ok(guest) => {
                        self.linux = Some(guest);
                        self.state = VmState::Running;
                        Ok(Response::Done)
                    }
                    Err(e) => {
                        // Off the fast path: this is a failure; the process stays usable.
                        self.vm = Vm::shell(&self.hv, self.config).ok();
                        Err(fail(
                            ErrorKind::Boot,
                            format!("cannot boot the Linux guest: {e}; this process is idle again"),
                        ))
                    }
                }
            }
            Request::BootTestGuest => {
                self.need(&[VmState::Idle], "boot the test guest")?;
                let hv = Arc::clone(&self.hv);
                let vm = self.vm()?;
                for i in 0..usize::from(vm.config().vcpus) {
                    vm.vcpu(i)
                        .map_err(vmm)?
                        .fd()
                        .set_cpuid2(hv.supported_cpuid())
                        .map_err(|e| vmm(kvm("KVM_SET_CPUID2")(e)))?;
                }
                testguest::install(vm).map_err(vmm)?;
                self.state = VmState::Paused;
                Ok(Response::Done)
            }
            Request::RestoreLinux(req) => {
                self.need(&[VmState::Idle], "restore a Linux guest")?;
                req.check().map_err(|m| fail(ErrorKind::Argument, m))?;
                // The shell's RAM is not the guest's: free it first.
                self.vm = None;
                match LinuxGuest::restore(&self.hv, &req) {
                    Ok(guest) => {
                        self.linux = Some(guest);
                        self.state = if req.resume { VmState::Running } else { VmState::Paused };
                        Ok(Response::Done)
                    }
                    Err(e) => {
                        self.vm = Vm::shell(&self.hv, self.config).ok();
                        Err(fail(
                            ErrorKind::Snapshot,
                            format!("cannot restore the Linux guest: {e}; this process is idle again"),
                        ))
                    }
                }
            }
            Request::Restore { dir, name, resume } => {
                self.need(&[VmState::Idle], "restore")?;
                absolute(&dir)?;
                self.restore(&dir, &name)?;
                self.state = if resume { VmState::Running } else { VmState::Paused };
                Ok(Response::Done)
            }
            Request::Pause => {
                self.need(&[VmState::Paused, VmState::Running], "pause")?;
                if let Some(guest) = &self.linux {
                    guest
                        .pause()
                        .map_err(|e| fail(ErrorKind::Guest, format!("cannot pause the guest: {e}")))?;
                }
                self.state = VmState::Paused;
                Ok(Response::Done)
            }
            Request::Resume => {
                self.need(&[VmState::Paused, VmState::Running], "resume")?;
                if let Some(guest) = &self.linux {
                    guest.resume();
                }
                self.state = VmState::Running;
                Ok(Response::Done)
            }
            Request::Snapshot { dir } => {
                self.need(&[VmState::Paused], "snapshot")?;
                absolute(&dir)?;
                if let Some(guest) = &self.linux {
                    guest.snapshot(&dir).map_err(|e| fail(ErrorKind::Snapshot, e))?;
                    return Ok(Response::Done);
                }
                self.vm()?.snapshot(&dir).map_err(|e| fail(ErrorKind::Snapshot, e.to_string()))?;
                Ok(Response::Done)
            }
            Request::Checkpoint { dir, name } => {
                self.not_for_linux("a checkpoint")?;
                self.need(&[VmState::Paused], "checkpoint")?;
                absolute(&dir)?;
                let cp = self
                    .vm()?
                    .checkpoint(&dir, &name)
                    .map_err(|e| fail(ErrorKind::Snapshot, e.to_string()))?;
                let reply = Response::Checkpoint {
                    pause_us: u64::try_from(cp.pause().as_micros()).unwrap_or(u64::MAX),
                    pages: cp.pages(),
                    writer_pid: cp.writer_pid(),
                };
                self.checkpoints.retain(|(d, n, _)| !(d == &dir && n == &name));
                if self.checkpoints.len() >= MAX_KEPT_CHECKPOINTS {
                    self.checkpoints.remove(0);
                }
                self.checkpoints.push((dir, name, cp));
                Ok(reply)
            }
            Request::Rollback { dir, name } => {
                self.not_for_linux("a rollback")?;
                self.need(&[VmState::Paused], "roll back")?;
                absolute(&dir)?;
                let snapshot = self.find_snapshot(&dir, &name)?;
                self.vm()?.rollback(&snapshot).map_err(|e| fail(ErrorKind::Snapshot, e.to_string()))?;
                Ok(Response::Done)
            }
            Request::Call { command } => {
                self.not_for_linux("a test-guest command")?;
                self.need(&[VmState::Running], "run a guest command")?;
                let vm = self.vm.take().ok_or_else(|| fail(ErrorKind::Vmm, "this process lost its VM"))?;
                let (vm, result) = self.vcpu.call(vm, command).map_err(vmm)?;
                self.vm = Some(vm);
                match result {
                    Ok(a) => Ok(Response::Answer(a)),
                    Err(Error::Guest(reason)) => {
                        self.state = VmState::GuestExited { reason: reason.clone() };
                        Err(fail(
                            ErrorKind::Guest,
                            format!("the guest stopped: {reason}; its VM is kept for Status until Shutdown"),
                        ))
                    }
                    Err(e) => Err(vmm(e)),
                }
            }
            Request::Shutdown => Ok(Response::Done),
        }
    }

    /// A checkpoint this process took (its layer may still be being written), or the
    /// snapshot on disk.
    fn find_snapshot(&mut self, dir: &Path, name: &str) -> std::result::Result<Snapshot, Response> {
        let snap = match self.checkpoints.iter_mut().find(|(d, n, _)| d == dir && n == name) {
            Some((_, _, cp)) => cp.ready(),
            None => Snapshot::open_named(dir, name),
        };
        snap.map_err(|e| fail(ErrorKind::Snapshot, e.to_string()))
    }

    fn restore(&mut self, dir: &Path, name: &str) -> std::result::Result<(), Response> {
        let snapshot =
            Snapshot::open_named(dir, name).map_err(|e| fail(ErrorKind::Snapshot, e.to_string()))?;
        let shape = snapshot.state().config;
        if shape != self.config {
            return Err(fail(
                ErrorKind::Shape,
                format!(
                    "snapshot {} in {} is for a VM shaped {shape:?}, this process holds a shell shaped {:?}; \
                     restore it in a process (pool) of that shape",
                    name,
                    dir.display(),
                    self.config
                ),
            ));
        }
        let shell = self.vm.take().ok_or_else(|| fail(ErrorKind::Vmm, "this process lost its VM shell"))?;
        match Vm::restore_into(shell, &snapshot) {
            Ok(vm) => {
                self.vm = Some(vm);
                Ok(())
            }
            Err(e) => {
                // The shell may hold part of the snapshot: replace it so the process stays
                // usable (off the fast path: this is a failure).
                self.vm = Vm::shell(&self.hv, self.config).ok();
                Err(fail(ErrorKind::Snapshot, format!("{e}; this process is idle again")))
            }
        }
    }
}
