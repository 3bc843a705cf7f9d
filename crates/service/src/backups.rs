//! The metadata databases under branchboxd: checked before the service opens them, copied to
//! `<name>.backup` within [`INTERVAL`] of every change (by the service or by a `branchbox`
//! command on the same directory) and once more at stop, so a corrupt store costs at most the
//! last few seconds and never the lineage (docs/architecture.md, "Metadata store").

use branchbox_store::file;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often the databases are looked at for changes to copy.
pub const INTERVAL: Duration = Duration::from_secs(2);

/// The databases of the data directory `data` whose service directory is `service`.
pub fn databases(data: &Path, service: &Path) -> [PathBuf; 2] {
    [data.join("meta.db"), service.join("service.db")]
}

/// Runs SQLite's structural check over every database that exists; the error names the file,
/// its backup and what to do.
pub fn check(dbs: &[PathBuf]) -> Result<(), String> {
    dbs.iter().filter(|db| db.exists()).try_for_each(|db| file::check(db))
}

/// Copies every database that changed since its last copy; a failure is logged, and the
/// previous copy stays.
pub fn backup_changed(dbs: &[PathBuf]) {
    for db in dbs.iter().filter(|db| db.exists() && file::changed_since_backup(db)) {
        if let Err(e) = file::backup(db) {
            tracing::warn!("cannot back up {}: {e}", db.display());
        }
    }
}

/// Copies the databases every [`INTERVAL`] while the service runs.
pub async fn run(dbs: [PathBuf; 2]) {
    loop {
        tokio::time::sleep(INTERVAL).await;
        let dbs = dbs.clone();
        let _ = tokio::task::spawn_blocking(move || backup_changed(&dbs)).await;
    }
}
