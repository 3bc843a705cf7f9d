//! How long a long-lived stream lives, and how many there may be. A stream that follows
//! something in a sandbox (a process's output, a directory's changes, a terminal, a proxied
//! WebSocket) holds an agent connection or socket, and most hold a blocking thread reading it;
//! a client holding one sandbox's token must not be able to pile them up until the service has
//! no thread left for anyone else, nor keep the service from stopping. So:
//!
//! - A stream ends with its client: [`Detach`] shuts the agent connection's socket
//!   (`shutdown(2)`) when the stream's body is dropped, which returns the blocked read at once
//!   (the agent then cancels the attach or watch, never the process).
//! - A stream ends when the service stops: [`Streams::stop`] (on SIGTERM) ends every one, so
//!   the service's drain does not wait on them.
//! - Each kind of stream is bounded per sandbox, per token and in the whole service
//!   ([`Limit`]); past a bound the stream is refused with a clear error ([`Refused`]: HTTP 429
//!   `too_many_streams`, envd's `resource_exhausted`) instead of queueing.

use crate::error::ApiError;
use axum::http::StatusCode;
use branchbox_model::{AgentConn, SandboxId};
use std::collections::HashMap;
use std::future::Future;
use std::os::unix::net::UnixStream;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::watch;

/// How many streams of one kind may be open at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// In one sandbox.
    pub per_sandbox: usize,
    /// Opened with one token (a sandbox's access token counts as the token it derives from).
    pub per_token: usize,
    /// In the whole service.
    pub total: usize,
}

/// The kinds of long-lived stream, each with its own bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A stream read by a blocking thread: a process's output (envd's `Start` and `Connect`,
    /// `/processes/{pid}/output`) or a directory watch (`WatchDir`, `/files/watch`).
    Follow,
    /// envd's polling watcher (`CreateWatcher`): a blocking thread until it is removed.
    Watcher,
    /// A terminal (envd's `Start` with `pty`, `/pty`): two threads and a process.
    Terminal,
    /// A WebSocket joined through the port proxy: two sockets, no thread.
    Socket,
}

impl Kind {
    /// The bounds of this kind. Follows and watchers together stay well under tokio's 512
    /// blocking threads, so requests always find a worker.
    pub const fn limit(self) -> Limit {
        match self {
            Kind::Follow => Limit { per_sandbox: 64, per_token: 192, total: 256 },
            Kind::Watcher => Limit { per_sandbox: 32, per_token: 96, total: 128 },
            Kind::Terminal => Limit { per_sandbox: 16, per_token: 128, total: 256 },
            Kind::Socket => Limit { per_sandbox: 64, per_token: 256, total: 512 },
        }
    }

    fn plural(self) -> &'static str {
        match self {
            Kind::Follow => "streams",
            Kind::Watcher => "watchers",
            Kind::Terminal => "terminals",
            Kind::Socket => "proxied WebSockets",
        }
    }
}

/// A stream refused past one of its bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{max} {what} are open {scope}; close one and retry")]
pub struct Refused {
    /// How many are allowed.
    pub max: usize,
    /// What is counted ("streams").
    pub what: &'static str,
    /// Where ("in this sandbox", "with this token", "in the service").
    pub scope: &'static str,
}

impl From<Refused> for ApiError {
    fn from(r: Refused) -> ApiError {
        ApiError::new(StatusCode::TOO_MANY_REQUESTS, "too_many_streams", r.to_string())
    }
}

#[derive(Default)]
struct Counts {
    total: HashMap<Kind, usize>,
    sandbox: HashMap<(Kind, String), usize>,
    token: HashMap<(Kind, String), usize>,
}

fn lock(m: &Mutex<Counts>) -> MutexGuard<'_, Counts> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn down<K: Eq + std::hash::Hash>(map: &mut HashMap<K, usize>, key: K) {
    if let Some(n) = map.get_mut(&key) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            map.remove(&key);
        }
    }
}

/// The service's open streams, counted, and the signal that ends them all.
pub struct Streams {
    counts: Arc<Mutex<Counts>>,
    stop: watch::Sender<bool>,
}

impl Default for Streams {
    fn default() -> Self {
        Streams { counts: Arc::default(), stop: watch::channel(false).0 }
    }
}

/// One open stream's place under its bounds, given back when dropped.
pub struct Place {
    counts: Arc<Mutex<Counts>>,
    kind: Kind,
    sandbox: String,
    token: String,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut c = lock(&self.counts);
        down(&mut c.total, self.kind);
        down(&mut c.sandbox, (self.kind, std::mem::take(&mut self.sandbox)));
        down(&mut c.token, (self.kind, std::mem::take(&mut self.token)));
    }
}

impl Streams {
    /// A place for a stream of `kind` in `sandbox` opened with `token` (the caller's token id),
    /// or which bound it would pass.
    pub fn take(&self, kind: Kind, sandbox: &SandboxId, token: &str) -> Result<Place, Refused> {
        let limit = kind.limit();
        let mut c = lock(&self.counts);
        let (sandbox, token) = (sandbox.to_string(), token.to_string());
        let checks = [
            (c.sandbox.get(&(kind, sandbox.clone())).copied(), limit.per_sandbox, "in this sandbox"),
            (c.token.get(&(kind, token.clone())).copied(), limit.per_token, "with this token"),
            (c.total.get(&kind).copied(), limit.total, "in the service"),
        ];
        for (open, max, scope) in checks {
            if open.unwrap_or(0) >= max {
                return Err(Refused { max, what: kind.plural(), scope });
            }
        }
        *c.total.entry(kind).or_default() += 1;
        *c.sandbox.entry((kind, sandbox.clone())).or_default() += 1;
        *c.token.entry((kind, token.clone())).or_default() += 1;
        Ok(Place { counts: self.counts.clone(), kind, sandbox, token })
    }

