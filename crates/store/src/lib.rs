//! Metadata of sandboxes and snapshots in SQLite (WAL mode, so several `branchbox` processes
//! and the service can share one data directory).
//!
//! The store records ids, states and lineage only; snapshot data lives in files under the data
//! directory, named by id. A snapshot row is inserted only after its files are complete, so a
//! listed snapshot is always restorable.
//!
//! Why a sandbox was lost lives in a table of its own (`lost`), so older builds that do not
//! know it still read the database.
//!
//! Templates (`templates`: one JSON record per name), their step cache (`template_steps`: chain
//! key to snapshot) and the exec defaults of template sandboxes and their snapshots
//! (`exec_defaults`) are tables of their own too (see `templates.rs`).
//!
//! The command behind each step-history checkpoint (`steps`: one row per checkpoint, keyed by
//! the snapshot) is a table of its own as well, created with `IF NOT EXISTS` like every table,
//! so a database from before it opens unchanged and older builds ignore it (`steps.rs`).
//!
//! Not for: file contents or runtime state of sandboxes.

use branchbox_model::{
    BackendKind, Error, Limits, Result, Sandbox, SandboxId, SandboxState, Snapshot, SnapshotId,
};
use rusqlite::{params, Connection, OptionalExtension, Row};
use std::path::Path;

pub mod file;
mod steps;
mod templates;

pub use file::make_private;
pub use steps::ExecStep;

