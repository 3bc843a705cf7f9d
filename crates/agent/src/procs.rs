//! Background processes: started, listed, signalled and waited for by pid. Their output is
//! kept as a bounded tail in memory so `wait` can return it.

use crate::exec::{self, Stream};
use crate::reaper::Reaper;
use crate::Failure;
use branchbox_protocol::{ErrorCode, ExecSpec, ExitStatus, ProcInfo};
use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::process::ChildStdin;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Output kept per stream of a background process (the host accepts no more from `wait`).
use branchbox_protocol::limits::PROC_TAIL as TAIL;
/// Most background processes tracked at once (finished ones count until waited for).
const MAX_PROCS: usize = 1024;
/// Chunks of output an attached reader may fall behind by before it is dropped.
const ATTACH_DEPTH: usize = 64;
/// Most readers attached to one process.
const MAX_ATTACHED: usize = 16;

struct Entry {
    spec: ExecSpec,
    stdout: VecDeque<u8>,
    stderr: VecDeque<u8>,
    exit: Option<ExitStatus>,
    /// Its stdin, when started with one; taken while a write is in progress.
    stdin: Arc<Mutex<Option<ChildStdin>>>,
    /// Readers attached to its output.
    attached: Vec<SyncSender<Output>>,
}

/// A reader attached to a process: the output kept until then, when asked for (stdout,
/// stderr), and the rest as it comes, or how the process ended when it already has.
pub struct Attached {
    /// The kept tails, with `replay`.
    pub kept: Option<(Vec<u8>, Vec<u8>)>,
    /// What follows, or the exit status.
    pub live: Result<Receiver<Output>, ExitStatus>,
}

/// What an attached reader receives.
pub enum Output {
    /// A chunk of output.
    Chunk(Stream, Vec<u8>),
    /// The process ended.
    Exit(ExitStatus),
}

/// A finished process: its status and output tails.
pub struct Finished {
    /// How it ended.
    pub status: ExitStatus,
    /// Last bytes of its standard output.
    pub stdout: Vec<u8>,
    /// Last bytes of its standard error.
    pub stderr: Vec<u8>,
}

/// The table of background processes.
#[derive(Default)]
pub struct Procs {
    table: Mutex<BTreeMap<i32, Entry>>,
    changed: Condvar,
}

fn push_tail(buf: &mut VecDeque<u8>, chunk: &[u8]) {
    buf.extend(chunk);
    let excess = buf.len().saturating_sub(TAIL);
    buf.drain(..excess);
}

impl Procs {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<i32, Entry>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts `spec` in the background and returns its pid.
    pub fn spawn(self: &Arc<Self>, reaper: &Reaper, spec: ExecSpec) -> Result<i32, Failure> {
        {
            let mut t = self.lock();
            if t.len() >= MAX_PROCS {
                // Forget finished processes first; refuse only when all are still running.
                t.retain(|_, e| e.exit.is_none());
                if t.len() >= MAX_PROCS {
                    return Err(Failure::new(
                        ErrorCode::BadRequest,
                        format!("{MAX_PROCS} background processes are running; stop some first"),
                    ));
                }
            }
        }
        if spec.pty.is_some() {
            return Err(Failure::new(
                ErrorCode::BadRequest,
                "a terminal is for exec, not a background process",
            ));
        }
        let mut started = exec::start(reaper, &spec)?;
        let pid = started.child.id() as i32;
        let timeout = spec.timeout_ms.map(Duration::from_millis);
        let stdin = Arc::new(Mutex::new(started.child.stdin.take()));
        let entry = Entry {
            spec,
            stdout: VecDeque::new(),
            stderr: VecDeque::new(),
            exit: None,
            stdin,
            attached: Vec::new(),
        };
        self.lock().insert(pid, entry);
        let me = Arc::clone(self);
        std::thread::spawn(move || {
            let status = exec::pump(started, timeout, u64::MAX, &mut |which, chunk| {
                let mut t = me.lock();
                if let Some(e) = t.get_mut(&pid) {
                    match which {
                        Stream::Stdout => push_tail(&mut e.stdout, chunk),
                        Stream::Stderr => push_tail(&mut e.stderr, chunk),
                    }
                    // A reader that fell this far behind is dropped (its attach says so)
                    // rather than slowing the process.
                    e.attached.retain(|r| match r.try_send(Output::Chunk(which, chunk.to_vec())) {
                        Ok(()) => true,
                        Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
                    });
                }
            });
            if let Some(e) = me.lock().get_mut(&pid) {
                for r in e.attached.drain(..) {
                    let _ = r.try_send(Output::Exit(status.clone()));
                }
                e.exit = Some(status);
                // Nothing reads a finished process's stdin.
                e.stdin.lock().unwrap_or_else(|p| p.into_inner()).take();
            }
            me.changed.notify_all();
        });
        Ok(pid)
    }

