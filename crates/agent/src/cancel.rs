//! Cancellation of running requests. The shim sends `cancel` for each open request of a client
//! connection that closed; the request's worker notices and stops (a command's whole process
//! group is killed), so nothing keeps streaming to a reader that is gone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The cancel flag of one request.
#[derive(Default)]
pub struct Token {
    cancelled: AtomicBool,
    /// The process group of the request's command, once started.
    group: Mutex<Option<i32>>,
}

impl Token {
    /// True once the request was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    /// Records the command's process group; kills it at once if the request was already
    /// cancelled.
    pub fn watch_group(&self, pgid: i32) {
        let mut g = self.group.lock().unwrap_or_else(|e| e.into_inner());
        *g = Some(pgid);
        if self.is_cancelled() {
            crate::reaper::kill_group(pgid);
        }
    }

    fn cancel(&self) {
        let g = self.group.lock().unwrap_or_else(|e| e.into_inner());
        self.cancelled.store(true, Ordering::SeqCst);
        if let Some(pgid) = *g {
            crate::reaper::kill_group(pgid);
        }
    }
}

/// The tokens of the requests running now.
#[derive(Default)]
pub struct Registry {
    running: Mutex<HashMap<u64, Arc<Token>>>,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Token>>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A token for request `id`, until [`Registry::finish`].
    pub fn start(&self, id: u64) -> Arc<Token> {
        let t = Arc::new(Token::default());
        self.lock().insert(id, Arc::clone(&t));
        t
    }

    /// True while request `id` runs (between [`Registry::start`] and [`Registry::finish`]).
    pub fn is_running(&self, id: u64) -> bool {
        self.lock().contains_key(&id)
    }

    /// Forgets request `id`.
    pub fn finish(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Cancels request `id`; false when it is not running (finished, or never existed).
    pub fn cancel(&self, id: u64) -> bool {
        let t = self.lock().get(&id).cloned();
        t.map(|t| t.cancel()).is_some()
    }
}

/// The error a cancelled request ends with.
pub fn cancelled() -> crate::Failure {
    crate::Failure::new(branchbox_protocol::ErrorCode::Io, "cancelled: the client went away")
}
