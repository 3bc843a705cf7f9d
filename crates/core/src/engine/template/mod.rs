//! Templates in the engine: their records, sandboxes made from them, and the release of cached
//! steps no template refers to any more. Building is in `build.rs`; the exec defaults those
//! sandboxes carry, and their passing along the lineage, in `defaults.rs`.
//!
//! A template's record lists, for its last build, the chain key and snapshot of every step,
//! and separately the last build that succeeded (what `create --template` starts). Cached
//! steps live in the store's `template_steps` table (chain key to snapshot); a snapshot there
//! is refused to `rmsnap` and never collected by `gc` (it is of kind `snapshot`, which gc
//! leaves alone); `template rm` and rebuilds release the keys no record names.

use super::{Engine, Started};
use branchbox_model::{Error, Name, Result, SnapshotId};
use branchbox_template::{ExecDefaults, TemplateSpec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::PathBuf;

mod build;
mod defaults;
mod locks;

pub use build::BuildEvent;

/// One step of a build, as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// The step in one line.
    pub step: String,
    /// Its chain key.
    pub key: String,
    /// The snapshot of the sandbox after it (none when the build stopped before it).
    pub snapshot: Option<SnapshotId>,
    /// True when it came from the cache.
    pub cached: bool,
}

/// How the last build ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum TemplateStatus {
    /// Every step ran (or was cached).
    Ready,
    /// Step `step` (1-based) failed; earlier steps' results stay cached.
    Failed {
        /// Which step.
        step: usize,
        /// Its exit code, when it ran a command that exited.
        exit_code: Option<i32>,
        /// What went wrong.
        message: String,
    },
}

/// What a successful build made: where sandboxes of the template start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Built {
    /// The snapshot after the last step.
    pub snapshot: SnapshotId,
    /// The chain key of that snapshot (a template built on this one starts from it).
    pub key: String,
    /// Every chain key the build used (kept cached while this is the last good build).
    pub keys: Vec<String>,
    /// Env, workdir and user for commands in its sandboxes.
    pub defaults: ExecDefaults,
    /// When it finished, ms since the epoch.
    pub built_ms: i64,
}

/// A template and its last build.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Template {
    /// Its definition.
    pub spec: TemplateSpec,
    /// Where uploads were read from.
    pub context: Option<PathBuf>,
    /// The chain key of the base.
    pub base_key: String,
    /// The base's snapshot (the start of step 1).
    pub base_snapshot: Option<SnapshotId>,
    /// The last build, step by step.
    pub steps: Vec<StepRecord>,
    /// How the last build ended.
    pub status: TemplateStatus,
    /// The last successful build, when there was one.
    pub built: Option<Built>,
    /// How long the last build took, ms.
    pub build_ms: u64,
}

impl Template {
    /// Every chain key this record keeps cached.
    fn keys(&self) -> impl Iterator<Item = &str> {
        let done = self.steps.iter().filter(|s| s.snapshot.is_some()).map(|s| s.key.as_str());
        let good = self.built.iter().flat_map(|b| b.keys.iter().map(String::as_str));
        std::iter::once(self.base_key.as_str()).chain(done).chain(good)
    }
}

fn to_json<T: Serialize>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|e| Error::Store(format!("encoding a template record: {e}")))
}

impl Engine {
    fn template_dir(&self) -> PathBuf {
        self.cfg.data_dir.join("templates")
    }

    /// The log of a template's last build.
    pub fn template_log_path(&self, name: &str) -> Result<PathBuf> {
        let name = Name::parse("template name", name)?;
        Ok(self.template_dir().join(format!("{name}.log")))
    }

    /// A template by name.
    pub fn template(&self, name: &str) -> Result<Template> {
        Name::parse("template name", name)?;
        let text = self
            .store
            .template(name)?
            .ok_or_else(|| Error::not_found("template", name, "`branchbox template ls` lists templates"))?;
        serde_json::from_str(&text).map_err(|e| Error::Store(format!("template {name}'s record: {e}")))
    }

