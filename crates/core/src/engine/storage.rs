//! What the engine keeps beyond live sandboxes: deleting snapshots (with the lineage rules),
//! refs, file manifests and single files for diffs, the lineage tree, and the lookups gc needs.

use super::Engine;
use branchbox_image::Recipe;
use branchbox_model::{now_ms, AgentConn, Error, Name, Result, Sandbox, SandboxId, Snapshot, SnapshotId};
use branchbox_protocol::{ClientError, ErrorCode, FileKind};
use std::path::PathBuf;

/// What one path holds in a snapshot ([`Engine::snapshot_file`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileAt {
    /// Nothing at that path.
    Absent,
    /// A directory, link or special file.
    NotRegular(FileKind),
    /// A regular file over the size asked for; its size.
    TooLarge(u64),
    /// A regular file's contents.
    Bytes(Vec<u8>),
}

impl Engine {
    /// Deletes a snapshot's data. Refused when other snapshots descend from it, unless
    /// `cascade` (which deletes them first). The row stays as a tombstone while sandboxes or
    /// snapshots still name it as their parent, so the lineage keeps its shape.
    pub fn delete_snapshot(&self, id_or_name: &str, cascade: bool) -> Result<Vec<SnapshotId>> {
        let snap = self.lookup(id_or_name)?;
        let mut deleted = Vec::new();
        self.delete_tree(&snap, cascade, &mut deleted)?;
        Ok(deleted)
    }

