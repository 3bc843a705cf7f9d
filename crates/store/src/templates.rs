//! Templates, their step cache and exec defaults. Records are JSON the engine owns; the store
//! keeps them by name or key and never interprets them.

use super::{db, Store};
use branchbox_model::Result;
use rusqlite::{params, OptionalExtension};

impl Store {
    /// Records a template (replacing one of that name).
    pub fn put_template(&self, name: &str, record: &str, when_ms: i64) -> Result<()> {
        self.conn
            .execute(
                "INSERT INTO templates(name, record, updated_ms) VALUES (?1, ?2, ?3) \
                 ON CONFLICT(name) DO UPDATE SET record = ?2, updated_ms = ?3",
                params![name, record, when_ms],
            )
            .map(drop)
            .map_err(db)
    }

    /// A template's record, if there is one.
    pub fn template(&self, name: &str) -> Result<Option<String>> {
        self.conn
            .query_row("SELECT record FROM templates WHERE name = ?1", [name], |r| r.get(0))
            .optional()
            .map_err(db)
    }

    /// Every template record, by name.
    pub fn templates(&self) -> Result<Vec<(String, String)>> {
        let mut st = self.conn.prepare("SELECT name, record FROM templates ORDER BY name").map_err(db)?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).map_err(db)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(db)
    }

    /// Forgets a template; false when there was none.
    pub fn delete_template(&self, name: &str) -> Result<bool> {
        self.conn.execute("DELETE FROM templates WHERE name = ?1", [name]).map(|n| n > 0).map_err(db)
    }

    /// The snapshot cached for a chain key.
    pub fn step_snapshot(&self, key: &str) -> Result<Option<String>> {
        self.conn
            .query_row("SELECT snapshot FROM template_steps WHERE key = ?1", [key], |r| r.get(0))
            .optional()
            .map_err(db)
    }

    /// Caches `snapshot` as the result of the step with chain key `key`.
    pub fn put_step(&self, key: &str, snapshot: &str, when_ms: i64) -> Result<()> {
        self.conn
            .execute(
                "INSERT INTO template_steps(key, snapshot, created_ms) VALUES (?1, ?2, ?3) \
                 ON CONFLICT(key) DO UPDATE SET snapshot = ?2, created_ms = ?3",
                params![key, snapshot, when_ms],
            )
            .map(drop)
            .map_err(db)
    }

    /// Every cached step as (key, snapshot).
    pub fn steps(&self) -> Result<Vec<(String, String)>> {
        let mut st =
            self.conn.prepare("SELECT key, snapshot FROM template_steps ORDER BY key").map_err(db)?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).map_err(db)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(db)
    }

    /// Drops a cached step.
    pub fn delete_step(&self, key: &str) -> Result<()> {
        self.conn.execute("DELETE FROM template_steps WHERE key = ?1", [key]).map(drop).map_err(db)
    }

    /// True when a cached step is this snapshot.
    pub fn is_step_snapshot(&self, snapshot: &str) -> Result<bool> {
        self.conn
            .query_row("SELECT EXISTS(SELECT 1 FROM template_steps WHERE snapshot = ?1)", [snapshot], |r| {
                r.get(0)
            })
            .map_err(db)
    }

    /// Sets the exec defaults (JSON) of a sandbox or snapshot.
    pub fn set_exec_defaults(&self, owner: &str, defaults: &str) -> Result<()> {
        self.conn
            .execute(
                "INSERT INTO exec_defaults(owner, defaults) VALUES (?1, ?2) \
                 ON CONFLICT(owner) DO UPDATE SET defaults = ?2",
                params![owner, defaults],
            )
            .map(drop)
            .map_err(db)
    }

    /// The exec defaults (JSON) of a sandbox or snapshot, if it has any.
    pub fn exec_defaults(&self, owner: &str) -> Result<Option<String>> {
        self.conn
            .query_row("SELECT defaults FROM exec_defaults WHERE owner = ?1", [owner], |r| r.get(0))
            .optional()
            .map_err(db)
    }
}

#[cfg(test)]
mod tests {
    use crate::Store;

    #[test]
    fn templates_steps_and_defaults_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("meta.db")).unwrap();
        store.put_template("t", "{\"v\":1}", 1).unwrap();
        store.put_template("t", "{\"v\":2}", 2).unwrap();
        assert_eq!(store.template("t").unwrap().as_deref(), Some("{\"v\":2}"));
        assert_eq!(store.templates().unwrap().len(), 1);
        store.put_step("k1", "snap-0000000000000001", 3).unwrap();
        assert!(store.is_step_snapshot("snap-0000000000000001").unwrap());
        assert_eq!(store.step_snapshot("k1").unwrap().as_deref(), Some("snap-0000000000000001"));
        store.delete_step("k1").unwrap();
        assert!(!store.is_step_snapshot("snap-0000000000000001").unwrap());
        store.set_exec_defaults("sbx-0000000000000001", "{}").unwrap();
        assert_eq!(store.exec_defaults("sbx-0000000000000001").unwrap().as_deref(), Some("{}"));
        assert!(store.delete_template("t").unwrap());
        assert!(!store.delete_template("t").unwrap());
    }
}
