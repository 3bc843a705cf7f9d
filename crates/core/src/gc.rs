//! Garbage collection: finds what nothing can reach any more and frees it.

use crate::engine::{Engine, ReconcileReport};
use branchbox_model::{now_ms, Error, Result, SandboxId, Snapshot, SnapshotId, SnapshotKind};
use serde::Serialize;
use std::collections::BTreeSet;
use std::path::Path;

/// What `gc` found (and freed, unless it was a dry run).
#[derive(Debug, Default, Serialize)]
pub struct GcReport {
    /// Nothing was changed.
    pub dry_run: bool,
    /// What the reconciliation run first did (none in a dry run).
    pub reconciled: Option<ReconcileReport>,
    /// Snapshots past their TTL.
    pub expired_snapshots: Vec<SnapshotId>,
    /// Expired snapshots kept because others descend from them.
    pub kept_with_descendants: Vec<SnapshotId>,
    /// Unnamed fork points that no sandbox, ref or live snapshot reaches any more.
    pub unreachable_fork_points: Vec<SnapshotId>,
    /// Snapshot directories with no complete record (an interrupted snapshot).
    pub orphan_snapshot_dirs: Vec<String>,
    /// Sandbox records whose runtime is gone.
    pub lost_sandboxes: Vec<SandboxId>,
    /// Sandbox directories with no record.
    pub orphan_sandbox_dirs: Vec<String>,
    /// Images no sandbox or snapshot uses (only when the image cache is this data directory's own).
    pub unused_images: Vec<String>,
    /// Cached Linux root disks (`<images>/disk/<hash>`) of images no sandbox or snapshot uses
    /// (same rule as images).
    pub unused_disks: Vec<String>,
    /// Sandbox networks on this host whose sandbox directory is gone, in any data directory
    /// (`branchbox_net::NetConfig::sweep`): their namespaces, links and uplink slots.
    pub orphan_networks: Vec<String>,
    /// Restore shells ended (every one outside a dry run: they are a cache that the next
    /// fork starts again, and an image they hold may be collected).
    pub ended_shells: Vec<SandboxId>,
    /// Bytes freed (or that would be freed).
    pub freed_bytes: u64,
}

/// Bytes under `p`.
pub(crate) fn dir_bytes(p: &Path) -> u64 {
    let Ok(md) = p.symlink_metadata() else { return 0 };
    if !md.is_dir() {
        return md.len();
    }
    std::fs::read_dir(p).map(|rd| rd.flatten().map(|e| dir_bytes(&e.path())).sum()).unwrap_or(0)
}

fn names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

fn remove(p: &Path) -> Result<()> {
    match std::fs::remove_dir_all(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(p, e)),
        _ => Ok(()),
    }
}

/// Collects garbage in the engine's data directory. Outside a dry run it reconciles first,
/// so complete children of an interrupted fork are adopted rather than collected.
pub fn collect(engine: &Engine, dry_run: bool) -> Result<GcReport> {
    let only_gc = engine.exclusive()?;
    let mut r = GcReport { dry_run, ..GcReport::default() };
    if !dry_run {
        r.ended_shells = engine.end_shells(true);
        r.reconciled = Some(engine.reconcile_held(&only_gc)?);
    }
    let views = engine.list()?;
    let known: BTreeSet<String> = views.iter().map(|v| v.sandbox.id.to_string()).collect();
    let mut lost = BTreeSet::new();
    for v in views.iter().filter(|v| !v.alive) {
        if !dry_run {
            engine.kill_held(&v.sandbox.id)?;
        }
        lost.insert(v.sandbox.id.to_string());
        r.lost_sandboxes.push(v.sandbox.id.clone());
    }
    let now = now_ms();
    for s in engine.snapshots()? {
        if s.deleted_ms.is_none() && s.expires_ms.is_some_and(|t| t <= now) {
            if dry_run {
                r.expired_snapshots.push(s.id);
                continue;
            }
            let bytes = dir_bytes(&engine.snapshot_path(&s.id));
            match engine.delete_snapshot(s.id.as_str(), false) {
                Ok(_) => {
                    r.freed_bytes += bytes;
                    r.expired_snapshots.push(s.id);
                }
                Err(Error::Conflict(_)) => r.kept_with_descendants.push(s.id),
                Err(e) => return Err(e),
            }
        }
    }
    for id in unreachable_fork_points(engine, &lost)? {
        let bytes = dir_bytes(&engine.snapshot_path(&id));
        if !dry_run {
            match engine.delete_snapshot(id.as_str(), false) {
                Ok(_) => {}
                // Something came to depend on it since it was looked at: it stays.
                Err(Error::Conflict(_)) => continue,
                Err(e) => return Err(e),
            }
        }
        r.freed_bytes += bytes;
        r.unreachable_fork_points.push(id);
    }
    let live: BTreeSet<String> = engine
        .snapshots()?
        .into_iter()
        .filter(|s| s.deleted_ms.is_none())
        .map(|s| s.id.to_string())
        .collect();
    let snap_root = engine.config().data_dir.join("snapshots");
    for name in names(&snap_root) {
        if !live.contains(&name) {
            let p = snap_root.join(&name);
            r.freed_bytes += dir_bytes(&p);
            if !dry_run {
                remove(&p)?;
            }
            r.orphan_snapshot_dirs.push(name);
        }
    }
    let box_root = engine.config().data_dir.join("sandboxes");
    let shells = engine.shell_ids();
    for name in names(&box_root) {
        if known.contains(&name) || shells.contains(&name) {
            continue;
        }
        let p = box_root.join(&name);
        r.freed_bytes += dir_bytes(&p);
        if !dry_run {
            match SandboxId::parse(&name) {
                Ok(id) => engine.reap(&id)?,
                Err(_) => remove(&p)?,
            }
        }
        r.orphan_sandbox_dirs.push(name);
    }
    r.orphan_networks = branchbox_net::NetConfig::from_env()
        .and_then(|net| net.sweep(dry_run))
        .map_err(|e| Error::Backend(format!("sweeping sandbox networks: {e}")))?;
    collect_images(engine, dry_run, &mut r)?;
    Ok(r)
}

