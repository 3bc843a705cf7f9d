//! Portable snapshots (docs/remote.md): pushing a snapshot's files to an S3-compatible store
//! as chunks and a manifest (crate `branchbox-chunks`), and pulling one into this data
//! directory under the same id, so that restore and fork work from it here.

use super::Engine;
use branchbox_chunks::manifest::Fingerprint;
use branchbox_chunks::peer::ChunkSource;
use branchbox_chunks::s3::Remote;
use branchbox_chunks::{LocalChunks, Progress, PullReport, PushReport};
use branchbox_model::{BackendKind, Error, Result, Snapshot, SnapshotId};
use std::ops::ControlFlow;

/// runsc's platform as the gvisor backend starts it (`--platform=ptrace`, crates/gvisor/src/runsc.rs).
const GVISOR_PLATFORM: &str = "ptrace";

fn chunk_error(e: branchbox_chunks::Error) -> Error {
    use branchbox_chunks::Error as C;
    match e {
        C::NotFound(id) => Error::not_found("snapshot", id, "it was never pushed to this remote"),
        C::Io { path, err } => Error::io(path, err),
        C::Remote(m) => Error::Unavailable(m),
        e @ (C::Invalid(_) | C::Corrupt { .. } | C::Missing { .. } | C::Unauthentic { .. }) => {
            Error::Backend(e.to_string())
        }
        e @ C::Stopped(_) => Error::Conflict(e.to_string()),
    }
}

/// The first line of /proc/cpuinfo that starts with `key`, after its colon.
fn cpuinfo(key: &str) -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = text.lines().find(|l| l.split(':').next().is_some_and(|k| k.trim() == key))?;
    Some(line.split_once(':')?.1.trim().to_string())
}

impl Engine {
    /// What a snapshot of `backend` taken on this host needs of the host that restores it.
    pub fn fingerprint(&self, backend: BackendKind) -> Result<Fingerprint> {
        let none = Fingerprint {
            backend,
            runsc: None,
            platform: None,
            cpu_model: None,
            cpu_flags: None,
            kernel: None,
        };
        Ok(match backend {
            BackendKind::Gvisor => Fingerprint {
                runsc: Some(self.gvisor.check()?),
                platform: Some(GVISOR_PLATFORM.into()),
                ..none
            },
            BackendKind::Microvm => {
                let mut flags: Vec<String> =
                    cpuinfo("flags").unwrap_or_default().split_whitespace().map(str::to_string).collect();
                flags.sort();
                Fingerprint {
                    cpu_model: cpuinfo("model name"),
                    cpu_flags: Some(flags.join(" ")),
                    kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                        .ok()
                        .map(|s| s.trim().to_string()),
                    ..none
                }
            }
        })
    }

    /// Pushes a snapshot (id, name or ref) to `remote`: only the chunks it lacks, then the
    /// manifest. `progress` may stop it (no manifest is written then).
    pub fn push_snapshot(
        &self,
        remote: &Remote,
        id_or_name: &str,
        progress: &mut dyn FnMut(Progress) -> ControlFlow<()>,
    ) -> Result<PushReport> {
        // Held so that a local gc does not delete the snapshot's files while they are read.
        let _busy = self.in_progress()?;
        let snap = self.usable_snapshot(id_or_name)?;
        let fingerprint = self.fingerprint(snap.backend)?;
        branchbox_chunks::push(remote, &self.snapshot_dir(&snap.id), &snap, fingerprint, progress)
            .map_err(chunk_error)
    }

    /// Pulls snapshot `id` from `remote` into this data directory and records it under the
    /// same id. Every chunk is checked against its hash; the files are written into a `tmp-`
    /// directory, renamed into place, and only then recorded. A snapshot whose fingerprint
    /// differs from this host's is refused. One already here is not pulled again. With `peer`,
    /// each chunk is asked of it before the store (docs/remote.md, "Pull from a peer").
    pub fn pull_snapshot(
        &self,
        remote: &Remote,
        id: &str,
        peer: Option<&dyn ChunkSource>,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<PullReport> {
        let started = std::time::Instant::now();
        let id = SnapshotId::parse(id)?;
        let _busy = self.in_progress()?;
        let manifest = branchbox_chunks::fetch_manifest(remote, &id).map_err(chunk_error)?;
        if let Ok(here) = self.store.snapshot(id.as_str()) {
            if here.id == id && here.deleted_ms.is_none() {
                return Ok(PullReport {
                    snapshot: id.to_string(),
                    chunks: manifest.chunk_count(),
                    fetched_bytes: 0,
                    reused_bytes: manifest.total_bytes(),
                    peer_bytes: 0,
                    s3_bytes: 0,
                    peer_error: None,
                    seconds: started.elapsed().as_secs_f64(),
                });
            }
            if here.id == id {
                return Err(Error::Conflict(format!(
                    "snapshot {id} was deleted here (its place in the lineage remains); it cannot be pulled back"
                )));
            }
        }
        let host = self.fingerprint(manifest.snapshot.backend)?;
        let differences = manifest.fingerprint.differences(&host);
        if !differences.is_empty() {
            return Err(Error::Conflict(format!(
                "snapshot {id} cannot be restored on this host, so it is not pulled: it was taken with {}",
                differences.join("; ")
            )));
        }
        let snapshots = self.cfg.data_dir.join("snapshots");
        let tmp = snapshots.join(format!("tmp-pull-{id}-{:08x}", rand::random::<u32>()));
        let local = LocalChunks::scan(&snapshots);
        let report = branchbox_chunks::materialize_from(remote, peer, &manifest, &tmp, &local, progress)
            .map_err(chunk_error)?;
        let dir = self.snapshot_dir(&id);
        if let Err(e) = std::fs::rename(&tmp, &dir) {
            let _ = std::fs::remove_dir_all(&tmp);
            // Another pull of the same snapshot got there first: its record follows its rename.
            if dir.is_dir() {
                for _ in 0..100 {
                    if self.store.snapshot(id.as_str()).is_ok_and(|s| s.id == id) {
                        return Ok(PullReport { seconds: started.elapsed().as_secs_f64(), ..report });
                    }
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
            }
            return Err(Error::io(&dir, e));
        }
        let theirs = manifest.snapshot;
        // Lineage edges only to what exists here; a name only when free here.
        let parent = theirs.parent.filter(|p| self.store.snapshot(p.as_str()).is_ok_and(|s| s.id == *p));
        let name = match theirs.name {
            Some(n) if !self.store.snapshot_name_taken(&n)? => Some(n),
            _ => None,
        };
        let record = Snapshot {
            parent,
            source: None,
            name,
            size_bytes: report.fetched_bytes + report.reused_bytes,
            expires_ms: None,
            deleted_ms: None,
            ..theirs
        };
        if let Err(e) = self.store.insert_snapshot(&record) {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        Ok(PullReport { seconds: started.elapsed().as_secs_f64(), ..report })
    }
}
