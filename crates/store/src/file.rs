//! How branchbox opens, checks and backs up a SQLite database file (`meta.db`, the service's
//! `service.db`), so that no code of ours can corrupt one behind SQLite's back.
//!
//! SQLite's locks on a database are POSIX advisory (`fcntl`) locks, and POSIX drops *every*
//! lock a process holds on a file when the process closes *any* descriptor of that file. A
//! descriptor that we open on a live database and close again therefore silently unlocks every
//! connection of this process to it: another process (a `branchbox ls` beside branchboxd) then
//! believes it holds the last connection, checkpoints and deletes the write-ahead log under a
//! writer that goes on appending to it, and later checkpoints land pages at the wrong offsets.
//! That is how a `meta.db` lost its first page (docs/architecture.md, "Metadata store"). So:
//!
//! - a database file is only ever created here with `O_CREAT | O_EXCL` (a brand-new inode that
//!   no connection can hold a lock on yet) and otherwise touched only by path (`chmod`) or
//!   through SQLite itself;
//! - every connection checks each b-tree cell as it reads it (`cell_size_check`), and
//!   [`check`] runs SQLite's own structural check (`quick_check`) where a whole-file pass is
//!   affordable (start of branchboxd, `branchbox doctor`, `branchbox store check`);
//! - [`backup`] copies a database through SQLite's online backup into `<name>.backup` (written
//!   beside it, checked, synced, renamed into place), so a corrupt store costs at most the
//!   changes since the last copy, never the lineage; [`restore`] puts that copy back.
//!
//! Not for: the tables themselves (`lib.rs` and its modules).

use rusqlite::{Connection, OpenFlags};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