/// Schema version written to `PRAGMA user_version`.
const SCHEMA_VERSION: i64 = 1;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sandboxes(
    id TEXT PRIMARY KEY,
    backend TEXT NOT NULL,
    image TEXT NOT NULL,
    state TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    parent_snapshot TEXT,
    limits TEXT NOT NULL,
    history INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS snapshots(
    id TEXT PRIMARY KEY,
    parent TEXT,
    source TEXT,
    backend TEXT NOT NULL,
    image TEXT NOT NULL,
    kind TEXT NOT NULL,
    name TEXT UNIQUE,
    created_ms INTEGER NOT NULL,
    size_bytes INTEGER NOT NULL,
    limits TEXT NOT NULL,
    expires_ms INTEGER,
    deleted_ms INTEGER
);
CREATE INDEX IF NOT EXISTS snapshots_parent ON snapshots(parent);
CREATE TABLE IF NOT EXISTS refs(
    name TEXT PRIMARY KEY,
    snapshot TEXT NOT NULL,
    updated_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS lost(
    id TEXT PRIMARY KEY,
    reason TEXT NOT NULL,
    at_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS templates(
    name TEXT PRIMARY KEY,
    record TEXT NOT NULL,
    updated_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS template_steps(
    key TEXT PRIMARY KEY,
    snapshot TEXT NOT NULL,
    created_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS exec_defaults(
    owner TEXT PRIMARY KEY,
    defaults TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS steps(
    snapshot TEXT PRIMARY KEY,
    sandbox TEXT NOT NULL,
    command TEXT NOT NULL,
    exit_code INTEGER,
    signal INTEGER,
    duration_ms INTEGER NOT NULL,
    ended_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS steps_sandbox ON steps(sandbox);
";

/// A handle on the metadata database.
pub struct Store {
    conn: Connection,
}

fn db(e: rusqlite::Error) -> Error {
    if file::is_corruption(&e) {
        return Error::Store(format!(
            "the metadata database (meta.db) is corrupt ({e}); run `branchbox store check` for what to do"
        ));
    }
    Error::Store(e.to_string())
}

fn limits_json(l: &Limits) -> String {
    serde_json::to_string(l).unwrap_or_default()
}

fn parse_limits(s: String) -> rusqlite::Result<Limits> {
    serde_json::from_str(&s).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
}

fn conv<T, E: std::error::Error + Send + Sync + 'static>(
    r: std::result::Result<T, E>,
) -> rusqlite::Result<T> {
    r.map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
}

fn sandbox_row(r: &Row<'_>) -> rusqlite::Result<Sandbox> {
    Ok(Sandbox {
        id: conv(SandboxId::parse(&r.get::<_, String>(0)?))?,
        backend: conv(r.get::<_, String>(1)?.parse::<BackendKind>())?,
        image: r.get(2)?,
        state: conv(r.get::<_, String>(3)?.parse::<SandboxState>())?,
        created_ms: r.get(4)?,
        parent_snapshot: r.get::<_, Option<String>>(5)?.map(|s| conv(SnapshotId::parse(&s))).transpose()?,
        limits: parse_limits(r.get(6)?)?,
        history: r.get::<_, i64>(7)? != 0,
    })
}

fn snapshot_row(r: &Row<'_>) -> rusqlite::Result<Snapshot> {
    Ok(Snapshot {
        id: conv(SnapshotId::parse(&r.get::<_, String>(0)?))?,
        parent: r.get::<_, Option<String>>(1)?.map(|s| conv(SnapshotId::parse(&s))).transpose()?,
        source: r.get::<_, Option<String>>(2)?.map(|s| conv(SandboxId::parse(&s))).transpose()?,
        backend: conv(r.get::<_, String>(3)?.parse::<BackendKind>())?,
        image: r.get(4)?,
        kind: conv(r.get::<_, String>(5)?.parse())?,
        name: r.get(6)?,
        created_ms: r.get(7)?,
        size_bytes: r.get::<_, i64>(8)? as u64,
        limits: parse_limits(r.get(9)?)?,
        expires_ms: r.get(10)?,
        deleted_ms: r.get(11)?,
    })
}

const SANDBOX_COLS: &str = "id, backend, image, state, created_ms, parent_snapshot, limits, history";
const SNAPSHOT_COLS: &str =
    "id, parent, source, backend, image, kind, name, created_ms, size_bytes, limits, expires_ms, deleted_ms";

impl Store {
    /// Opens (creating if needed) the database at `path`, readable by its owner only.
    pub fn open(path: &Path) -> Result<Store> {
        let conn = file::open(path).map_err(Error::Store)?;
        let fail = |e: rusqlite::Error| Error::Store(file::explain(path, &e));
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(fail)?;
        if version > SCHEMA_VERSION {
            return Err(Error::Store(format!(
                "{} was written by a newer branchbox (schema {version}, this one knows {SCHEMA_VERSION}); upgrade branchbox",
                path.display()
            )));
        }
        conn.execute_batch(SCHEMA).map_err(fail)?;
        conn.pragma_update(None, "user_version", SCHEMA_VERSION).map_err(fail)?;
        Ok(Store { conn })
    }

    /// Records a new sandbox.
    pub fn insert_sandbox(&self, s: &Sandbox) -> Result<()> {
        self.conn
            .execute(
                &format!("INSERT INTO sandboxes({SANDBOX_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"),
                params![
                    s.id.as_str(),
                    s.backend.as_str(),
                    s.image,
                    s.state.as_str(),
                    s.created_ms,
                    s.parent_snapshot.as_ref().map(|p| p.as_str()),
                    limits_json(&s.limits),
                    s.history
                ],
            )
            .map(drop)
            .map_err(db)
    }

    /// One sandbox, or a not-found error.
    pub fn sandbox(&self, id: &SandboxId) -> Result<Sandbox> {
        self.conn
            .query_row(
                &format!("SELECT {SANDBOX_COLS} FROM sandboxes WHERE id = ?1"),
                [id.as_str()],
                sandbox_row,
            )
            .optional()
            .map_err(db)?
            .ok_or_else(|| Error::not_found("sandbox", id.as_str(), "`branchbox ls` lists sandboxes"))
    }

    /// Every sandbox, oldest first.
    pub fn sandboxes(&self) -> Result<Vec<Sandbox>> {
        let mut st = self
            .conn
            .prepare(&format!("SELECT {SANDBOX_COLS} FROM sandboxes ORDER BY created_ms, id"))
            .map_err(db)?;
        let rows = st.query_map([], sandbox_row).map_err(db)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(db)
    }

    /// Changes a sandbox's state.
    pub fn set_state(&self, id: &SandboxId, state: SandboxState) -> Result<()> {
        self.conn
            .execute("UPDATE sandboxes SET state = ?2 WHERE id = ?1", params![id.as_str(), state.as_str()])
            .map(drop)
            .map_err(db)
    }

    /// Forgets a sandbox.
    pub fn delete_sandbox(&self, id: &SandboxId) -> Result<()> {
        self.conn.execute("DELETE FROM lost WHERE id = ?1", [id.as_str()]).map_err(db)?;
        self.conn.execute("DELETE FROM exec_defaults WHERE owner = ?1", [id.as_str()]).map_err(db)?;
        self.conn.execute("DELETE FROM sandboxes WHERE id = ?1", [id.as_str()]).map(drop).map_err(db)
    }

    /// Records that a sandbox's runtime is gone, and why.
    pub fn mark_lost(&self, id: &SandboxId, reason: &str, when_ms: i64) -> Result<()> {
        self.set_state(id, SandboxState::Lost)?;
        self.conn
            .execute(
                "INSERT INTO lost(id, reason, at_ms) SELECT ?1, ?2, ?3 WHERE EXISTS(SELECT 1 FROM sandboxes WHERE id = ?1) \
                 ON CONFLICT(id) DO UPDATE SET reason = ?2, at_ms = ?3",
                params![id.as_str(), reason, when_ms],
            )
            .map(drop)
            .map_err(db)
    }

    /// Why each lost sandbox was lost, by id.
    pub fn lost_reasons(&self) -> Result<std::collections::BTreeMap<String, String>> {
        let mut st = self.conn.prepare("SELECT id, reason FROM lost").map_err(db)?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).map_err(db)?;
        rows.collect::<rusqlite::Result<_>>().map_err(db)
    }

    /// Records a snapshot whose files are complete.
    pub fn insert_snapshot(&self, s: &Snapshot) -> Result<()> {
        self.conn
            .execute(
                &format!(
                    "INSERT INTO snapshots({SNAPSHOT_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
                ),
                params![
                    s.id.as_str(),
                    s.parent.as_ref().map(|p| p.as_str()),
                    s.source.as_ref().map(|p| p.as_str()),
                    s.backend.as_str(),
                    s.image,
                    s.kind.as_str(),
                    s.name,
                    s.created_ms,
                    s.size_bytes as i64,
                    limits_json(&s.limits),
                    s.expires_ms,
                    s.deleted_ms
                ],
            )
            .map(drop)
            .map_err(|e| match e {
                rusqlite::Error::SqliteFailure(f, _)
                    if f.code == rusqlite::ErrorCode::ConstraintViolation =>
                {
                    Error::Conflict(format!(
                        "a snapshot named {:?} exists already; choose another name",
                        s.name.as_deref().unwrap_or_default()
                    ))
                }
                other => db(other),
            })
    }

    /// A snapshot by id or by name.
    pub fn snapshot(&self, id_or_name: &str) -> Result<Snapshot> {
        self.conn
            .query_row(
                &format!(
                    "SELECT {SNAPSHOT_COLS} FROM snapshots WHERE id = ?1 OR name = ?1 \
                     OR id = (SELECT snapshot FROM refs WHERE name = ?1) \
                     ORDER BY (id = ?1) DESC, (name = ?1) DESC LIMIT 1"
                ),
                [id_or_name],
                snapshot_row,
            )
            .optional()
            .map_err(db)?
            .ok_or_else(|| Error::not_found("snapshot", id_or_name, "`branchbox snapshots` lists snapshots"))
    }

    /// True when a snapshot with this name exists.
    pub fn snapshot_name_taken(&self, name: &str) -> Result<bool> {
        self.conn
            .query_row("SELECT 1 FROM snapshots WHERE name = ?1", [name], |_| Ok(()))
            .optional()
            .map(|r| r.is_some())
            .map_err(db)
    }

    /// The snapshots taken of sandbox `source` (any kind, tombstones too), oldest first.
    pub fn snapshots_of(&self, source: &SandboxId) -> Result<Vec<Snapshot>> {
        let mut st = self
            .conn
            .prepare(&format!(
                "SELECT {SNAPSHOT_COLS} FROM snapshots WHERE source = ?1 ORDER BY created_ms, id"
            ))
            .map_err(db)?;
        let rows = st.query_map([source.as_str()], snapshot_row).map_err(db)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(db)
    }

    /// Every snapshot, oldest first.
    pub fn snapshots(&self) -> Result<Vec<Snapshot>> {
        let mut st = self
            .conn
            .prepare(&format!("SELECT {SNAPSHOT_COLS} FROM snapshots ORDER BY created_ms, id"))
            .map_err(db)?;
        let rows = st.query_map([], snapshot_row).map_err(db)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(db)
    }

    /// Forgets a snapshot, the refs pointing at it and the step it recorded. (A tombstone
    /// keeps its step, as it keeps its place in the lineage.)
    pub fn delete_snapshot(&self, id: &SnapshotId) -> Result<()> {
        self.conn.execute("DELETE FROM refs WHERE snapshot = ?1", [id.as_str()]).map_err(db)?;
        self.conn.execute("DELETE FROM steps WHERE snapshot = ?1", [id.as_str()]).map_err(db)?;
        self.conn.execute("DELETE FROM exec_defaults WHERE owner = ?1", [id.as_str()]).map_err(db)?;
        self.conn.execute("DELETE FROM snapshots WHERE id = ?1", [id.as_str()]).map(drop).map_err(db)
    }

    /// Keeps a snapshot's row for the lineage but records that its data is gone.
    pub fn tombstone_snapshot(&self, id: &SnapshotId, when_ms: i64) -> Result<()> {
        self.conn.execute("DELETE FROM refs WHERE snapshot = ?1", [id.as_str()]).map_err(db)?;
        self.conn
            .execute(
                "UPDATE snapshots SET deleted_ms = ?2, size_bytes = 0, name = NULL WHERE id = ?1",
                params![id.as_str(), when_ms],
            )
            .map(drop)
            .map_err(db)
    }

    /// Snapshots whose parent is `id`.
    pub fn child_snapshots(&self, id: &SnapshotId) -> Result<Vec<Snapshot>> {
        let mut st = self
            .conn
            .prepare(&format!(
                "SELECT {SNAPSHOT_COLS} FROM snapshots WHERE parent = ?1 ORDER BY created_ms, id"
            ))
            .map_err(db)?;
        let rows = st.query_map([id.as_str()], snapshot_row).map_err(db)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(db)
    }

    /// True when a sandbox or snapshot names `id` as its parent.
    pub fn has_dependents(&self, id: &SnapshotId) -> Result<bool> {
        self.conn
            .query_row(
                "SELECT EXISTS(SELECT 1 FROM snapshots WHERE parent = ?1) \
                 OR EXISTS(SELECT 1 FROM sandboxes WHERE parent_snapshot = ?1)",
                [id.as_str()],
                |r| r.get::<_, bool>(0),
            )
            .map_err(db)
    }

    /// Records that a sandbox's current state descends from `snapshot`.
    pub fn set_parent(&self, id: &SandboxId, snapshot: &SnapshotId) -> Result<()> {
        self.conn
            .execute(
                "UPDATE sandboxes SET parent_snapshot = ?2 WHERE id = ?1",
                params![id.as_str(), snapshot.as_str()],
            )
            .map(drop)
            .map_err(db)
    }

    /// Turns step-history mode on or off for a sandbox.
    pub fn set_history(&self, id: &SandboxId, on: bool) -> Result<()> {
        self.conn
            .execute("UPDATE sandboxes SET history = ?2 WHERE id = ?1", params![id.as_str(), on])
            .map(drop)
            .map_err(db)
    }

    /// Points ref `name` at `snapshot` (creating or moving it).
    pub fn set_ref(&self, name: &str, snapshot: &SnapshotId, when_ms: i64) -> Result<()> {
        self.conn
            .execute(
                "INSERT INTO refs(name, snapshot, updated_ms) VALUES (?1, ?2, ?3) \
                 ON CONFLICT(name) DO UPDATE SET snapshot = ?2, updated_ms = ?3",
                params![name, snapshot.as_str(), when_ms],
            )
            .map(drop)
            .map_err(db)
    }

    /// Removes a ref; false when there was none.
    pub fn delete_ref(&self, name: &str) -> Result<bool> {
        self.conn.execute("DELETE FROM refs WHERE name = ?1", [name]).map(|n| n > 0).map_err(db)
    }

    /// Every ref as (name, snapshot id), sorted by name.
    pub fn refs(&self) -> Result<Vec<(String, String)>> {
        let mut st = self.conn.prepare("SELECT name, snapshot FROM refs ORDER BY name").map_err(db)?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).map_err(db)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(db)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use branchbox_model::SnapshotKind;

    fn sandbox(parent: Option<SnapshotId>) -> Sandbox {
        Sandbox {
            id: SandboxId::generate(),
            backend: BackendKind::Gvisor,
            image: "img-0123456789abcdef".into(),
            state: SandboxState::Running,
            created_ms: 5,
            parent_snapshot: parent,
            limits: Limits::default(),
            history: false,
        }
    }

    #[test]
    fn sandboxes_and_snapshots_round_trip_with_lineage() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("meta.db")).unwrap();
        let src = sandbox(None);
        store.insert_sandbox(&src).unwrap();
        let snap = Snapshot {
            id: SnapshotId::generate(),
            parent: None,
            source: Some(src.id.clone()),
            backend: BackendKind::Gvisor,
            image: src.image.clone(),
            kind: SnapshotKind::ForkPoint,
            name: Some("warm".into()),
            created_ms: 6,
            size_bytes: 1234,
            limits: Limits::default(),
            expires_ms: None,
            deleted_ms: None,
        };
        store.insert_snapshot(&snap).unwrap();
        let child = sandbox(Some(snap.id.clone()));
        store.insert_sandbox(&child).unwrap();
        assert_eq!(store.sandbox(&child.id).unwrap(), child);
        assert_eq!(store.snapshot("warm").unwrap(), snap);
        assert_eq!(store.snapshot(snap.id.as_str()).unwrap(), snap);
        store.set_state(&src.id, SandboxState::Paused).unwrap();
        assert_eq!(store.sandbox(&src.id).unwrap().state, SandboxState::Paused);
        assert_eq!(store.sandboxes().unwrap().len(), 2);
        let mut dup = snap.clone();
        dup.id = SnapshotId::generate();
        assert!(matches!(store.insert_snapshot(&dup), Err(Error::Conflict(_))));
        store.delete_sandbox(&src.id).unwrap();
        assert!(matches!(store.sandbox(&src.id), Err(Error::NotFound { .. })));
    }

    #[test]
    fn a_lost_sandbox_keeps_its_reason_until_it_is_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("meta.db")).unwrap();
        let s = sandbox(None);
        store.insert_sandbox(&s).unwrap();
        store.mark_lost(&s.id, "memory_limit: oom", 7).unwrap();
        assert_eq!(store.sandbox(&s.id).unwrap().state, SandboxState::Lost);
        assert_eq!(
            store.lost_reasons().unwrap().get(s.id.as_str()).map(String::as_str),
            Some("memory_limit: oom")
        );
        store.delete_sandbox(&s.id).unwrap();
        assert!(store.lost_reasons().unwrap().is_empty());
        store.mark_lost(&s.id, "runtime gone", 8).unwrap();
        assert!(store.lost_reasons().unwrap().is_empty(), "a reason without a sandbox was kept");
    }

    #[test]
    fn a_newer_schema_is_refused_rather_than_misread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.db");
        Store::open(&path).unwrap();
        Connection::open(&path).unwrap().pragma_update(None, "user_version", 99).unwrap();
        assert!(matches!(Store::open(&path), Err(Error::Store(m)) if m.contains("newer")));
    }
}
