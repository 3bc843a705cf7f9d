//! The files that differ between two snapshots, as `branchbox diff` lists them, and the text
//! diff of one small file between them.

use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{sandbox_path, snapshot_ref, ApiQuery};
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use branchbox_core::diff::{Side, SideState, MAX_TEXT_BYTES};
use branchbox_core::engine::FileAt;
use branchbox_core::Engine;
use branchbox_model::{Error, Snapshot};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use utoipa::{IntoParams, ToSchema};

/// Query of a diff.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DiffQuery {
    /// The older side (id or name); by default the snapshot's parent.
    pub against: Option<String>,
}

/// Paths that differ. Only listings are compared (type, size, mode, modification time); the
/// text diff of one file is `GET /v1/snapshots/{snapshot}/diff/file`.
#[derive(Debug, Serialize, ToSchema)]
pub struct DiffInfo {
    /// The older side.
    pub from: String,
    /// The newer side (the snapshot asked about).
    pub to: String,
    /// Paths only in `to`.
    pub added: Vec<String>,
    /// Paths in both whose type, size, mode or modification time differ.
    pub changed: Vec<String>,
    /// Paths only in `from`.
    pub removed: Vec<String>,
}

/// Lists the files added, changed and removed from `against` (or the snapshot's parent) to a
/// snapshot. The first diff of a gVisor snapshot starts it once, headless, to list its files.
#[utoipa::path(get, path = "/v1/snapshots/{snapshot}/diff", tag = "snapshots",
    params(("snapshot" = String, Path, description = "snapshot id or name"), DiffQuery),
    responses((status = 200, body = DiffInfo),
              (status = "4XX", body = ErrorBody, description = "bad reference, not found, deleted or no parent (409)")))]
pub async fn diff(
    State(st): State<AppState>,
    Path(snapshot): Path<String>,
    ApiQuery(q): ApiQuery<DiffQuery>,
) -> ApiResult<Json<DiffInfo>> {
    let to = snapshot_ref(&snapshot)?;
    let against = q.against.as_deref().map(snapshot_ref).transpose()?;
    let out = st
        .blocking(move |engine, _| {
            let from = older_side(engine, &to, against)?;
            let d = branchbox_core::diff::diff(engine, &from, &to)?;
            Ok(DiffInfo {
                from: d.from.to_string(),
                to: d.to.to_string(),
                added: d.added,
                changed: d.changed,
                removed: d.removed,
            })
        })
        .await?;
    Ok(Json(out))
}

/// `against`, or the parent of snapshot `to` (409 `no_parent` without one).
fn older_side(engine: &Engine, to: &str, against: Option<String>) -> ApiResult<String> {
    match against {
        Some(a) => Ok(a),
        None => engine.find_snapshot(to)?.parent.map(|p| p.to_string()).ok_or_else(|| {
            ApiError::new(
                StatusCode::CONFLICT,
                "no_parent",
                format!("snapshot {to} has no parent to compare with; pass ?against=ID (GET /v1/snapshots lists them)"),
            )
        }),
    }
}

/// Query of a file's text diff.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FileDiffQuery {
    /// The file: an absolute path, at most 4096 bytes, no NUL.
    pub path: String,
    /// The older side (id or name); by default the snapshot's parent.
    pub against: Option<String>,
}

/// What one side of a file diff holds.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SideStateName {
    /// UTF-8 text without NUL bytes.
    Text,
    /// Nothing at that path (diffed as empty, like git's /dev/null).
    Absent,
    /// Not UTF-8 text, or it has NUL bytes.
    Binary,
    /// A regular file over 256 KiB.
    TooLarge,
    /// A directory, symbolic link or special file.
    NotRegular,
}

/// One side of a file diff.
#[derive(Debug, Serialize, ToSchema)]
pub struct FileSide {
    /// What it holds.
    pub state: SideStateName,
    /// Its size in bytes (`null` when absent or not a regular file).
    pub size: Option<u64>,
}

impl From<Side> for FileSide {
    fn from(s: Side) -> Self {
        let state = match s.state {
            SideState::Text => SideStateName::Text,
            SideState::Absent => SideStateName::Absent,
            SideState::Binary => SideStateName::Binary,
            SideState::TooLarge => SideStateName::TooLarge,
            SideState::NotRegular => SideStateName::NotRegular,
        };
        FileSide { state, size: s.size }
    }
}

/// One file compared between two snapshots.
#[derive(Debug, Serialize, ToSchema)]
pub struct FileDiffInfo {
    /// The older side.
    pub from: String,
    /// The newer side (the snapshot asked about).
    pub to: String,
    /// The path compared.
    pub path: String,
    /// The file in `from`.
    pub old: FileSide,
    /// The file in `to`.
    pub new: FileSide,
    /// Both sides are text (or absent) and equal.
    pub identical: bool,
    /// The unified diff (`---`/`+++` lines, then `@@` hunks of ` `, `-` and `+` lines) when both
    /// sides are text, or one is text and the other absent, and they differ; `null` otherwise
    /// (the sides' states say why).
    pub unified: Option<String>,
    /// Lines only in `to`.
    pub added_lines: u64,
    /// Lines only in `from`.
    pub removed_lines: u64,
}

