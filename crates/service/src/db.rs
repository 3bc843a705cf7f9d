//! The service's own state in `<data>/service/service.db` (SQLite, WAL): per-sandbox metadata,
//! environment and TTL, and the audit log. The engine's store (`meta.db`) is never touched
//! here; a sandbox the engine no longer knows simply has no row that matters.

use branchbox_model::SandboxId;
use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use utoipa::ToSchema;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sandbox_meta(
    id TEXT PRIMARY KEY,
    metadata TEXT NOT NULL,
    envs TEXT NOT NULL,
    expires_ms INTEGER,
    on_timeout TEXT NOT NULL,
    timeout_ms INTEGER NOT NULL,
    created_by TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS sandbox_meta_expires ON sandbox_meta(expires_ms);
CREATE TABLE IF NOT EXISTS e2b_template(
    id TEXT PRIMARY KEY,
    template TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS audit(
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms INTEGER NOT NULL,
    who TEXT NOT NULL,
    action TEXT NOT NULL,
    status INTEGER NOT NULL,
    code TEXT,
    sandbox TEXT,
    snapshot TEXT,
    parent TEXT,
    detail TEXT
);
CREATE INDEX IF NOT EXISTS audit_sandbox ON audit(sandbox);
";

/// What happens to a sandbox when its timeout expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    /// Destroy it.
    #[default]
    Kill,
    /// Pause it (its state is kept; `connect` resumes it).
    Pause,
}

impl OnTimeout {
    fn as_str(self) -> &'static str {
        match self {
            OnTimeout::Kill => "kill",
            OnTimeout::Pause => "pause",
        }
    }
}

/// The service's record of one sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SandboxMeta {
    /// Client-chosen labels.
    pub metadata: BTreeMap<String, String>,
    /// Environment added to every command run through the service.
    pub envs: BTreeMap<String, String>,
    /// When the timeout fires (ms since the epoch); `None` while none runs.
    pub expires_ms: Option<i64>,
    /// What the timeout does.
    pub on_timeout: OnTimeout,
    /// The timeout's length, reused when it is renewed.
    pub timeout_ms: i64,
    /// Token id of the creator.
    pub created_by: String,
}

/// One audit record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct AuditEntry {
    /// Sequence number, increasing.
    pub seq: i64,
    /// When, ms since the epoch.
    pub at_ms: i64,
    /// Token id of the caller (`service` for the service's own actions, e.g. TTL expiry).
    pub who: String,
    /// The operation (`METHOD /route/template`, or `ttl.kill` / `ttl.pause`).
    pub action: String,
    /// HTTP status of the answer.
    pub status: u16,
    /// Error code when it failed.
    pub code: Option<String>,
    /// The sandbox acted on or created.
    pub sandbox: Option<String>,
    /// The snapshot involved (created, restored from, deleted).
    pub snapshot: Option<String>,
    /// The parent: the source sandbox of a fork, the snapshot a sandbox came from.
    pub parent: Option<String>,
    /// Anything else worth keeping (e.g. the children of a fork).
    pub detail: Option<String>,
}

/// Filters for reading the audit log.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    /// Only this sandbox.
    pub sandbox: Option<String>,
    /// Only this caller.
    pub who: Option<String>,
    /// Only records after this sequence number.
    pub after: Option<i64>,
    /// At most this many (oldest first).
    pub limit: u32,
}

/// The service database.
pub struct ServiceDb {
    conn: Connection,
}

type DbResult<T> = Result<T, rusqlite::Error>;

fn to_json(m: &BTreeMap<String, String>) -> String {
    serde_json::to_string(m).unwrap_or_else(|_| "{}".into())
}

fn from_json(s: &str) -> BTreeMap<String, String> {
    serde_json::from_str(s).unwrap_or_default()
}