    /// How many streams of `kind` are open in the service.
    pub fn open(&self, kind: Kind) -> usize {
        lock(&self.counts).total.get(&kind).copied().unwrap_or(0)
    }

    /// Ends every stream, now and from now on: the service is stopping.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// Completes once the service is stopping.
    pub fn stopping(&self) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        let mut rx = self.stop.subscribe();
        Box::pin(async move {
            // An error means the sender is gone with the service: stopping too.
            let _ = rx.wait_for(|s| *s).await;
        })
    }
}

/// Shuts an agent connection's socket when dropped: the thread blocked reading it gets end of
/// file at once, and the agent cancels the attach or watch it served (not the process).
pub struct Detach(UnixStream);

impl Detach {
    /// The detacher of `conn`: a second handle on its socket.
    pub fn of(conn: &mut AgentConn) -> Result<Detach, ApiError> {
        conn.stream_mut()
            .try_clone()
            .map(Detach)
            .map_err(|e| ApiError::internal(format!("cannot share the agent connection: {e}")))
    }
}

impl Detach {
    /// Shuts the connection now (for a holder shared with the thread reading it).
    pub fn shut(&self) {
        let _ = self.0.shutdown(std::net::Shutdown::Both);
    }
}

impl Drop for Detach {
    fn drop(&mut self) {
        self.shut();
    }
}

/// Longest a follow stream waits for the agent to say its reader is in place before it answers
/// its client anyway: an agent that predates the signal (one inside an old template's
/// snapshot) never sends it.
const ATTACH_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Tells a follow stream's handler, once, that the agent's reader is in place (or that the
/// attach ended first), so the handler answers its client only then: output "from now on"
/// then means from the answer on, with nothing printed in between lost.
pub struct Attaching(std::cell::Cell<Option<tokio::sync::oneshot::Sender<()>>>);

impl Attaching {
    /// The signal for the reading thread, and the wait for the handler.
    pub fn new() -> (Attaching, impl Future<Output = ()> + Send) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (Attaching(std::cell::Cell::new(Some(tx))), async move {
            // Err: the attach ended (or failed) before saying so; its stream carries why.
            let _ = tokio::time::timeout(ATTACH_WAIT, rx).await;
        })
    }

    /// The reader is in place (a second call does nothing).
    pub fn done(&self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn sbx() -> SandboxId {
        SandboxId::generate()
    }

    #[test]
    fn a_sandbox_past_its_bound_is_refused_while_another_sandbox_still_gets_places() {
        let s = Streams::default();
        let limit = Kind::Watcher.limit();
        let (one, two) = (sbx(), sbx());
        let held: Vec<Place> =
            (0..limit.per_sandbox).map(|_| s.take(Kind::Watcher, &one, "a").unwrap()).collect();
        let e = s.take(Kind::Watcher, &one, "b").err().expect("a place past the sandbox's bound");
        assert_eq!(e.scope, "in this sandbox");
        let api = ApiError::from(e);
        assert_eq!((api.status, api.code), (StatusCode::TOO_MANY_REQUESTS, "too_many_streams"));
        let other = s.take(Kind::Watcher, &two, "b").expect("another sandbox was refused");
        assert!(s.take(Kind::Follow, &one, "a").is_ok(), "another kind was refused");
        drop((held, other));
        assert_eq!(s.open(Kind::Watcher), 0);
        assert!(s.take(Kind::Watcher, &one, "a").is_ok());
    }

    #[test]
    fn one_token_is_bounded_across_sandboxes_and_the_service_across_tokens() {
        let s = Streams::default();
        let limit = Kind::Terminal.limit();
        let ids: Vec<SandboxId> = (0..limit.total / limit.per_sandbox).map(|_| sbx()).collect();
        let mut held = Vec::new();
        for i in 0..limit.per_token {
            held.push(s.take(Kind::Terminal, &ids[i / limit.per_sandbox], "one").unwrap());
        }
        let e = s.take(Kind::Terminal, &sbx(), "one").err().expect("a place past the token's bound");
        assert_eq!(e.scope, "with this token");
        for i in limit.per_token..limit.total {
            held.push(s.take(Kind::Terminal, &ids[i / limit.per_sandbox], "two").unwrap());
        }
        let e = s.take(Kind::Terminal, &sbx(), "three").err().expect("a place past the service's bound");
        assert_eq!((e.scope, e.max), ("in the service", limit.total));
    }

    #[tokio::test]
    async fn stopping_completes_for_streams_opened_before_and_after_the_stop() {
        let s = Streams::default();
        let before = s.stopping();
        s.stop();
        tokio::time::timeout(std::time::Duration::from_secs(5), before).await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), s.stopping()).await.unwrap();
    }

    #[test]
    fn dropping_a_detacher_returns_a_read_blocked_on_the_connection() {
        let (ours, _agent) = UnixStream::pair().unwrap();
        let detach = Detach(ours.try_clone().unwrap());
        let reader = std::thread::spawn(move || {
            let mut ours = ours;
            ours.read(&mut [0u8; 16]).unwrap()
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        drop(detach);
        assert_eq!(reader.join().unwrap(), 0, "the blocked read did not end at the detach");
    }
}