/// How long a connection waits for another process's write lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// The file that holds the last good copy of the database at `path`.
pub fn backup_path(path: &Path) -> PathBuf {
    sibling(path, ".backup")
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Makes a SQLite database at `path` readable by its owner only (mode 0600), whatever the
/// umask: creates it with that mode when missing and tightens an existing one and its `-wal`
/// and `-shm` files. SQLite gives the files it creates beside a database the database's own
/// mode, so new `-wal`/`-shm` files come out 0600 as well.
///
/// An existing file is never opened here (see the module's doc: closing a descriptor of a
/// live database drops this process's SQLite locks on it); only a file that this call creates
/// itself, exclusively, is opened and closed.
pub fn make_private(path: &Path) -> std::io::Result<()> {
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(_new) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    for suffix in ["", "-wal", "-shm"] {
        match std::fs::set_permissions(sibling(path, suffix), std::fs::Permissions::from_mode(0o600)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// Opens the database at `path` (creating it, private) in WAL mode with every cell checked as
/// it is read. A file SQLite cannot read as a database is reported by [`explain`].
pub fn open(path: &Path) -> Result<Connection, String> {
    make_private(path).map_err(|e| format!("cannot create or make private {}: {e}", path.display()))?;
    let conn = Connection::open(path).map_err(|e| explain(path, &e))?;
    let setup = || -> rusqlite::Result<()> {
        conn.busy_timeout(BUSY_TIMEOUT)?;
        conn.pragma_update(None, "cell_size_check", true)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
    };
    setup().map_err(|e| explain(path, &e))?;
    use_wal(&conn, path)?;
    Ok(conn)
}

/// Puts the database in WAL mode (kept in the file, so this is a no-op after the first open).
///
/// SQLite answers `PRAGMA journal_mode=WAL` with "database is locked" at once, without its
/// busy handler, while another process holds the file (two commands opening a brand-new data
/// directory together, as two `branchbox remote pull`s did in CI), and answers with the old
/// mode when it could not switch. So: retried here, within the same [`BUSY_TIMEOUT`] as any
/// other lock.
fn use_wal(conn: &Connection, path: &Path) -> Result<(), String> {
    let started = std::time::Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        let outcome = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get::<_, String>(0));
        let busy = match &outcome {
            Ok(mode) if mode.eq_ignore_ascii_case("wal") => return Ok(()),
            Ok(_) => true,
            Err(e) => e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy),
        };
        if !busy || started.elapsed() >= BUSY_TIMEOUT {
            return Err(match outcome {
                Ok(mode) => format!("{}: cannot switch to WAL mode (still {mode})", path.display()),
                Err(e) => explain(path, &e),
            });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Whether `e` says the file is not (or no longer) a sound database.
pub fn is_corruption(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase)
    )
}

/// An error about the database at `path`; for corruption, a message that names the file, the
/// backup and what to do.
pub fn explain(path: &Path, e: &rusqlite::Error) -> String {
    if is_corruption(e) {
        corrupt_message(path, &e.to_string())
    } else {
        format!("{}: {e}", path.display())
    }
}

fn corrupt_message(path: &Path, what: &str) -> String {
    let backup = backup_path(path);
    let have = match std::fs::metadata(&backup).and_then(|m| m.modified()) {
        Ok(t) => format!("its last good copy is {} ({})", backup.display(), age(t)),
        Err(_) => format!("no backup exists at {}", backup.display()),
    };
    format!(
        "the metadata database {} is corrupt ({what}); {have}. Stop branchboxd and every branchbox command on this data directory, then run `branchbox store restore` to put the copy back (the corrupt file is kept beside it)",
        path.display()
    )
}

fn age(t: SystemTime) -> String {
    match t.elapsed() {
        Ok(d) => format!("written {} s ago", d.as_secs()),
        Err(_) => "written just now".to_string(),
    }
}

/// Runs SQLite's structural check of the whole file at `path` (`PRAGMA quick_check`); the
/// error names the file, the backup and what to do. The file is opened read-only and is not
/// created when missing.
pub fn check(path: &Path) -> Result<(), String> {
    let conn =
        Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
            .map_err(|e| explain(path, &e))?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(|e| explain(path, &e))?;
    let problems = quick_check(&conn).map_err(|e| explain(path, &e))?;
    if problems.is_empty() {
        Ok(())
    } else {
        Err(corrupt_message(path, &problems.join("; ")))
    }
}

/// The problems `quick_check` finds (at most the first 5), empty for a sound file.
fn quick_check(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare("PRAGMA quick_check(5)")?;
    let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
    let found = rows.collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(found.into_iter().filter(|r| r != "ok").collect())
}

/// Whether the database at `path` changed since its backup was written (its file or its
/// write-ahead log is newer), or it has no backup yet. Cheap: three `stat`s.
pub fn changed_since_backup(path: &Path) -> bool {
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let Some(backed) = mtime(&backup_path(path)) else { return mtime(path).is_some() };
    [mtime(path), mtime(&sibling(path, "-wal"))].into_iter().flatten().any(|t| t >= backed)
}

/// Copies the database at `path` into [`backup_path`] through SQLite's online backup (other
/// connections keep working), checks the copy, syncs it and renames it into place. A source
/// that fails the check leaves the previous backup as it was.
pub fn backup(path: &Path) -> Result<(), String> {
    let src =
        Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
            .map_err(|e| explain(path, &e))?;
    src.busy_timeout(BUSY_TIMEOUT).map_err(|e| explain(path, &e))?;
    let dest = backup_path(path);
    // A name of this copy's own: branchboxd and a command may back up the same file at once,
    // and each rename then puts one whole, checked copy in place.
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let tmp = sibling(
        path,
        &format!(".backup-new-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)),
    );
    let _ = std::fs::remove_file(&tmp);
    make_private(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    let copied = (|| -> rusqlite::Result<Vec<String>> {
        let mut out = Connection::open(&tmp)?;
        {
            let b = rusqlite::backup::Backup::new(&src, &mut out)?;
            b.run_to_completion(256, Duration::from_millis(5), None)?;
        }
        // The copy is a plain rollback-journal file: one file, nothing beside it to lose.
        out.pragma_update(None, "journal_mode", "DELETE")?;
        quick_check(&out)
    })();
    let result = match copied {
        Ok(problems) if problems.is_empty() => sync(&tmp)
            .and_then(|()| std::fs::rename(&tmp, &dest))
            .map_err(|e| format!("{}: {e}", dest.display())),
        Ok(problems) => Err(corrupt_message(path, &problems.join("; "))),
        Err(e) => Err(explain(path, &e)),
    };
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.and_then(|()| sync_dir(path))
}

/// Puts the backup of the database at `path` back: the current file (and its `-wal`/`-shm`)
/// is kept as `<name>.corrupt-<unix seconds>`, then the checked copy is renamed into place.
/// Returns the name the old file was kept under. Every process using the database must have
/// stopped first.
pub fn restore(path: &Path) -> Result<Option<PathBuf>, String> {
    let source = backup_path(path);
    if !source.exists() {
        return Err(format!(
            "there is no backup of {} to restore ({} is missing)",
            path.display(),
            source.display()
        ));
    }
    check(&source)?;
    let stamp = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let kept = sibling(path, &format!(".corrupt-{stamp}"));
    let mut moved = None;
    for suffix in ["", "-wal", "-shm"] {
        let from = sibling(path, suffix);
        if from.exists() {
            let to = sibling(&kept, suffix);
            std::fs::rename(&from, &to).map_err(|e| format!("cannot move {} aside: {e}", from.display()))?;
            if suffix.is_empty() {
                moved = Some(to);
            }
        }
    }
    let staged = sibling(path, ".restoring");
    std::fs::copy(&source, &staged).map_err(|e| format!("cannot copy {}: {e}", source.display()))?;
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| sync(&staged))
        .and_then(|()| std::fs::rename(&staged, path))
        .map_err(|e| format!("cannot put the backup in place at {}: {e}", path.display()))?;
    sync_dir(path)?;
    Ok(moved)
}

fn sync(path: &Path) -> std::io::Result<()> {
    std::fs::File::open(path)?.sync_all()
}

fn sync_dir(path: &Path) -> Result<(), String> {
    let dir = path.parent().unwrap_or(Path::new("."));
    sync(dir).map_err(|e| format!("cannot sync {}: {e}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(dir: &Path) -> PathBuf {
        let path = dir.join("meta.db");
        let conn = open(&path).unwrap();
        conn.execute_batch("CREATE TABLE t(x TEXT); INSERT INTO t VALUES ('lineage');").unwrap();
        path
    }

    fn rows(path: &Path) -> Vec<String> {
        let conn = open(path).unwrap();
        let mut stmt = conn.prepare("SELECT x FROM t").unwrap();
        let rows = stmt.query_map([], |r| r.get(0)).unwrap();
        rows.map(Result::unwrap).collect()
    }

    #[test]
    fn a_new_database_opened_by_several_at_once_opens_for_each() {
        // SQLite refuses the switch to WAL at once while another connection holds the file;
        // without the retry about one round in fifty failed here.
        for _ in 0..200 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("meta.db");
            let start = std::sync::Barrier::new(4);
            std::thread::scope(|s| {
                let opened: Vec<_> = (0..4)
                    .map(|_| {
                        s.spawn(|| {
                            start.wait();
                            open(&path).and_then(|c| {
                                c.execute_batch("CREATE TABLE IF NOT EXISTS t(x)").map_err(|e| e.to_string())
                            })
                        })
                    })
                    .collect();
                for o in opened {
                    o.join().unwrap().unwrap();
                }
            });
        }
    }

    #[test]
    fn database_files_are_private_even_when_they_were_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.db");
        std::fs::write(&path, b"").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let conn = open(&path).unwrap();
        conn.execute_batch("CREATE TABLE t(x)").unwrap();
        for name in ["meta.db", "meta.db-wal", "meta.db-shm"] {
            let mode = std::fs::metadata(dir.path().join(name)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{name}");
        }
    }

    #[test]
    fn a_corrupt_first_page_is_refused_naming_the_file_and_the_backup() {
        let dir = tempfile::tempdir().unwrap();
        let path = filled(dir.path());
        backup(&path).unwrap();
        // What the damaged meta.db held: a b-tree leaf index page where the header belongs.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[..16].copy_from_slice(&[0x0a, 0, 0, 0, 1, 0x0f, 0xe8, 0, 0x0f, 0xe8, 0, 0, 0, 0, 0, 0]);
        std::fs::write(&path, &bytes).unwrap();
        let err = check(&path).unwrap_err();
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains(&backup_path(&path).display().to_string()), "{err}");
        assert!(err.contains("branchbox store restore"), "{err}");
        let opened = open(&path).and_then(|c| {
            c.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get::<_, i64>(0))
                .map_err(|e| explain(&path, &e))
        });
        assert!(opened.unwrap_err().contains("is corrupt"));
    }

    #[test]
    fn restore_puts_the_last_backup_back_and_keeps_the_corrupt_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = filled(dir.path());
        backup(&path).unwrap();
        std::fs::write(&path, vec![0x0a; 8192]).unwrap();
        assert!(check(&path).is_err());
        let kept = restore(&path).unwrap().unwrap();
        assert_eq!(std::fs::read(&kept).unwrap(), vec![0x0a; 8192]);
        check(&path).unwrap();
        assert_eq!(rows(&path), ["lineage"]);
    }

    #[test]
    fn a_backup_is_taken_only_when_the_database_changed() {
        let dir = tempfile::tempdir().unwrap();
        let path = filled(dir.path());
        assert!(changed_since_backup(&path));
        backup(&path).unwrap();
        assert!(!changed_since_backup(&path));
        // Past the file system's timestamp granularity.
        std::thread::sleep(Duration::from_millis(20));
        open(&path).unwrap().execute("INSERT INTO t VALUES ('more')", []).unwrap();
        assert!(changed_since_backup(&path));
        backup(&path).unwrap();
        assert_eq!(rows(&backup_path(&path)).len(), 2);
    }

    #[test]
    fn a_corrupt_source_never_replaces_a_good_backup() {
        let dir = tempfile::tempdir().unwrap();
        let path = filled(dir.path());
        backup(&path).unwrap();
        let good = std::fs::read(backup_path(&path)).unwrap();
        std::fs::write(&path, vec![0x0a; 8192]).unwrap();
        assert!(backup(&path).is_err());
        assert_eq!(std::fs::read(backup_path(&path)).unwrap(), good);
    }

    #[test]
    fn restore_without_a_backup_says_so_and_touches_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = filled(dir.path());
        let err = restore(&path).unwrap_err();
        assert!(err.contains("no backup"), "{err}");
        assert_eq!(rows(&path), ["lineage"]);
    }
}
