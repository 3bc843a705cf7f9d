//! The addresses a sandbox's resolver learned for its allow-list's host names, on their way
//! into the router's `resolved` set: batched, so a flood of answers costs one `nft` per
//! [`BATCH_INTERVAL`] instead of one per answer (each `nft` is a process and a netlink
//! transaction, and a guest asking as fast as it can kept a host core busy with them), and
//! bounded, so no upstream that answers hundreds of addresses per name grows the set without
//! end: past [`MAX_LEARNED`] live addresses an answer that would add more is refused.
//!
//! An answer's addresses are counted against the bound the moment they are taken, and the
//! answer waits until the batch that carries them is in the set: the guest never sees an
//! address it cannot reach yet. An answer whose addresses are all in the set already goes at
//! once (they are sent again with the next batch, for their new lifetime).

use crate::Result;
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Most addresses one sandbox's `resolved` set holds at once (the router's set is declared
/// with the same size, the kernel's own backstop).
pub const MAX_LEARNED: usize = 4096;
/// The shortest time between two updates of the set: every address learned meanwhile goes in
/// the next one.
pub const BATCH_INTERVAL: Duration = Duration::from_millis(200);
/// How long an answer waits for its batch before it is given up (SERVFAIL).
const BATCH_WAIT: Duration = Duration::from_secs(5);

/// Where a batch of learned addresses goes: the router's set in the product
/// ([`crate::NetConfig::allow_resolved`]), a counter in tests.
pub trait Sink: Send + Sync {
    /// Adds every `(address, seconds)` of `batch` to the set, in one update.
    fn add(&self, batch: &[(Ipv4Addr, u32)]) -> Result<()>;
}

/// Why an answer's addresses were not learned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// They would take the set past [`MAX_LEARNED`].
    #[error(
        "its {new} new addresses would take the sandbox's learned addresses past the bound of {bound} ({held} held); refused"
    )]
    Full {
        /// Addresses of the answer not held yet.
        new: usize,
        /// Addresses held now.
        held: usize,
        /// The bound.
        bound: usize,
    },
    /// The set could not be updated, or not in time.
    #[error("the router's set was not updated: {0}")]
    Failed(String),
}

/// One update of the set, and what came of it.
struct Batch {
    outcome: Mutex<Option<std::result::Result<(), String>>>,
    done: Condvar,
}

impl Batch {
    fn new() -> Arc<Batch> {
        Arc::new(Batch { outcome: Mutex::new(None), done: Condvar::new() })
    }

    fn finish(&self, outcome: std::result::Result<(), String>) {
        *lock(&self.outcome) = Some(outcome);
        self.done.notify_all();
    }

