//! A pool of pre-started VMM processes, each holding a built VM shell, and fork into them.
//!
//! Building a VM (KVM VM, RAM slot, vCPUs) and starting a process are the slow parts of a
//! child; the pool does both ahead of time, off the fork path, and refills in the
//! background. A fork then only tells N idle processes "restore snapshot S" (each maps the
//! layers `MAP_PRIVATE` and loads state, in parallel); it starts processes on the clock only
//! when the pool holds fewer than N, and says how many.
//!
//! Every process is started from one long-lived thread of the engine (`PR_SET_PDEATHSIG`
//! fires when the *thread* that started a process exits, so a short-lived caller thread must
//! not start VMMs that outlive it).

use super::client::{spawn, ClientError, ClientResult, PendingHello, VmmProcess, VMM_ENV};
use super::protocol::Request;
use crate::config::VmConfig;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The `branchbox-vmm` program: `$BRANCHBOX_VMM`, else next to the running program or one
/// directory up (an example or a test binary sits one level below the binaries), else
/// found on `PATH`.
pub fn default_program() -> PathBuf {
    if let Some(p) = std::env::var_os(VMM_ENV) {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().ok();
    let dirs = exe.iter().filter_map(|e| e.parent()).flat_map(|d| [Some(d), d.parent()]).flatten();
    for dir in dirs {
        let candidate = dir.join("branchbox-vmm");
        if candidate.is_file() {
            return candidate;
        }
    }
    PathBuf::from("branchbox-vmm")
}

struct SpawnJob {
    program: PathBuf,
    config: VmConfig,
    count: usize,
    reply: mpsc::Sender<Vec<ClientResult<VmmProcess>>>,
}

/// The engine's one process-starting thread, started on first use and never ended.
fn spawner() -> Option<&'static Mutex<mpsc::Sender<SpawnJob>>> {
    static SPAWNER: OnceLock<Option<Mutex<mpsc::Sender<SpawnJob>>>> = OnceLock::new();
    SPAWNER
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<SpawnJob>();
            std::thread::Builder::new()
                .name("vmm-spawner".into())
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        let _ = job.reply.send(start_many(&job.program, job.config, job.count));
                    }
                })
                .ok()
                .map(|_| Mutex::new(tx))
        })
        .as_ref()
}

/// Starts `count` processes, then reads their handshakes: they build their shells in
/// parallel.
fn start_many(program: &Path, config: VmConfig, count: usize) -> Vec<ClientResult<VmmProcess>> {
    let pending: Vec<ClientResult<PendingHello>> =
        (0..count).map(|_| spawn(program, config).and_then(PendingHello::send)).collect();
    pending.into_iter().map(|p| p.and_then(|mut h| h.finish())).collect()
}

/// Asks the spawner thread for `count` processes; the answer arrives on the returned channel.
fn start_async(
    program: &Path,
    config: VmConfig,
    count: usize,
) -> mpsc::Receiver<Vec<ClientResult<VmmProcess>>> {
    let (reply, rx) = mpsc::channel();
    let job = SpawnJob { program: program.into(), config, count, reply };
    match spawner() {
        Some(s) => {
            let sent = s.lock().map(|tx| tx.send(job)).is_ok_and(|r| r.is_ok());
            if !sent {
                let (reply, rx2) = mpsc::channel();
                let _ = reply.send(not_started(count, "the VMM spawner thread is gone"));
                return rx2;
            }
        }
        None => {
            let _ = job.reply.send(not_started(count, "the VMM spawner thread could not be started"));
        }
    }
    rx
}

fn not_started(count: usize, why: &str) -> Vec<ClientResult<VmmProcess>> {
    (0..count)
        .map(|_| Err(ClientError::Exited { pid: 0, how: format!("was never started: {why}") }))
        .collect()
}

fn receive(
    rx: &mpsc::Receiver<Vec<ClientResult<VmmProcess>>>,
    count: usize,
) -> Vec<ClientResult<VmmProcess>> {
    rx.recv().unwrap_or_else(|_| not_started(count, "the VMM spawner thread ended"))
}

struct Inner {
    program: PathBuf,
    config: VmConfig,
    target: usize,
    idle: Mutex<Vec<VmmProcess>>,
    changed: Condvar,
    stop: AtomicBool,
    last_error: Mutex<Option<String>>,
}

/// Pre-started VMM processes of one shape, kept at a target count by a background thread.
pub struct VmmPool {
    inner: Arc<Inner>,
    refill: Option<JoinHandle<()>>,
}

/// The outcome of [`VmmPool::fork`].
pub struct PoolFork {
    /// Each child, in order, or why it failed (one child's failure does not stop the others).
    pub children: Vec<ClientResult<VmmProcess>>,
    /// Children served by processes that were already idle in the pool.
    pub from_pool: usize,
    /// Children whose process was started on the clock because the pool ran short.
    pub started_on_clock: usize,
}

