//! The exec defaults (env, workdir, user) of a sandbox made from a template: applied to each
//! of its commands, and passed on along the lineage, sandbox to snapshot and snapshot to the
//! children restored or forked from it. The store keeps them by sandbox or snapshot id.

use super::to_json;
use crate::engine::Engine;
use branchbox_model::{Error, Result, SandboxId, SnapshotId};
use branchbox_protocol::ExecSpec;
use branchbox_template::ExecDefaults;

impl Engine {
    /// The env, workdir and user a sandbox's commands get (from the template it came from).
    pub fn exec_defaults(&self, id: &SandboxId) -> Result<Option<ExecDefaults>> {
        match self.store.exec_defaults(id.as_str())? {
            None => Ok(None),
            Some(text) => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| Error::Store(format!("exec defaults of {id}: {e}"))),
        }
    }

    /// `spec` as a command of sandbox `id` runs it: with its exec defaults applied.
    pub fn with_exec_defaults(&self, id: &SandboxId, mut spec: ExecSpec) -> Result<ExecSpec> {
        if let Some(d) = self.exec_defaults(id)? {
            d.apply(&mut spec);
        }
        Ok(spec)
    }

    /// Gives a sandbox the defaults of the template build or imported image it started from.
    pub(in crate::engine) fn set_exec_defaults(&self, id: &SandboxId, defaults: &ExecDefaults) -> Result<()> {
        if defaults.is_empty() {
            return Ok(());
        }
        self.store.set_exec_defaults(id.as_str(), &to_json(defaults)?)
    }

    /// A snapshot keeps the defaults of the sandbox it was taken of.
    pub(in crate::engine) fn defaults_to_snapshot(&self, from: &SandboxId, to: &SnapshotId) -> Result<()> {
        self.pass_defaults(from.as_str(), to.as_str())
    }

    /// A sandbox restored or forked from a snapshot gets the snapshot's defaults.
    pub(in crate::engine) fn defaults_to_child(&self, from: &SnapshotId, to: &SandboxId) -> Result<()> {
        self.pass_defaults(from.as_str(), to.as_str())
    }

    fn pass_defaults(&self, from: &str, to: &str) -> Result<()> {
        match self.store.exec_defaults(from)? {
            Some(d) => self.store.set_exec_defaults(to, &d),
            None => Ok(()),
        }
    }
}