    fn delete_tree(&self, snap: &Snapshot, cascade: bool, deleted: &mut Vec<SnapshotId>) -> Result<()> {
        self.check_not_step(&snap.id)?;
        let live: Vec<Snapshot> =
            self.store.child_snapshots(&snap.id)?.into_iter().filter(|c| c.deleted_ms.is_none()).collect();
        if !live.is_empty() && !cascade {
            let ids: Vec<String> = live.iter().map(|c| c.id.to_string()).collect();
            return Err(Error::Conflict(format!(
                "snapshot {} has {} descendant snapshot(s) ({}); delete those first or pass --cascade",
                snap.id,
                ids.len(),
                ids.join(", ")
            )));
        }
        for child in &live {
            self.delete_tree(child, cascade, deleted)?;
        }
        let dir = self.snapshot_dir(&snap.id);
        if self.store.has_dependents(&snap.id)? {
            self.store.tombstone_snapshot(&snap.id, now_ms())?;
        } else {
            self.store.delete_snapshot(&snap.id)?;
        }
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(Error::io(&dir, e)),
            _ => {}
        }
        if snap.deleted_ms.is_none() {
            deleted.push(snap.id.clone());
        }
        Ok(())
    }

    /// Points ref `name` at a snapshot (moving it if it exists).
    pub fn set_ref(&self, name: &str, snapshot: &str) -> Result<Snapshot> {
        let name = Name::parse("ref name", name)?;
        let snap = self.usable_snapshot(snapshot)?;
        self.store.set_ref(name.as_str(), &snap.id, now_ms())?;
        Ok(snap)
    }

    /// Every ref as (name, snapshot id).
    pub fn refs(&self) -> Result<Vec<(String, String)>> {
        self.store.refs()
    }

    /// Removes a ref. Any existing name is accepted, so refs made before the naming rule can
    /// still be removed.
    pub fn delete_ref(&self, name: &str) -> Result<()> {
        if self.store.delete_ref(name)? {
            Ok(())
        } else {
            Err(Error::not_found("ref", name, "`branchbox ref ls` lists refs"))
        }
    }

    /// Every sandbox record (no liveness probe).
    pub fn sandbox_records(&self) -> Result<Vec<Sandbox>> {
        self.store.sandboxes()
    }

    /// The data directory of a snapshot.
    pub fn snapshot_path(&self, id: &SnapshotId) -> PathBuf {
        self.snapshot_dir(id)
    }

    /// The ids the built-in images have with the current agent, without building them.
    pub fn current_image_ids(&self) -> Result<Vec<String>> {
        branchbox_image::BUILTIN_IMAGES
            .iter()
            .filter_map(|name| Recipe::named(name))
            .map(|recipe| branchbox_image::image_id(&recipe, &self.cfg.agent))
            .collect()
    }

    /// The file listing of a snapshot: read from `manifest.json` beside its data, or made once
    /// by starting the snapshot headless (unrecorded) and walking its tree.
    pub fn manifest(&self, snap: &Snapshot) -> Result<Vec<branchbox_protocol::FileStat>> {
        let dir = self.snapshot_dir(&snap.id);
        let path = dir.join("manifest.json");
        if let Ok(bytes) = std::fs::read(&path) {
            if let Ok(entries) = serde_json::from_slice(&bytes) {
                return Ok(entries);
            }
        }
        let entries = self.headless(snap, |conn| {
            let exclude: Vec<String> = crate::diff::NOT_WALKED.iter().map(|s| s.to_string()).collect();
            conn.walk("/", &exclude).map_err(|e| Error::Backend(e.to_string()))
        })?;
        let tmp = dir.join("manifest.json.tmp");
        let text = serde_json::to_vec(&entries).map_err(|e| Error::Backend(e.to_string()))?;
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|e| Error::io(&path, e))?;
        Ok(entries)
    }

    /// What `path` holds in a snapshot, its contents read when it is a regular file of at most
    /// `max` bytes. The listing ([`Engine::manifest`]) answers the rest without starting the
    /// snapshot; reading a file starts it headless once.
    pub fn snapshot_file(&self, snap: &Snapshot, path: &str, max: u64) -> Result<FileAt> {
        branchbox_protocol::limits::check_guest_path(path).map_err(Error::InvalidInput)?;
        let Some(stat) = self.manifest(snap)?.into_iter().find(|e| e.name == path) else {
            return Ok(FileAt::Absent);
        };
        if stat.kind != FileKind::File {
            return Ok(FileAt::NotRegular(stat.kind));
        }
        if stat.size > max {
            return Ok(FileAt::TooLarge(stat.size));
        }
        self.headless(snap, |conn| match conn.read_file_bytes(path, max) {
            Ok(bytes) => Ok(FileAt::Bytes(bytes)),
            Err(ClientError::Agent { code: ErrorCode::NotFound, .. }) => Ok(FileAt::Absent),
            Err(e) => Err(Error::Backend(format!("reading {path} from snapshot {}: {e}", snap.id))),
        })
    }

    /// Starts a snapshot headless (unrecorded, under a fresh id), runs `f` on its agent and
    /// destroys it again, whatever `f` returned. Holds the data directory like any operation
    /// in progress, so gc never takes the headless sandbox for a stray one.
    fn headless<T>(&self, snap: &Snapshot, f: impl FnOnce(&mut AgentConn) -> Result<T>) -> Result<T> {
        let _busy = self.in_progress()?;
        if snap.deleted_ms.is_some() {
            return Err(Error::Conflict(format!("snapshot {} was deleted; its files are gone", snap.id)));
        }
        let backend = self.backend(snap.backend)?;
        let plan = self.plan(SandboxId::generate(), self.image_rootfs(&snap.image)?, snap.limits);
        let out = backend
            .restore(&self.snapshot_dir(&snap.id), &plan)
            .and_then(|_| f(&mut backend.connect(&plan.dir)?));
        let _ = backend.destroy(&plan.id, &plan.dir);
        out
    }

    /// The lineage forest of every snapshot and sandbox.
    pub fn lineage(&self) -> Result<Vec<crate::lineage::Node>> {
        Ok(crate::lineage::build(self.store.snapshots()?, self.store.sandboxes()?, self.store.refs()?))
    }

    /// The runtime directory of a sandbox.
    pub fn sandbox_path(&self, id: &SandboxId) -> PathBuf {
        self.sandbox_dir(id)
    }
}
