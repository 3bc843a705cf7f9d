//! Leases: a push, pull or gc writes `leases/<random>.json` (what it is, when it expires)
//! before it touches chunks, renews it while it runs and deletes it when done.
//!
//! A push or pull that finds a live gc lease after writing its own waits for the gc to end;
//! a gc that finds a live push or pull lease after writing its own deletes nothing. With a
//! store whose listings are consistent after a write (S3 and SeaweedFS are), one of any two
//! that start together sees the other, so a gc never sweeps while a push or pull runs: not the
//! unreferenced chunks a push has uploaded before its manifest, nor ones it skipped because
//! they were there, nor the chunks a pull reads. A lease left by a process that died expires
//! (its holder renews it every [`RENEW`]; it lasts [`TTL`]) and the next gc deletes it.

use crate::s3::Remote;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a lease lasts unless renewed.
pub const TTL: Duration = Duration::from_secs(10 * 60);
/// How often a holder renews its lease.
pub const RENEW: Duration = Duration::from_secs(60);
/// How long a push or pull waits for a running gc.
const WAIT_FOR_GC: Duration = Duration::from_secs(120);
/// Most bytes of a lease object read.
const MAX_LEASE_BYTES: u64 = 64 << 10;

/// What holds a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseKind {
    /// A push.
    Push,
    /// A pull.
    Pull,
    /// A bucket gc.
    Gc,
}

/// A lease object's content.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseRecord {
    /// What holds it.
    pub kind: LeaseKind,
    /// The snapshot pushed or pulled, if any.
    #[serde(default)]
    pub snapshot: Option<String>,
    /// When it lapses, milliseconds since the Unix epoch.
    pub expires_ms: i64,
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// A lease read from the store: its key and its record, or `None` when unreadable (which
/// counts as live: nothing is known about what it protects).
pub(crate) struct Seen {
    pub key: String,
    pub record: Option<LeaseRecord>,
}

impl Seen {
    pub fn live(&self) -> bool {
        self.record.as_ref().is_none_or(|r| r.expires_ms > now_ms())
    }
    pub fn is_gc(&self) -> bool {
        self.record.as_ref().is_some_and(|r| r.kind == LeaseKind::Gc)
    }
}

/// Every lease in the store.
pub(crate) fn list(remote: &Remote) -> Result<Vec<Seen>> {
    let mut out = Vec::new();
    for l in remote.list("leases/")? {
        let record = match remote.get(&l.key, MAX_LEASE_BYTES) {
            Ok(Some(bytes)) => serde_json::from_slice(&bytes).ok(),
            // Deleted since the listing: ended.
            Ok(None) => continue,
            Err(e) => return Err(e),
        };
        out.push(Seen { key: l.key, record });
    }
    Ok(out)
}

/// A held lease; deleted on drop.
pub struct Lease<'a> {
    remote: &'a Remote,
    key: String,
    record: LeaseRecord,
    renewed: Instant,
}

impl<'a> Lease<'a> {
    fn write(remote: &'a Remote, kind: LeaseKind, snapshot: Option<String>) -> Result<Lease<'a>> {
        let key = format!("leases/{:016x}{:016x}.json", rand::random::<u64>(), rand::random::<u64>());
        let record = LeaseRecord { kind, snapshot, expires_ms: now_ms() + TTL.as_millis() as i64 };
        let lease = Lease { remote, key, record, renewed: Instant::now() };
        lease.put()?;
        Ok(lease)
    }

    fn put(&self) -> Result<()> {
        let body = serde_json::to_vec(&self.record).map_err(|e| Error::Invalid(e.to_string()))?;
        self.remote.put(&self.key, &body)
    }

    /// Takes a lease for a push or pull, waiting for a running gc to end.
    pub fn take(remote: &'a Remote, kind: LeaseKind, snapshot: &str) -> Result<Lease<'a>> {
        let lease = Lease::write(remote, kind, Some(snapshot.to_string()))?;
        let started = Instant::now();
        loop {
            let gcs = list(remote)?.into_iter().filter(|s| s.is_gc() && s.live()).count();
            if gcs == 0 {
                return Ok(lease);
            }
            if started.elapsed() > WAIT_FOR_GC {
                return Err(Error::Remote(format!(
                    "a `branchbox remote gc` of {} is running (a live gc lease under leases/); try again when it ends",
                    remote.url()
                )));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Takes a gc lease; `Ok(Err(n))` when `n` other live leases (push, pull or gc) exist, in
    /// which case the gc must not sweep (the lease is dropped again).
    pub fn take_gc(remote: &'a Remote) -> Result<std::result::Result<Lease<'a>, usize>> {
        let lease = Lease::write(remote, LeaseKind::Gc, None)?;
        let others = list(remote)?.into_iter().filter(|s| s.key != lease.key && s.live()).count();
        Ok(if others == 0 { Ok(lease) } else { Err(others) })
    }

    /// Renews the lease when [`RENEW`] has passed since it was last written.
    pub fn renew_if_due(&mut self) -> Result<()> {
        if self.renewed.elapsed() >= RENEW {
            self.record.expires_ms = now_ms() + TTL.as_millis() as i64;
            self.put()?;
            self.renewed = Instant::now();
        }
        Ok(())
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        // Best effort: one left behind expires.
        let _ = self.remote.delete(&self.key);
    }
}