impl VmmPool {
    /// A pool that keeps `idle` processes of `program`, each holding a shell shaped
    /// `config`, ready; it starts filling at once.
    pub fn new(program: &Path, config: VmConfig, idle: usize) -> VmmPool {
        let inner = Arc::new(Inner {
            program: program.into(),
            config,
            target: idle,
            idle: Mutex::new(Vec::new()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            last_error: Mutex::new(None),
        });
        let bg = Arc::clone(&inner);
        let refill =
            std::thread::Builder::new().name("vmm-pool-refill".into()).spawn(move || refill(&bg)).ok();
        VmmPool { inner, refill }
    }

    /// The shape of the pool's shells.
    pub fn config(&self) -> VmConfig {
        self.inner.config
    }

    /// Processes idle now.
    pub fn idle(&self) -> usize {
        self.inner.idle.lock().map(|v| v.len()).unwrap_or(0)
    }

    /// Waits until the pool holds its target of idle processes, at most `timeout`.
    pub fn wait_ready(&self, timeout: Duration) -> ClientResult<()> {
        let deadline = Instant::now() + timeout;
        let poisoned = || ClientError::PoolNotReady {
            ready: 0,
            target: self.inner.target,
            waited: timeout,
            last: "the pool's lock is poisoned (a thread panicked holding it)".into(),
        };
        let mut idle = self.inner.idle.lock().map_err(|_| poisoned())?;
        while idle.len() < self.inner.target {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let last = self.inner.last_error.lock().ok().and_then(|e| e.clone());
                return Err(ClientError::PoolNotReady {
                    ready: idle.len(),
                    target: self.inner.target,
                    waited: timeout,
                    last: last.unwrap_or_else(|| "none (the host may be slow: wait longer)".into()),
                });
            }
            idle = self.inner.changed.wait_timeout(idle, left).map_err(|_| poisoned())?.0;
        }
        Ok(())
    }

    /// Takes up to `n` live idle processes and wakes the refill thread.
    fn take(&self, n: usize) -> Vec<VmmProcess> {
        let mut taken = Vec::with_capacity(n);
        if let Ok(mut idle) = self.inner.idle.lock() {
            while taken.len() < n {
                let Some(mut p) = idle.pop() else { break };
                // A process that died while idle (killed from outside) is dropped here.
                if p.is_alive() {
                    taken.push(p);
                }
            }
        }
        self.inner.changed.notify_all();
        taken
    }

    /// Forks snapshot `name` of `dir` into `n` processes: sends Restore to `n` idle ones at
    /// once and reads their replies (they restore in parallel), starting any missing ones on
    /// the clock. Children are paused unless `resume`.
    pub fn fork(&self, dir: &Path, name: &str, n: usize, resume: bool) -> PoolFork {
        let taken = self.take(n);
        let from_pool = taken.len();
        let missing = n - from_pool;
        let fresh_rx = (missing > 0).then(|| start_async(&self.inner.program, self.inner.config, missing));
        let req = Request::Restore { dir: dir.into(), name: name.into(), resume };
        let send = |mut p: VmmProcess| p.send(&req).map(|()| p);
        let mut sent: Vec<ClientResult<VmmProcess>> = taken.into_iter().map(send).collect();
        if let Some(rx) = fresh_rx {
            sent.extend(receive(&rx, missing).into_iter().map(|r| r.and_then(send)));
        }
        let children = sent.into_iter().map(|r| r.and_then(|mut p| p.recv_done().map(|()| p))).collect();
        PoolFork { children, from_pool, started_on_clock: missing }
    }

    /// One idle process (started on the clock if the pool is empty).
    pub fn get(&self) -> ClientResult<VmmProcess> {
        if let Some(p) = self.take(1).pop() {
            return Ok(p);
        }
        receive(&start_async(&self.inner.program, self.inner.config, 1), 1)
            .pop()
            .unwrap_or_else(|| Err(ClientError::Exited { pid: 0, how: "was never started".into() }))
    }
}

fn refill(inner: &Inner) {
    loop {
        let need = {
            let Ok(mut idle) = inner.idle.lock() else { return };
            while !inner.stop.load(Ordering::Acquire) && idle.len() >= inner.target {
                let Ok(g) = inner.changed.wait(idle) else { return };
                idle = g;
            }
            if inner.stop.load(Ordering::Acquire) {
                return;
            }
            inner.target - idle.len()
        };
        let mut failed = false;
        for r in receive(&start_async(&inner.program, inner.config, need), need) {
            match r {
                Ok(p) => {
                    if let Ok(mut idle) = inner.idle.lock() {
                        idle.push(p);
                    }
                    inner.changed.notify_all();
                }
                Err(e) => {
                    failed = true;
                    if let Ok(mut last) = inner.last_error.lock() {
                        *last = Some(e.to_string());
                    }
                }
            }
        }
        if failed {
            // Do not spin on a program that cannot start; retry after a pause (or stop).
            if let Ok(idle) = inner.idle.lock() {
                let _ = inner.changed.wait_timeout(idle, Duration::from_secs(1));
            }
        }
    }
}

impl Drop for VmmPool {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        self.inner.changed.notify_all();
        if let Some(h) = self.refill.take() {
            let _ = h.join();
        }
        // The idle processes are dropped with `inner` (each killed and reaped).
    }
}
