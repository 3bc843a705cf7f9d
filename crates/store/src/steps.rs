//! Step history: the command behind each checkpoint that step-history mode takes after a
//! command (`branchbox history ID on`), so a sandbox's checkpoints read as a timeline of what
//! was run. One row per checkpoint, keyed by its snapshot id.

use super::{conv, db, Store};
use branchbox_model::{Result, SandboxId, SnapshotId};
use rusqlite::{params, OptionalExtension, Row};

/// Longest command text kept, in bytes; a longer one is cut at a character boundary and ends
/// with `…`.
pub const MAX_STEP_COMMAND: usize = 1024;

/// A command run in step-history mode, and the checkpoint that followed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecStep {
    /// The checkpoint taken after the command.
    pub snapshot: SnapshotId,
    /// The sandbox it ran in.
    pub sandbox: SandboxId,
    /// The shell line, or the argv joined with spaces (quoted where needed), at most
    /// [`MAX_STEP_COMMAND`] bytes.
    pub command: String,
    /// Its exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// How long it ran.
    pub duration_ms: u64,
    /// When it ended, ms since the epoch.
    pub ended_ms: i64,
}

/// `text` cut to at most [`MAX_STEP_COMMAND`] bytes, at a character boundary, marked with `…`.
pub fn bounded_command(text: &str) -> String {
    if text.len() <= MAX_STEP_COMMAND {
        return text.to_string();
    }
    let mut end = MAX_STEP_COMMAND - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

const STEP_COLS: &str = "snapshot, sandbox, command, exit_code, signal, duration_ms, ended_ms";

fn step_row(r: &Row<'_>) -> rusqlite::Result<ExecStep> {
    Ok(ExecStep {
        snapshot: conv(SnapshotId::parse(&r.get::<_, String>(0)?))?,
        sandbox: conv(SandboxId::parse(&r.get::<_, String>(1)?))?,
        command: r.get(2)?,
        exit_code: r.get(3)?,
        signal: r.get(4)?,
        duration_ms: r.get::<_, i64>(5)?.max(0) as u64,
        ended_ms: r.get(6)?,
    })
}

impl Store {
    /// Records the step a checkpoint followed (its command cut to [`MAX_STEP_COMMAND`]).
    pub fn insert_step(&self, s: &ExecStep) -> Result<()> {
        self.conn
            .execute(
                &format!("INSERT OR REPLACE INTO steps({STEP_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"),
                params![
                    s.snapshot.as_str(),
                    s.sandbox.as_str(),
                    bounded_command(&s.command),
                    s.exit_code,
                    s.signal,
                    s.duration_ms.min(i64::MAX as u64) as i64,
                    s.ended_ms
                ],
            )
            .map(drop)
            .map_err(db)
    }

    /// The step a checkpoint followed, if it followed one.
    pub fn step(&self, snapshot: &SnapshotId) -> Result<Option<ExecStep>> {
        self.conn
            .query_row(
                &format!("SELECT {STEP_COLS} FROM steps WHERE snapshot = ?1"),
                [snapshot.as_str()],
                step_row,
            )
            .optional()
            .map_err(db)
    }

    /// Every step recorded for a sandbox, oldest first.
    pub fn steps_of(&self, sandbox: &SandboxId) -> Result<Vec<ExecStep>> {
        let mut st = self
            .conn
            .prepare(&format!("SELECT {STEP_COLS} FROM steps WHERE sandbox = ?1 ORDER BY ended_ms, snapshot"))
            .map_err(db)?;
        let rows = st.query_map([sandbox.as_str()], step_row).map_err(db)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(db)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use branchbox_model::{BackendKind, Limits, Sandbox, SandboxState, Snapshot, SnapshotKind};

    fn checkpoint_of(store: &Store, sandbox: &SandboxId, at: i64) -> SnapshotId {
        let snap = Snapshot {
            id: SnapshotId::generate(),
            parent: None,
            source: Some(sandbox.clone()),
            backend: BackendKind::Gvisor,
            image: "img-0123456789abcdef".into(),
            kind: SnapshotKind::Checkpoint,
            name: None,
            created_ms: at,
            size_bytes: 1,
            limits: Limits::default(),
            expires_ms: None,
            deleted_ms: None,
        };
        store.insert_snapshot(&snap).unwrap();
        snap.id
    }

    fn open() -> (tempfile::TempDir, Store, SandboxId) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("meta.db")).unwrap();
        let sb = Sandbox {
            id: SandboxId::generate(),
            backend: BackendKind::Gvisor,
            image: "img-0123456789abcdef".into(),
            state: SandboxState::Running,
            created_ms: 1,
            parent_snapshot: None,
            limits: Limits::default(),
            history: true,
        };
        store.insert_sandbox(&sb).unwrap();
        (dir, store, sb.id)
    }

    fn step(snapshot: &SnapshotId, sandbox: &SandboxId, command: &str, code: i32, ended_ms: i64) -> ExecStep {
        ExecStep {
            snapshot: snapshot.clone(),
            sandbox: sandbox.clone(),
            command: command.into(),
            exit_code: Some(code),
            signal: None,
            duration_ms: 12,
            ended_ms,
        }
    }

    #[test]
    fn steps_are_kept_per_checkpoint_in_order_and_go_with_the_snapshot() {
        let (_d, store, sb) = open();
        let (a, b) = (checkpoint_of(&store, &sb, 10), checkpoint_of(&store, &sb, 20));
        store.insert_step(&step(&b, &sb, "echo two > /root/two", 0, 20)).unwrap();
        store.insert_step(&step(&a, &sb, "false", 1, 10)).unwrap();
        let steps = store.steps_of(&sb).unwrap();
        assert_eq!(
            steps.iter().map(|s| s.command.as_str()).collect::<Vec<_>>(),
            ["false", "echo two > /root/two"]
        );
        assert_eq!(store.step(&a).unwrap(), Some(step(&a, &sb, "false", 1, 10)));
        assert_eq!(store.steps_of(&SandboxId::generate()).unwrap(), []);
        // A tombstone keeps its step (its place in the lineage stays); deleting the row drops it.
        store.tombstone_snapshot(&a, 30).unwrap();
        assert!(store.step(&a).unwrap().is_some());
        store.delete_snapshot(&a).unwrap();
        assert_eq!(store.step(&a).unwrap(), None);
        assert_eq!(store.steps_of(&sb).unwrap().len(), 1);
        assert_eq!(store.snapshots_of(&sb).unwrap().iter().map(|s| &s.id).collect::<Vec<_>>(), [&b]);
    }

    #[test]
    fn a_long_command_is_cut_at_a_character_boundary() {
        let (_d, store, sb) = open();
        let snap = checkpoint_of(&store, &sb, 10);
        let long = "é".repeat(MAX_STEP_COMMAND);
        store.insert_step(&step(&snap, &sb, &long, 0, 10)).unwrap();
        let kept = store.step(&snap).unwrap().unwrap().command;
        assert!(kept.len() <= MAX_STEP_COMMAND && kept.ends_with('…'), "{} bytes", kept.len());
        assert!(long.starts_with(kept.trim_end_matches('…')));
        assert_eq!(bounded_command("ls -l"), "ls -l");
    }

    #[test]
    fn a_database_from_before_the_steps_table_opens_and_gains_it() {
        let (dir, store, sb) = open();
        let snap = checkpoint_of(&store, &sb, 10);
        drop(store);
        let path = dir.path().join("meta.db");
        rusqlite::Connection::open(&path).unwrap().execute_batch("DROP TABLE steps").unwrap();
        let store = Store::open(&path).unwrap();
        assert_eq!(store.sandbox(&sb).unwrap().id, sb, "the older database's rows stay");
        store.insert_step(&step(&snap, &sb, "true", 0, 11)).unwrap();
        assert_eq!(store.steps_of(&sb).unwrap().len(), 1);
    }
}