    /// Every template.
    pub fn templates(&self) -> Result<Vec<Template>> {
        self.store
            .templates()?
            .into_iter()
            .map(|(name, text)| {
                serde_json::from_str(&text)
                    .map_err(|e| Error::Store(format!("template {name}'s record: {e}")))
            })
            .collect()
    }

    fn put_template(&self, t: &Template) -> Result<()> {
        self.store.put_template(&t.spec.name, &to_json(t)?, branchbox_model::now_ms())
    }

    /// Removes a template and releases its cached steps (snapshots that other templates still
    /// use stay). Returns the snapshots deleted.
    pub fn delete_template(&self, name: &str) -> Result<Vec<SnapshotId>> {
        let _busy = self.in_progress()?;
        let _only = locks::BuildLock::take(&self.template_dir(), name)?;
        self.template(name)?;
        self.store.delete_template(name)?;
        let log = self.template_log_path(name)?;
        let _ = std::fs::remove_file(log);
        self.release_steps()
    }

    /// Drops cached steps that no template record names, and deletes their snapshots unless a
    /// step that stays cached uses the same one. A snapshot that user snapshots descend from
    /// stays as an ordinary snapshot.
    ///
    /// While another build runs, nothing is released: its steps are cached before its record
    /// names them, and a concurrent `template rm` deleted them so (CI, two image tests at once).
    /// What is left is released by the next build's end or `template rm` with none running.
    fn release_steps(&self) -> Result<Vec<SnapshotId>> {
        let Some(_alone) = locks::steps_lock(&self.template_dir(), libc::LOCK_EX | libc::LOCK_NB)? else {
            return Ok(Vec::new());
        };
        let records = self.templates()?;
        let keep: BTreeSet<&str> = records.iter().flat_map(Template::keys).collect();
        let mut candidates = BTreeSet::new();
        for (key, snap) in self.store.steps()? {
            if !keep.contains(key.as_str()) {
                self.store.delete_step(&key)?;
                candidates.insert(snap);
            }
        }
        let mut deleted = Vec::new();
        // Children before parents: a pass deletes what has no live children left.
        loop {
            let mut progress = false;
            for snap in candidates.clone() {
                if self.store.is_step_snapshot(&snap)? {
                    candidates.remove(&snap);
                    continue;
                }
                match self.delete_snapshot(&snap, false) {
                    Ok(ids) => {
                        deleted.extend(ids);
                        candidates.remove(&snap);
                        progress = true;
                    }
                    Err(Error::NotFound { .. }) => {
                        candidates.remove(&snap);
                        progress = true;
                    }
                    Err(Error::Conflict(_)) => {}
                    Err(e) => return Err(e),
                }
            }
            if !progress || candidates.is_empty() {
                return Ok(deleted);
            }
        }
    }

    /// Starts a sandbox from a template's last successful build; its commands get the
    /// template's env, workdir and user.
    pub fn create_from_template(&self, name: &str) -> Result<Started> {
        let t = self.template(name)?;
        let built = t.built.ok_or_else(|| {
            Error::Conflict(format!(
                "template {name} has no successful build; see `branchbox template log {name}`, fix the step and build again"
            ))
        })?;
        let started = self.restore(built.snapshot.as_str())?;
        self.set_exec_defaults(&started.sandbox.id, &built.defaults)?;
        Ok(started)
    }

    /// Refuses to delete a snapshot a template's cache holds.
    pub(super) fn check_not_step(&self, snapshot: &SnapshotId) -> Result<()> {
        if self.store.is_step_snapshot(snapshot.as_str())? {
            let users: Vec<String> = self
                .templates()?
                .into_iter()
                .filter(|t| {
                    t.steps.iter().any(|s| s.snapshot.as_ref() == Some(snapshot))
                        || t.base_snapshot.as_ref() == Some(snapshot)
                        || t.built.as_ref().is_some_and(|b| &b.snapshot == snapshot)
                })
                .map(|t| t.spec.name)
                .collect();
            return Err(Error::Conflict(format!(
                "snapshot {snapshot} is a cached step of template(s) {}; `branchbox template rm NAME` releases it",
                if users.is_empty() { "(an earlier build)".to_string() } else { users.join(", ") }
            )));
        }
        Ok(())
    }
}
