//! `branchbox store`: check the data directory's metadata databases, back them up, put the
//! backup back (docs/architecture.md, "Metadata store"). These run before the engine opens the
//! store, so they work on a store that the engine would refuse.

use crate::args::StoreCmd;
use crate::output::print;
use anyhow::{bail, Result};
use branchbox_store::file;
use std::path::{Path, PathBuf};

/// The metadata databases of the data directory at `data`: the engine's and, where a service
/// has run here, the service's.
fn databases(data: &Path) -> Vec<PathBuf> {
    let service = data.join("service").join("service.db");
    let mut dbs = vec![data.join("meta.db")];
    if service.exists() {
        dbs.push(service);
    }
    dbs
}

/// Each database with the result of SQLite's structural check; a missing engine database
/// (a data directory never used) counts as sound.
pub fn check_all(data: &Path) -> Vec<(PathBuf, Result<(), String>)> {
    databases(data)
        .into_iter()
        .map(|db| {
            let r = if db.exists() { file::check(&db) } else { Ok(()) };
            (db, r)
        })
        .collect()
}

/// Backs up every database of `data` that changed since its last backup; errors are reported
/// on stderr, never fatal: the command that ran already did its work.
pub fn backup_changed(data: &Path) {
    for db in databases(data) {
        if db.exists() && file::changed_since_backup(&db) {
            if let Err(e) = file::backup(&db) {
                eprintln!("branchbox: warning: cannot back up {}: {e}", db.display());
            }
        }
    }
}

/// Runs a `branchbox store` subcommand.
pub fn run(data: &Path, command: StoreCmd, json: bool) -> Result<i32> {
    match command {
        StoreCmd::Check => {
            let results = check_all(data);
            let bad = results.iter().filter(|(_, r)| r.is_err()).count();
            let v: Vec<_> = results
                .iter()
                .map(|(db, r)| {
                    serde_json::json!({"file": db, "ok": r.is_ok(), "error": r.as_ref().err(),
                                       "backup": file::backup_path(db).exists().then(|| file::backup_path(db))})
                })
                .collect();
            print(json, &v, || {
                results
                    .iter()
                    .map(|(db, r)| match r {
                        Ok(()) => format!("ok       {}", db.display()),
                        Err(e) => format!("corrupt  {e}"),
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            });
            Ok(if bad == 0 { 0 } else { 1 })
        }
        StoreCmd::Backup => {
            let mut done = Vec::new();
            for db in databases(data).into_iter().filter(|d| d.exists()) {
                file::backup(&db).map_err(anyhow::Error::msg)?;
                done.push(file::backup_path(&db));
            }
            print(json, &done, || {
                done.iter().map(|b| format!("backed up to {}", b.display())).collect::<Vec<_>>().join("\n")
            });
            Ok(0)
        }
        StoreCmd::Restore { force } => {
            if let Ok(url) = std::fs::read_to_string(data.join("service").join("url")) {
                if !force {
                    bail!(
                        "branchboxd seems to serve this data directory ({}); stop it first (or pass --force if it is gone)",
                        url.trim()
                    );
                }
            }
            let mut restored = Vec::new();
            for db in databases(data) {
                let sound = !db.exists() || file::check(&db).is_ok();
                if sound && !force {
                    continue;
                }
                let kept = file::restore(&db).map_err(anyhow::Error::msg)?;
                restored.push((db, kept));
            }
            let v: Vec<_> =
                restored.iter().map(|(db, kept)| serde_json::json!({"file": db, "kept_as": kept})).collect();
            print(json, &v, || {
                if restored.is_empty() {
                    "every database passed its check; nothing restored (--force restores anyway)".to_string()
                } else {
                    restored
                        .iter()
                        .map(|(db, kept)| match kept {
                            Some(k) => {
                                format!("restored {} (the old file is kept as {})", db.display(), k.display())
                            }
                            None => format!("restored {}", db.display()),
                        })
                        .collect::<Vec<_>>()
                        .join("\n")
                }
            });
            Ok(0)
        }
    }
}