    /// Every tracked process.
    pub fn list(&self) -> Vec<ProcInfo> {
        self.lock()
            .iter()
            .map(|(pid, e)| ProcInfo { pid: *pid, cmd: e.spec.cmd.clone(), exit: e.exit.clone() })
            .collect()
    }

    /// Signals a tracked process or its group.
    pub fn signal(&self, pid: i32, signal: i32, group: bool) -> Result<(), Failure> {
        if !self.lock().contains_key(&pid) {
            return Err(not_found(pid));
        }
        if !(1..=64).contains(&signal) {
            return Err(Failure::new(ErrorCode::BadRequest, format!("{signal} is not a signal number")));
        }
        let target = if group { -pid } else { pid };
        // SAFETY: plain kill(2) on a pid we started.
        if unsafe { libc::kill(target, signal) } != 0 {
            return Err(Failure::io(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Writes `bytes` to the stdin of a process started with one; with `eof`, closes it after.
    pub fn input(&self, pid: i32, bytes: &[u8], eof: bool) -> Result<(), Failure> {
        let stdin = match self.lock().get(&pid) {
            None => return Err(not_found(pid)),
            Some(e) => Arc::clone(&e.stdin),
        };
        // Writes to one process take turns; the table stays free while one blocks.
        let mut slot = stdin.lock().unwrap_or_else(|p| p.into_inner());
        let Some(pipe) = slot.as_mut() else {
            let why = format!(
                "process {pid} has no stdin to write to: it was started without stdin, its stdin was closed, or it ended"
            );
            return Err(Failure::new(ErrorCode::BadRequest, why));
        };
        if let Err(e) = pipe.write_all(bytes) {
            slot.take();
            return Err(Failure::io(e));
        }
        if eof {
            slot.take();
        }
        Ok(())
    }

    /// Attaches a reader to a process's output from now on: `Err(status)` when it has ended.
    /// With `replay`, the kept tails (stdout, stderr) are returned too, taken at the same
    /// instant the reader is attached, so nothing falls between them.
    pub fn attach(&self, pid: i32, replay: bool) -> Result<Attached, Failure> {
        let mut t = self.lock();
        let e = t.get_mut(&pid).ok_or_else(|| not_found(pid))?;
        let kept = replay.then(|| (e.stdout.iter().copied().collect(), e.stderr.iter().copied().collect()));
        if let Some(status) = &e.exit {
            return Ok(Attached { kept, live: Err(status.clone()) });
        }
        if e.attached.len() >= MAX_ATTACHED {
            return Err(Failure::new(
                ErrorCode::BadRequest,
                format!("{MAX_ATTACHED} readers are attached to process {pid} already"),
            ));
        }
        let (tx, rx) = sync_channel(ATTACH_DEPTH);
        e.attached.push(tx);
        Ok(Attached { kept, live: Ok(rx) })
    }

    /// How a process ended, if it has and is still tracked.
    pub fn status(&self, pid: i32) -> Option<ExitStatus> {
        self.lock().get(&pid).and_then(|e| e.exit.clone())
    }

    /// Waits for a process to exit; `Ok(None)` when `timeout` passed first. On exit, returns
    /// the status and the output tails, and forgets the process.
    pub fn wait(&self, pid: i32, timeout: Option<Duration>) -> Result<Option<Finished>, Failure> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut t = self.lock();
        loop {
            match t.get(&pid) {
                None => return Err(not_found(pid)),
                Some(e) if e.exit.is_some() => {
                    let e = t.remove(&pid).ok_or_else(|| not_found(pid))?;
                    let status = e.exit.ok_or_else(|| not_found(pid))?;
                    return Ok(Some(Finished { status, stdout: e.stdout.into(), stderr: e.stderr.into() }));
                }
                Some(_) => {}
            }
            let wait = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(None);
                    }
                    left
                }
                None => Duration::from_secs(3600),
            };
            t = self.changed.wait_timeout(t, wait).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

fn not_found(pid: i32) -> Failure {
    Failure::new(ErrorCode::NotFound, format!("no background process with pid {pid}; `ps` lists them"))
}