/// The text diff of one file from `against` (or the snapshot's parent) to a snapshot. Each side
/// is read only when the snapshot's listing says it is a regular file of at most 256 KiB,
/// by starting that snapshot once, headless; a binary, larger or irregular side is reported
/// as such instead of a diff. Contents read are kept in a bounded cache (snapshots never
/// change), so asking again is quick.
#[utoipa::path(get, path = "/v1/snapshots/{snapshot}/diff/file", tag = "snapshots",
    params(("snapshot" = String, Path, description = "snapshot id or name"), FileDiffQuery),
    responses((status = 200, body = FileDiffInfo),
              (status = "4XX", body = ErrorBody, description = "bad reference or path, not found, deleted or no parent (409)")))]
pub async fn file(
    State(st): State<AppState>,
    State(files): State<Arc<FileCache>>,
    Path(snapshot): Path<String>,
    ApiQuery(q): ApiQuery<FileDiffQuery>,
) -> ApiResult<Json<FileDiffInfo>> {
    let to = snapshot_ref(&snapshot)?;
    let against = q.against.as_deref().map(snapshot_ref).transpose()?;
    let path = sandbox_path(&q.path)?;
    let out = st
        .blocking(move |engine, _| {
            let from = older_side(engine, &to, against)?;
            let (a, b) = (engine.find_snapshot(&from)?, engine.find_snapshot(&to)?);
            for s in [&a, &b] {
                if s.deleted_ms.is_some() {
                    return Err(Error::Conflict(format!(
                        "snapshot {} was deleted; its files are gone",
                        s.id
                    ))
                    .into());
                }
            }
            let old = files.read(engine, &a, &path)?;
            let new = files.read(engine, &b, &path)?;
            let d = branchbox_core::diff::text_diff(a.id, b.id, &path, &old, &new);
            Ok(FileDiffInfo {
                from: d.from.to_string(),
                to: d.to.to_string(),
                path: d.path,
                old: d.old.into(),
                new: d.new.into(),
                identical: d.identical,
                unified: d.unified,
                added_lines: d.added_lines as u64,
                removed_lines: d.removed_lines as u64,
            })
        })
        .await?;
    Ok(Json(out))
}

/// Most entries, and most bytes of contents, the file cache holds.
const CACHE_ENTRIES: usize = 256;
const CACHE_BYTES: usize = 32 << 20;

type Key = (String, String);

/// What paths hold in snapshots, as read for text diffs, by (snapshot id, path). A snapshot's
/// files never change and its id is never reused, so an entry is right until it is evicted;
/// the oldest entries go first once [`CACHE_ENTRIES`] or [`CACHE_BYTES`] would be passed.
#[derive(Default)]
pub struct FileCache(Mutex<CacheInner>);

#[derive(Default)]
struct CacheInner {
    map: HashMap<Key, Arc<FileAt>>,
    order: VecDeque<Key>,
    bytes: usize,
}

fn weight(at: &FileAt) -> usize {
    match at {
        FileAt::Bytes(b) => b.len(),
        _ => 0,
    }
}

impl FileCache {
    /// What `path` holds in `snap`: from the cache, or read (starting the snapshot headless
    /// when the file must be read) and kept.
    pub fn read(&self, engine: &Engine, snap: &Snapshot, path: &str) -> ApiResult<Arc<FileAt>> {
        let key = (snap.id.to_string(), path.to_string());
        if let Some(hit) = self.lock().map.get(&key) {
            return Ok(hit.clone());
        }
        let at = engine.snapshot_file(snap, path, MAX_TEXT_BYTES)?;
        Ok(self.put(key, at))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheInner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn put(&self, key: Key, at: FileAt) -> Arc<FileAt> {
        let at = Arc::new(at);
        let mut c = self.lock();
        if let Some(old) = c.map.insert(key.clone(), at.clone()) {
            // Read twice at once: keep one.
            c.bytes -= weight(&old);
            c.order.retain(|k| k != &key);
        }
        c.bytes += weight(&at);
        c.order.push_back(key);
        while c.order.len() > CACHE_ENTRIES || c.bytes > CACHE_BYTES {
            let Some(k) = c.order.pop_front() else { break };
            if let Some(gone) = c.map.remove(&k) {
                c.bytes -= weight(&gone);
            }
        }
        at
    }

    /// Entries and bytes held.
    #[cfg(test)]
    fn size(&self) -> (usize, usize) {
        let c = self.lock();
        (c.map.len(), c.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_cache_keeps_to_its_bounds_dropping_the_oldest_first() {
        let cache = FileCache::default();
        let big = (CACHE_BYTES / 4) + 1;
        for i in 0..4 {
            cache.put(("snap-a".into(), format!("/f{i}")), FileAt::Bytes(vec![b'x'; big]));
        }
        let (n, bytes) = cache.size();
        assert_eq!((n, bytes), (3, 3 * big), "the fourth file pushes the first out");
        assert!(!cache.lock().map.contains_key(&("snap-a".to_string(), "/f0".to_string())));
        cache.put(("snap-a".into(), "/f3".into()), FileAt::Absent);
        assert_eq!(cache.size(), (3, 2 * big), "a key read again is counted once");
        for i in 0..CACHE_ENTRIES + 10 {
            cache.put(("snap-b".into(), format!("/g{i}")), FileAt::Absent);
        }
        assert_eq!(cache.size(), (CACHE_ENTRIES, 0));
    }
}