impl ServiceDb {
    /// Opens (creating) the database at `path`, readable by its owner only (it holds
    /// sandboxes' environments, which are often secrets).
    pub fn open(path: &Path) -> DbResult<ServiceDb> {
        let conn = branchbox_store::file::open(path).map_err(|msg| {
            rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
                Some(msg),
            )
        })?;
        conn.execute_batch(SCHEMA)?;
        Ok(ServiceDb { conn })
    }

    /// The connection, for modules that keep tables of their own in this database (pools).
    pub(crate) fn conn(&self) -> &Connection {
        &self.conn
    }

    /// Records (or replaces) a sandbox's service state.
    pub fn put(&self, id: &SandboxId, m: &SandboxMeta) -> DbResult<()> {
        self.conn.execute(
            "INSERT OR REPLACE INTO sandbox_meta(id, metadata, envs, expires_ms, on_timeout, timeout_ms, created_by)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                id.as_str(),
                to_json(&m.metadata),
                to_json(&m.envs),
                m.expires_ms,
                m.on_timeout.as_str(),
                m.timeout_ms,
                m.created_by
            ],
        )?;
        Ok(())
    }

    /// A sandbox's service state; `None` for sandboxes the service did not create.
    pub fn get(&self, id: &SandboxId) -> DbResult<Option<SandboxMeta>> {
        self.conn
            .query_row(
                "SELECT metadata, envs, expires_ms, on_timeout, timeout_ms, created_by FROM sandbox_meta WHERE id = ?1",
                [id.as_str()],
                |r| {
                    Ok(SandboxMeta {
                        metadata: from_json(&r.get::<_, String>(0)?),
                        envs: from_json(&r.get::<_, String>(1)?),
                        expires_ms: r.get(2)?,
                        on_timeout: if r.get::<_, String>(3)? == "pause" { OnTimeout::Pause } else { OnTimeout::Kill },
                        timeout_ms: r.get(4)?,
                        created_by: r.get(5)?,
                    })
                },
            )
            .optional()
    }

    /// Every sandbox id the service has state for.
    pub fn ids(&self) -> DbResult<Vec<String>> {
        let mut st = self.conn.prepare("SELECT id FROM sandbox_meta")?;
        let rows = st.query_map([], |r| r.get(0))?;
        rows.collect()
    }

    /// Sets (or clears) when a sandbox's timeout fires.
    pub fn set_expiry(
        &self,
        id: &SandboxId,
        expires_ms: Option<i64>,
        timeout_ms: Option<i64>,
    ) -> DbResult<()> {
        self.conn.execute(
            "UPDATE sandbox_meta SET expires_ms = ?2, timeout_ms = COALESCE(?3, timeout_ms) WHERE id = ?1",
            params![id.as_str(), expires_ms, timeout_ms],
        )?;
        Ok(())
    }

    /// Forgets a sandbox.
    pub fn remove(&self, id: &str) -> DbResult<()> {
        self.conn.execute("DELETE FROM sandbox_meta WHERE id = ?1", [id])?;
        self.conn.execute("DELETE FROM e2b_template WHERE id = ?1", [id])?;
        Ok(())
    }

    /// Records the E2B template id a sandbox was created from (E2B's SDKs read it back).
    pub fn set_e2b_template(&self, id: &str, template: &str) -> DbResult<()> {
        self.conn
            .execute("INSERT OR REPLACE INTO e2b_template(id, template) VALUES (?1, ?2)", [id, template])?;
        Ok(())
    }

    /// The E2B template id a sandbox was created from, when it was created through E2B's API.
    pub fn e2b_template(&self, id: &str) -> DbResult<Option<String>> {
        self.conn.query_row("SELECT template FROM e2b_template WHERE id = ?1", [id], |r| r.get(0)).optional()
    }

    /// Sandboxes whose timeout has fired by `now_ms`, earliest first.
    pub fn due(&self, now_ms: i64) -> DbResult<Vec<(String, OnTimeout)>> {
        let mut st = self.conn.prepare(
            "SELECT id, on_timeout FROM sandbox_meta WHERE expires_ms IS NOT NULL AND expires_ms <= ?1 ORDER BY expires_ms",
        )?;
        let rows = st.query_map([now_ms], |r| {
            let action = if r.get::<_, String>(1)? == "pause" { OnTimeout::Pause } else { OnTimeout::Kill };
            Ok((r.get(0)?, action))
        })?;
        rows.collect()
    }

    /// Appends an audit record; `seq` and `at_ms` of `e` are ignored.
    pub fn audit(&self, at_ms: i64, e: &AuditEntry) -> DbResult<()> {
        self.conn.execute(
            "INSERT INTO audit(at_ms, who, action, status, code, sandbox, snapshot, parent, detail)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![at_ms, e.who, e.action, e.status, e.code, e.sandbox, e.snapshot, e.parent, e.detail],
        )?;
        Ok(())
    }

    /// Reads the audit log.
    pub fn audit_log(&self, f: &AuditFilter) -> DbResult<Vec<AuditEntry>> {
        let mut st = self.conn.prepare(
            "SELECT seq, at_ms, who, action, status, code, sandbox, snapshot, parent, detail FROM audit
             WHERE (?1 IS NULL OR sandbox = ?1) AND (?2 IS NULL OR who = ?2) AND seq > COALESCE(?3, 0)
             ORDER BY seq LIMIT ?4",
        )?;
        let rows = st.query_map(params![f.sandbox, f.who, f.after, f.limit], |r| {
            Ok(AuditEntry {
                seq: r.get(0)?,
                at_ms: r.get(1)?,
                who: r.get(2)?,
                action: r.get(3)?,
                status: r.get(4)?,
                code: r.get(5)?,
                sandbox: r.get(6)?,
                snapshot: r.get(7)?,
                parent: r.get(8)?,
                detail: r.get(9)?,
            })
        })?;
        rows.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> (tempfile::TempDir, ServiceDb) {
        let dir = tempfile::tempdir().unwrap();
        let db = ServiceDb::open(&dir.path().join("service.db")).unwrap();
        (dir, db)
    }

    fn meta(expires: Option<i64>, on: OnTimeout) -> SandboxMeta {
        SandboxMeta { expires_ms: expires, on_timeout: on, timeout_ms: 1000, ..Default::default() }
    }

    #[test]
    fn only_expired_sandboxes_are_due_earliest_first() {
        let (_d, db) = db();
        let (a, b, c, d) =
            (SandboxId::generate(), SandboxId::generate(), SandboxId::generate(), SandboxId::generate());
        db.put(&a, &meta(Some(200), OnTimeout::Kill)).unwrap();
        db.put(&b, &meta(Some(100), OnTimeout::Pause)).unwrap();
        db.put(&c, &meta(Some(300), OnTimeout::Kill)).unwrap();
        db.put(&d, &meta(None, OnTimeout::Kill)).unwrap();
        let due = db.due(250).unwrap();
        assert_eq!(due, vec![(b.to_string(), OnTimeout::Pause), (a.to_string(), OnTimeout::Kill)]);
    }

    #[test]
    fn extending_or_clearing_a_timeout_reschedules_it() {
        let (_d, db) = db();
        let a = SandboxId::generate();
        db.put(&a, &meta(Some(100), OnTimeout::Kill)).unwrap();
        db.set_expiry(&a, Some(1000), Some(900)).unwrap();
        assert!(db.due(500).unwrap().is_empty());
        assert_eq!(db.get(&a).unwrap().unwrap().timeout_ms, 900);
        db.set_expiry(&a, None, None).unwrap();
        assert!(db.due(i64::MAX).unwrap().is_empty());
    }

    #[test]
    fn metadata_and_envs_round_trip() {
        let (_d, db) = db();
        let a = SandboxId::generate();
        let mut m = meta(None, OnTimeout::Pause);
        m.metadata.insert("user".into(), "ada".into());
        m.envs.insert("LANG".into(), "C.UTF-8".into());
        db.put(&a, &m).unwrap();
        assert_eq!(db.get(&a).unwrap(), Some(m));
        db.remove(a.as_str()).unwrap();
        assert_eq!(db.get(&a).unwrap(), None);
    }

    #[test]
    fn audit_log_filters_by_sandbox_and_pages_by_sequence() {
        let (_d, db) = db();
        let entry = |who: &str, sandbox: &str| AuditEntry {
            seq: 0,
            at_ms: 0,
            who: who.into(),
            action: "POST /v1/sandboxes".into(),
            status: 201,
            code: None,
            sandbox: Some(sandbox.into()),
            snapshot: None,
            parent: None,
            detail: None,
        };
        db.audit(1, &entry("tok-a", "sbx-1")).unwrap();
        db.audit(2, &entry("tok-b", "sbx-2")).unwrap();
        db.audit(3, &entry("tok-a", "sbx-1")).unwrap();
        let all = db.audit_log(&AuditFilter { limit: 10, ..Default::default() }).unwrap();
        assert_eq!(all.iter().map(|e| e.at_ms).collect::<Vec<_>>(), vec![1, 2, 3]);
        let one = db
            .audit_log(&AuditFilter { sandbox: Some("sbx-1".into()), limit: 10, ..Default::default() })
            .unwrap();
        assert_eq!(one.len(), 2);
        let after =
            db.audit_log(&AuditFilter { after: Some(all[0].seq), limit: 1, ..Default::default() }).unwrap();
        assert_eq!(after.iter().map(|e| e.who.as_str()).collect::<Vec<_>>(), vec!["tok-b"]);
    }
}
