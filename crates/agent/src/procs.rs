//! Background processes: started, listed, signalled and waited for by pid. Their output is
//! kept as a bounded tail in memory so `wait` can return it.

use crate::exec::{self, Stream};
use crate::reaper::Reaper;
use crate::Failure;
use branchbox_protocol::{ErrorCode, ExecSpec, ExitStatus, ProcInfo};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Output kept per stream of a background process (the host accepts no more from `wait`).
use branchbox_protocol::limits::PROC_TAIL as TAIL;
/// Most background processes tracked at once (finished ones count until waited for).
const MAX_PROCS: usize = 1024;

struct Entry {
    spec: ExecSpec,
    stdout: VecDeque<u8>,
    stderr: VecDeque<u8>,
    exit: Option<ExitStatus>,
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
        let mut spec = spec;
        spec.stdin = false;
        let started = exec::start(reaper, &spec)?;
        let pid = started.child.id() as i32;
        let timeout = spec.timeout_ms.map(Duration::from_millis);
        self.lock().insert(pid, Entry { spec, stdout: VecDeque::new(), stderr: VecDeque::new(), exit: None });
        let me = Arc::clone(self);
        std::thread::spawn(move || {
            let status = exec::pump(started, timeout, u64::MAX, &mut |which, chunk| {
                let mut t = me.lock();
                if let Some(e) = t.get_mut(&pid) {
                    match which {
                        Stream::Stdout => push_tail(&mut e.stdout, chunk),
                        Stream::Stderr => push_tail(&mut e.stderr, chunk),
                    }
                }
            });
            if let Some(e) = me.lock().get_mut(&pid) {
                e.exit = Some(status);
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
