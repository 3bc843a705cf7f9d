//! Pools in the service database: their definitions, and the sandboxes each holds ready. Both
//! survive a restart, so the service rebuilds its pools and re-adopts what is still alive.

use crate::db::ServiceDb;
use rusqlite::{params, OptionalExtension};
use serde::Serialize;
use utoipa::ToSchema;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS pools(
    name TEXT PRIMARY KEY,
    snapshot TEXT,
    template TEXT,
    size INTEGER NOT NULL,
    paused INTEGER NOT NULL,
    max_idle_ms INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    created_by TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS pool_members(
    id TEXT PRIMARY KEY,
    pool TEXT NOT NULL,
    ready_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS pool_members_pool ON pool_members(pool, ready_ms);
";

type DbResult<T> = Result<T, rusqlite::Error>;

/// A pool's definition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct PoolDef {
    /// Its name.
    pub name: String,
    /// The snapshot (id or name) its sandboxes are restored from.
    pub snapshot: Option<String>,
    /// The template whose final snapshot its sandboxes are restored from.
    pub template: Option<String>,
    /// How many ready sandboxes it keeps.
    pub size: u32,
    /// Ready sandboxes are kept paused (true) or running idle (false).
    pub paused: bool,
    /// A ready sandbox older than this is replaced by a fresh one, ms.
    pub max_idle_ms: i64,
    /// Creation time, ms since the epoch.
    pub created_ms: i64,
    /// Token id of its creator.
    pub created_by: String,
}

/// One ready sandbox of a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The sandbox.
    pub id: String,
    /// Its pool.
    pub pool: String,
    /// When it became ready, ms since the epoch.
    pub ready_ms: i64,
}

fn def(r: &rusqlite::Row<'_>) -> rusqlite::Result<PoolDef> {
    Ok(PoolDef {
        name: r.get(0)?,
        snapshot: r.get(1)?,
        template: r.get(2)?,
        size: r.get(3)?,
        paused: r.get(4)?,
        max_idle_ms: r.get(5)?,
        created_ms: r.get(6)?,
        created_by: r.get(7)?,
    })
}

const DEF_COLUMNS: &str = "name, snapshot, template, size, paused, max_idle_ms, created_ms, created_by";

impl ServiceDb {
    /// Creates the pool tables when missing.
    pub fn pool_schema(&self) -> DbResult<()> {
        self.conn().execute_batch(SCHEMA)
    }

    /// Records a new pool; false when one of that name exists.
    pub fn pool_insert(&self, p: &PoolDef) -> DbResult<bool> {
        let n = self.conn().execute(
            &format!("INSERT OR IGNORE INTO pools({DEF_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"),
            params![
                p.name,
                p.snapshot,
                p.template,
                p.size,
                p.paused,
                p.max_idle_ms,
                p.created_ms,
                p.created_by
            ],
        )?;
        Ok(n == 1)
    }

    /// One pool.
    pub fn pool(&self, name: &str) -> DbResult<Option<PoolDef>> {
        self.conn()
            .query_row(&format!("SELECT {DEF_COLUMNS} FROM pools WHERE name = ?1"), [name], def)
            .optional()
    }

    /// Every pool, by name.
    pub fn pools(&self) -> DbResult<Vec<PoolDef>> {
        let mut st = self.conn().prepare(&format!("SELECT {DEF_COLUMNS} FROM pools ORDER BY name"))?;
        let rows = st.query_map([], def)?;
        rows.collect()
    }

    /// Changes a pool's size and idle age (`None` keeps the one it has); false when there is
    /// no such pool.
    pub fn pool_update(&self, name: &str, size: Option<u32>, max_idle_ms: Option<i64>) -> DbResult<bool> {
        let n = self.conn().execute(
            "UPDATE pools SET size = COALESCE(?2, size), max_idle_ms = COALESCE(?3, max_idle_ms) WHERE name = ?1",
            params![name, size, max_idle_ms],
        )?;
        Ok(n == 1)
    }

    /// Forgets a pool and its members (the caller destroys their sandboxes); false when there
    /// was no such pool.
    pub fn pool_delete(&self, name: &str) -> DbResult<bool> {
        self.conn().execute("DELETE FROM pool_members WHERE pool = ?1", [name])?;
        Ok(self.conn().execute("DELETE FROM pools WHERE name = ?1", [name])? == 1)
    }

    /// Records a ready sandbox of a pool.
    pub fn member_add(&self, m: &Member) -> DbResult<()> {
        self.conn().execute(
            "INSERT OR REPLACE INTO pool_members(id, pool, ready_ms) VALUES (?1, ?2, ?3)",
            params![m.id, m.pool, m.ready_ms],
        )?;
        Ok(())
    }