    fn wait(&self, timeout: Duration) -> std::result::Result<(), Refusal> {
        let deadline = Instant::now() + timeout;
        let mut outcome = lock(&self.outcome);
        loop {
            if let Some(o) = outcome.as_ref() {
                return o.clone().map_err(Refusal::Failed);
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return Err(Refusal::Failed(format!("no update within {}s", timeout.as_secs())));
            };
            outcome = self.done.wait_timeout(outcome, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

struct Entry {
    until: Instant,
    batch: Arc<Batch>,
}

struct State {
    held: HashMap<Ipv4Addr, Entry>,
    pending: HashMap<Ipv4Addr, u32>,
    open: Arc<Batch>,
}

/// One sandbox's learned addresses.
pub struct Learned {
    state: Mutex<State>,
    work: Condvar,
    sink: Box<dyn Sink>,
    bound: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Learned {
    /// Learned addresses going to `sink`, at most `bound` held at once.
    pub fn new(sink: Box<dyn Sink>, bound: usize) -> Learned {
        let state = State { held: HashMap::new(), pending: HashMap::new(), open: Batch::new() };
        Learned { state: Mutex::new(state), work: Condvar::new(), sink, bound }
    }

    /// Lets the guest reach `addrs` for `ttl` seconds; returns once they are in the set, or
    /// refuses all of them: when they would take it past the bound, or the update failed.
    pub fn learn(&self, addrs: &[Ipv4Addr], ttl: u32) -> std::result::Result<(), Refusal> {
        if addrs.is_empty() {
            return Ok(());
        }
        let now = Instant::now();
        let until = now + Duration::from_secs(u64::from(ttl));
        let waits = {
            let mut st = lock(&self.state);
            st.held.retain(|_, e| e.until > now);
            let new = addrs.iter().filter(|a| !st.held.contains_key(a)).count();
            if st.held.len() + new > self.bound {
                return Err(Refusal::Full { new, held: st.held.len(), bound: self.bound });
            }
            // Held addresses go again too, without waiting for it: a policy change flushes the
            // set, and one that leaves the policy as it was does not tell the forwarder.
            let mut waits: Vec<Arc<Batch>> = Vec::new();
            for &a in addrs {
                let open = Arc::clone(&st.open);
                let e = st.held.entry(a).or_insert(Entry { until, batch: open });
                e.until = e.until.max(until);
                if lock(&e.batch.outcome).is_none() && !waits.iter().any(|w| Arc::ptr_eq(w, &e.batch)) {
                    waits.push(Arc::clone(&e.batch));
                }
                let t = st.pending.entry(a).or_insert(ttl);
                *t = (*t).max(ttl);
            }
            waits
        };
        self.work.notify_one();
        waits.iter().try_for_each(|b| b.wait(BATCH_WAIT))
    }

    /// Forgets every address held: the router's set was flushed (a policy change).
    pub fn forget(&self) {
        lock(&self.state).held.retain(|_, e| lock(&e.batch.outcome).is_none());
    }

    /// Sends every address taken since the last flush to the sink in one update, and wakes
    /// the answers waiting for it. Returns the number of addresses sent.
    pub fn flush(&self) -> usize {
        let (batch, items) = {
            let mut st = lock(&self.state);
            if st.pending.is_empty() {
                return 0;
            }
            let batch = std::mem::replace(&mut st.open, Batch::new());
            (batch, std::mem::take(&mut st.pending).into_iter().collect::<Vec<_>>())
        };
        let outcome = self.sink.add(&items).map_err(|e| e.to_string());
        if outcome.is_err() {
            lock(&self.state).held.retain(|_, e| !Arc::ptr_eq(&e.batch, &batch));
        }
        batch.finish(outcome);
        items.len()
    }

    /// Flushes for as long as the process lives: as soon as something is taken, but at most
    /// once per `interval`.
    pub fn run(&self, interval: Duration) {
        let mut last: Option<Instant> = None;
        loop {
            {
                let mut st = lock(&self.state);
                while st.pending.is_empty() {
                    st = self.work.wait(st).unwrap_or_else(|e| e.into_inner());
                }
            }
            if let Some(next) = last.map(|l| l + interval) {
                if let Some(left) = next.checked_duration_since(Instant::now()) {
                    std::thread::sleep(left);
                }
            }
            last = Some(Instant::now());
            self.flush();
        }
    }

    /// Addresses taken and not flushed yet.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        lock(&self.state).pending.len()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A sink that counts its updates and keeps every address it was given.
    #[derive(Default)]
    pub(crate) struct Counting {
        pub(crate) updates: AtomicUsize,
        pub(crate) set: Mutex<std::collections::HashSet<Ipv4Addr>>,
        pub(crate) fail: std::sync::atomic::AtomicBool,
    }

    impl Sink for Arc<Counting> {
        fn add(&self, batch: &[(Ipv4Addr, u32)]) -> Result<()> {
            self.updates.fetch_add(1, Ordering::SeqCst);
            if self.fail.load(Ordering::SeqCst) {
                return Err(crate::Error::Command("nft failed".into()));
            }
            lock(&self.set).extend(batch.iter().map(|(a, _)| *a));
            Ok(())
        }
    }

    fn addrs(from: u32, n: u32) -> Vec<Ipv4Addr> {
        (from..from + n).map(|i| Ipv4Addr::from(u32::from(Ipv4Addr::new(203, 0, 0, 0)) + i)).collect()
    }

    #[test]
    fn every_answer_of_one_interval_goes_into_the_set_in_one_update() {
        let sink = Arc::new(Counting::default());
        let learned = Arc::new(Learned::new(Box::new(Arc::clone(&sink)), MAX_LEARNED));
        let answers: Vec<_> = (0..20u32)
            .map(|i| {
                let learned = Arc::clone(&learned);
                std::thread::spawn(move || learned.learn(&addrs(i * 10, 10), 60))
            })
            .collect();
        while learned.pending() < 200 {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(learned.flush(), 200);
        for a in answers {
            a.join().unwrap().expect("an answer was refused");
        }
        assert_eq!(sink.updates.load(Ordering::SeqCst), 1, "one update per answer, not per interval");
        assert_eq!(lock(&sink.set).len(), 200);
        assert_eq!(learned.flush(), 0, "an update with nothing new was sent");
        assert_eq!(sink.updates.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn past_the_bound_an_answer_is_refused_whole_and_the_set_stays_within_it() {
        let sink = Arc::new(Counting::default());
        let learned = Arc::new(Learned::new(Box::new(Arc::clone(&sink)), 450));
        let runner = Arc::clone(&learned);
        std::thread::spawn(move || runner.run(Duration::from_millis(10)));
        learned.learn(&addrs(0, 200), 60).unwrap();
        learned.learn(&addrs(200, 200), 60).unwrap();
        let e = learned.learn(&addrs(400, 200), 60).unwrap_err();
        assert_eq!(e, Refusal::Full { new: 200, held: 400, bound: 450 });
        assert!(e.to_string().contains("bound of 450"), "{e}");
        learned.learn(&addrs(0, 200), 60).expect("addresses held already take no more room");
        learned.learn(&addrs(350, 100), 60).expect("50 new addresses fit");
        assert_eq!(lock(&sink.set).len(), 450);
        learned.forget();
        learned.learn(&addrs(1000, 200), 60).expect("a flushed set takes addresses again");
    }

    #[test]
    fn a_failed_update_fails_its_answers_and_frees_their_room() {
        let sink = Arc::new(Counting::default());
        sink.fail.store(true, Ordering::SeqCst);
        let learned = Arc::new(Learned::new(Box::new(Arc::clone(&sink)), 100));
        let runner = Arc::clone(&learned);
        std::thread::spawn(move || runner.run(Duration::from_millis(10)));
        assert!(matches!(learned.learn(&addrs(0, 100), 60), Err(Refusal::Failed(_))));
        sink.fail.store(false, Ordering::SeqCst);
        learned.learn(&addrs(0, 100), 60).expect("the failed addresses still held room");
    }
}
