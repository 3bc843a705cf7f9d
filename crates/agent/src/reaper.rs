//! Central child reaper.
//!
//! The agent is PID 1 in its sandbox, so orphans are re-parented to it and must be reaped.
//! One thread owns `wait`: it peeks at an exited child with `WNOWAIT`, then reaps it under the
//! table lock and hands the status to whoever spawned that pid. Spawning holds the same lock,
//! so a pid is always registered before its status can be dispatched, and the standard
//! library's own reaping of a child whose `exec` failed never races with ours.

use std::collections::HashMap;
use std::io;
use std::process::{Child, Command};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

#[derive(Default)]
struct Table {
    waiters: HashMap<i32, SyncSender<libc::c_int>>,
}

/// Dispatches exit statuses of the agent's children.
#[derive(Default)]
pub struct Reaper {
    table: Mutex<Table>,
    spawned: Condvar,
}

impl Reaper {
    /// Starts the reaping thread.
    pub fn start() -> Arc<Reaper> {
        let r = Arc::new(Reaper::default());
        let worker = Arc::clone(&r);
        std::thread::spawn(move || worker.run());
        r
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Spawns `cmd`; the receiver yields its raw wait status once it exits.
    pub fn spawn(&self, cmd: &mut Command) -> io::Result<(Child, Receiver<libc::c_int>)> {
        let mut table = self.lock();
        let child = cmd.spawn()?;
        let (tx, rx) = sync_channel(1);
        table.waiters.insert(child.id() as i32, tx);
        self.spawned.notify_all();
        Ok((child, rx))
    }

    fn run(&self) {
        loop {
            // SAFETY: siginfo_t is plain data; waitid fills it in.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: valid pointer to a siginfo_t; WNOWAIT leaves the child waitable.
            let rc = unsafe { libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOWAIT) };
            if rc != 0 {
                let err = io::Error::last_os_error();
                if err.raw_os_error() == Some(libc::ECHILD) {
                    let table = self.lock();
                    let _ = self.spawned.wait_timeout(table, Duration::from_millis(100));
                }
                continue;
            }
            // SAFETY: waitid succeeded with WEXITED, so si_pid is valid.
            let pid = unsafe { info.si_pid() };
            let mut table = self.lock();
            let mut status: libc::c_int = 0;
            // SAFETY: reaping a specific child we just saw exit.
            let reaped = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if reaped == pid {
                if let Some(tx) = table.waiters.remove(&pid) {
                    let _ = tx.try_send(status);
                }
            }
        }
    }
}

/// Rounds of SIGKILL sent to a group: a fork bomb forks between rounds.
const KILL_ROUNDS: usize = 200;

/// Sends SIGKILL to the process group led by `pid` until no process is left in it (children
/// forked while the first signal was delivered are caught by the next round).
pub fn kill_group(pid: i32) {
    for _ in 0..KILL_ROUNDS {
        // SAFETY: signalling a process group; failure (already gone) is harmless.
        if unsafe { libc::kill(-pid, libc::SIGKILL) } != 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