    /// A pool's ready sandboxes, oldest first.
    pub fn members(&self, pool: &str) -> DbResult<Vec<Member>> {
        let mut st = self
            .conn()
            .prepare("SELECT id, pool, ready_ms FROM pool_members WHERE pool = ?1 ORDER BY ready_ms, id")?;
        let rows =
            st.query_map([pool], |r| Ok(Member { id: r.get(0)?, pool: r.get(1)?, ready_ms: r.get(2)? }))?;
        rows.collect()
    }

    /// Every pooled sandbox's id, whatever its pool.
    pub fn member_ids(&self) -> DbResult<std::collections::BTreeSet<String>> {
        let mut st = self.conn().prepare("SELECT id FROM pool_members")?;
        let rows = st.query_map([], |r| r.get(0))?;
        rows.collect()
    }

    /// Takes the oldest ready sandbox out of a pool; it is then no longer pooled.
    pub fn member_take(&self, pool: &str) -> DbResult<Option<Member>> {
        let Some(m) = self.members(pool)?.into_iter().next() else { return Ok(None) };
        self.member_remove(&m.id)?;
        Ok(Some(m))
    }

    /// Drops a sandbox from its pool's records; false when it was not pooled (any more): a
    /// claim took it first, and only the one who removed it may act on it.
    pub fn member_remove(&self, id: &str) -> DbResult<bool> {
        Ok(self.conn().execute("DELETE FROM pool_members WHERE id = ?1", [id])? == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> (tempfile::TempDir, ServiceDb) {
        let dir = tempfile::tempdir().unwrap();
        let db = ServiceDb::open(&dir.path().join("service.db")).unwrap();
        db.pool_schema().unwrap();
        (dir, db)
    }

    fn pool(name: &str) -> PoolDef {
        PoolDef {
            name: name.into(),
            snapshot: Some("warm".into()),
            template: None,
            size: 2,
            paused: true,
            max_idle_ms: 60_000,
            created_ms: 1,
            created_by: "tok".into(),
        }
    }

    #[test]
    fn a_pool_name_is_taken_once_and_deleting_drops_its_members() {
        let (_d, db) = db();
        assert!(db.pool_insert(&pool("a")).unwrap());
        assert!(!db.pool_insert(&pool("a")).unwrap());
        db.member_add(&Member { id: "sbx-1".into(), pool: "a".into(), ready_ms: 5 }).unwrap();
        assert_eq!(db.pool("a").unwrap(), Some(pool("a")));
        assert!(db.pool_delete("a").unwrap());
        assert!(!db.pool_delete("a").unwrap());
        assert!(db.member_ids().unwrap().is_empty());
        assert_eq!(db.pools().unwrap(), vec![]);
    }

    #[test]
    fn an_update_changes_only_what_it_names_and_only_an_existing_pool() {
        let (_d, db) = db();
        db.pool_insert(&pool("a")).unwrap();
        db.pool_insert(&pool("b")).unwrap();
        assert!(db.pool_update("a", Some(5), None).unwrap());
        assert_eq!(db.pool("a").unwrap(), Some(PoolDef { size: 5, ..pool("a") }));
        assert!(db.pool_update("a", None, Some(1_000)).unwrap());
        assert_eq!(db.pool("a").unwrap(), Some(PoolDef { size: 5, max_idle_ms: 1_000, ..pool("a") }));
        assert_eq!(db.pool("b").unwrap(), Some(pool("b")), "another pool is left alone");
        assert!(!db.pool_update("missing", Some(1), None).unwrap());
        assert_eq!(db.pool("missing").unwrap(), None);
    }

    #[test]
    fn a_claim_takes_the_oldest_member_once() {
        let (_d, db) = db();
        db.pool_insert(&pool("a")).unwrap();
        db.member_add(&Member { id: "sbx-new".into(), pool: "a".into(), ready_ms: 9 }).unwrap();
        db.member_add(&Member { id: "sbx-old".into(), pool: "a".into(), ready_ms: 3 }).unwrap();
        db.member_add(&Member { id: "sbx-other".into(), pool: "b".into(), ready_ms: 1 }).unwrap();
        assert_eq!(db.member_take("a").unwrap().map(|m| m.id).as_deref(), Some("sbx-old"));
        assert_eq!(db.member_take("a").unwrap().map(|m| m.id).as_deref(), Some("sbx-new"));
        assert_eq!(db.member_take("a").unwrap(), None);
        assert_eq!(db.member_ids().unwrap().into_iter().collect::<Vec<_>>(), vec!["sbx-other".to_string()]);
    }
}
