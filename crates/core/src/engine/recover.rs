//! Reconciliation: after a crash (a CLI or branchboxd killed in the middle of a fork, say) the
//! runtime and the records disagree. This matches them up again:
//!
//! - a sandbox directory without a record is *adopted* (with its fork point's exec defaults,
//!   as a recorded child gets them) when it is a complete child of a
//!   recorded (or provably complete) snapshot, and *reaped* (every process stopped, its
//!   directory removed) otherwise;
//! - a record whose runtime is gone is marked lost, with the reason the shim left in
//!   `ended.json` (`memory_limit`, `process_limit`, `agent_exited`, `rollback_failed`) or
//!   "runtime gone".
//!
//! A child is complete when the engine wrote its intent (`intent.json`: the record of the
//! snapshot it starts from) before starting it, that snapshot is recorded or its data is on
//! disk, and the child's agent answers as the child itself: the agent learns its sandbox id
//! only from the after-fork hook, which runs after the whole image was restored. A child that
//! was restored but never thawed answers with the source's id (or not at all) and is reaped.
//!
//! It runs only under the data directory's exclusive lock, taken without waiting: operations
//! in progress hold the lock shared until their sandboxes are recorded, so their work is never
//! mistaken for a crash's leftovers, and a reconciliation never waits behind a long fork.
//! Every reconciliation that changed something appends one JSON line to `<data>/audit.log`.

use super::records::{append_audit, end_reason, read_intent};
use super::{DataLock, Engine};
use branchbox_model::{now_ms, Backend, Error, Result, SandboxId, SandboxState, Snapshot, SnapshotId};
use serde::Serialize;
use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

/// Longest wait for an orphan's agent to say who it is.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// A sandbox found without its runtime.
#[derive(Debug, Clone, Serialize)]
pub struct LostSandbox {
    /// Its id.
    pub id: SandboxId,
    /// Why (`memory_limit: ...`, `runtime gone`).
    pub reason: String,
}

/// What a reconciliation did.
#[derive(Debug, Default, Serialize)]
pub struct ReconcileReport {
    /// Another operation held the data directory, so nothing was checked this time.
    pub skipped: bool,
    /// Unrecorded complete children, now recorded.
    pub adopted: Vec<SandboxId>,
    /// Fork points recorded because a child of theirs was adopted.
    pub recorded_fork_points: Vec<SnapshotId>,
    /// Sandbox directories without a record whose processes were stopped and files removed.
    pub reaped: Vec<String>,
    /// Records whose runtime is gone, now marked lost.
    pub lost: Vec<LostSandbox>,
}

impl ReconcileReport {
    /// True when nothing was changed.
    pub fn is_empty(&self) -> bool {
        self.adopted.is_empty() && self.reaped.is_empty() && self.lost.is_empty()
    }