/// Fork points nothing a user made reaches: unnamed, no ref, no sandbox (other than the lost
/// ones gc removes) started from it or descending from it, and no live snapshot below it.
/// Leaves come first, so each can be deleted in order; a fork point whose only descendants are
/// such fork points goes too. Named snapshots, checkpoints and snapshots taken on request are
/// never in the list.
fn unreachable_fork_points(engine: &Engine, lost: &BTreeSet<String>) -> Result<Vec<SnapshotId>> {
    let snaps: Vec<Snapshot> = engine.snapshots()?.into_iter().filter(|s| s.deleted_ms.is_none()).collect();
    let reffed: BTreeSet<String> = engine.refs()?.into_iter().map(|(_, s)| s).collect();
    let used: BTreeSet<SnapshotId> = engine
        .sandbox_records()?
        .into_iter()
        .filter(|b| !lost.contains(b.id.as_str()))
        .filter_map(|b| b.parent_snapshot)
        .collect();
    let mut gone: BTreeSet<SnapshotId> = BTreeSet::new();
    let mut order = Vec::new();
    loop {
        let next: Vec<SnapshotId> = snaps
            .iter()
            .filter(|s| {
                s.kind == SnapshotKind::ForkPoint
                    && s.name.is_none()
                    && !gone.contains(&s.id)
                    && !reffed.contains(s.id.as_str())
                    && !used.contains(&s.id)
                    && !snaps.iter().any(|c| c.parent.as_ref() == Some(&s.id) && !gone.contains(&c.id))
            })
            .map(|s| s.id.clone())
            .collect();
        if next.is_empty() {
            return Ok(order);
        }
        gone.extend(next.iter().cloned());
        order.extend(next);
    }
}

/// Images are collected only when the cache belongs to this data directory: a shared cache
/// (`BRANCHBOX_IMAGES`) may hold images of other data directories.
fn collect_images(engine: &Engine, dry_run: bool, r: &mut GcReport) -> Result<()> {
    let cfg = engine.config();
    if cfg.images_dir != cfg.data_dir.join("images") {
        return Ok(());
    }
    let mut used: BTreeSet<String> = engine.sandbox_records()?.into_iter().map(|s| s.image).collect();
    used.extend(engine.snapshots()?.into_iter().filter(|s| s.deleted_ms.is_none()).map(|s| s.image));
    if let Ok(current) = engine.current_image_ids() {
        used.extend(current);
    }
    for name in names(&cfg.images_dir) {
        if name.starts_with("img-") && !used.contains(&name) {
            let p = cfg.images_dir.join(&name);
            r.freed_bytes += dir_bytes(&p);
            if !dry_run {
                remove(&p)?;
            }
            r.unused_images.push(name);
        }
    }
    for (hash, bytes) in
        branchbox_image::collect_disks(&cfg.images_dir, &|image| used.contains(image), dry_run)?
    {
        r.freed_bytes += bytes;
        r.unused_disks.push(hash);
    }
    Ok(())
}