    /// One line for people.
    pub fn summary(&self) -> String {
        format!(
            "adopted {} unrecorded sandbox(es) ({} fork point(s) recorded), reaped {}, marked {} lost",
            self.adopted.len(),
            self.recorded_fork_points.len(),
            self.reaped.len(),
            self.lost.len()
        )
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

impl Engine {
    /// Matches runtime to records (see the module docs); does nothing, and says so, while
    /// another operation holds the data directory.
    pub fn reconcile(&self) -> Result<ReconcileReport> {
        match DataLock::try_exclusive(&self.cfg.data_dir)? {
            None => Ok(ReconcileReport { skipped: true, ..ReconcileReport::default() }),
            Some(lock) => self.reconcile_held(&lock),
        }
    }

    /// [`Engine::reconcile`] for a caller that holds the exclusive lock already (gc).
    pub fn reconcile_held(&self, _exclusive: &DataLock) -> Result<ReconcileReport> {
        let mut r = ReconcileReport::default();
        let sandboxes = self.store.sandboxes()?;
        let recorded: BTreeSet<String> = sandboxes.iter().map(|s| s.id.to_string()).collect();
        // Shells that died, never came up or outlived every sandbox of their kind go first;
        // the rest are not debris.
        self.end_unneeded_shells(&sandboxes);
        let shells = self.shell_ids();
        for name in names(&self.cfg.data_dir.join("sandboxes")) {
            if recorded.contains(&name) || shells.contains(&name) {
                continue;
            }
            match SandboxId::parse(&name) {
                Ok(id) if self.adopt(&id, &mut r)? => r.adopted.push(id),
                Ok(id) => {
                    self.reap(&id)?;
                    r.reaped.push(name);
                }
                Err(_) => {
                    let p = self.cfg.data_dir.join("sandboxes").join(&name);
                    std::fs::remove_dir_all(&p).map_err(|e| Error::io(&p, e))?;
                    r.reaped.push(name);
                }
            }
        }
        for s in self.store.sandboxes()? {
            let dir = self.sandbox_dir(&s.id);
            let alive = || self.backend(s.backend).map(|b| b.is_alive(&dir)).unwrap_or(false);
            // Asked twice, a moment apart: "lost" is recorded, so one refused connection (a
            // shim busy swapping containers) must not be enough.
            if s.state != SandboxState::Lost && !alive() && {
                std::thread::sleep(Duration::from_millis(50));
                !alive()
            } {
                let reason = end_reason(&dir);
                self.store.mark_lost(&s.id, &reason, now_ms())?;
                r.lost.push(LostSandbox { id: s.id, reason });
            }
        }
        if !r.is_empty() {
            self.audit("reconcile", &r);
        }
        Ok(r)
    }

    /// Records the unrecorded sandbox `id` when it is a complete child (see the module docs).
    fn adopt(&self, id: &SandboxId, r: &mut ReconcileReport) -> Result<bool> {
        let dir = self.sandbox_dir(id);
        let Some(snap) = read_intent(&dir) else {
            return Ok(false);
        };
        let recorded = match self.store.snapshot(snap.id.as_str()) {
            Ok(s) if s.deleted_ms.is_some() => return Ok(false),
            Ok(s) => Some(s),
            Err(Error::NotFound { .. }) => None,
            Err(e) => return Err(e),
        };
        let data = self.snapshot_dir(&snap.id);
        if (recorded.is_none() && !data.is_dir()) || !self.answers_as(&dir, id) {
            return Ok(false);
        }
        let snap = match recorded {
            Some(s) => s,
            None => {
                // The child restored from this image and thawed, so the image was complete.
                let snap = Snapshot { size_bytes: crate::gc::dir_bytes(&data), ..snap };
                self.store.insert_snapshot(&snap)?;
                if let Some(src) = &snap.source {
                    if self.store.sandbox(src).is_ok_and(|s| s.parent_snapshot == snap.parent) {
                        self.store.set_parent(src, &snap.id)?;
                    }
                    self.defaults_to_snapshot(src, &snap.id)?;
                }
                r.recorded_fork_points.push(snap.id.clone());
                snap
            }
        };
        self.record_child(id.clone(), &snap)?;
        Ok(true)
    }

    /// True when the agent in `dir` answers, within [`PROBE_TIMEOUT`], as sandbox `id`.
    fn answers_as(&self, dir: &Path, id: &SandboxId) -> bool {
        let Ok(mut conn) = self.gvisor.connect(dir) else { return false };
        // A child restored but never thawed holds its answers.
        conn.set_wait(Some(PROBE_TIMEOUT));
        if conn.stream_mut().set_write_timeout(Some(PROBE_TIMEOUT)).is_err() {
            return false;
        }
        conn.info().is_ok_and(|i| i.sandbox_id == id.as_str())
    }

    /// Stops every process an unrecorded sandbox has and removes its directory
    /// ([`GvisorBackend::reap`](branchbox_gvisor::GvisorBackend::reap)).
    pub(crate) fn reap(&self, id: &SandboxId) -> Result<()> {
        self.gvisor.reap(id, &self.sandbox_dir(id))
    }

    /// Appends one JSON line to `<data>/audit.log`. The audit is a record, not a precondition:
    /// a failure to write it is reported on stderr and the work stands.
    pub(crate) fn audit(&self, action: &str, what: &impl Serialize) {
        append_audit(&self.cfg.data_dir.join("audit.log"), action, what);
    }
}
