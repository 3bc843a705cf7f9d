//! The small files the engine keeps beside a sandbox and the data directory, read bounded
//! because a sandbox's runtime can write some of them: a child's intent (`intent.json`), the
//! shim's end report (`ended.json`), and the audit log (`<data>/audit.log`). Reconciliation
//! ([`super::recover`]) and the fork-bomb flag ([`super::flag`]) read and append them.

use branchbox_model::{now_ms, Error, Result, Snapshot};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::path::Path;

/// The intent file in a child's directory.
const INTENT: &str = "intent.json";
/// Written by the shim when its container ends: `{"reason", "detail"}`.
const ENDED: &str = "ended.json";
/// Most bytes read of an intent or `ended.json` (both are written small; anything larger is
/// not ours to trust).
const MAX_FILE_BYTES: u64 = 64 * 1024;
/// `audit.log` is moved to `audit.log.1` past this size, so it never grows without bound.
const AUDIT_MAX_BYTES: u64 = 1024 * 1024;
/// Most characters of a shim's `detail` kept in a lost reason.
const MAX_DETAIL_CHARS: usize = 200;

#[derive(Serialize, Deserialize)]
struct Intent {
    /// The snapshot the child starts from (for a fork, its record-to-be).
    snapshot: Snapshot,
}

#[derive(Deserialize)]
struct Ended {
    reason: String,
    #[serde(default)]
    detail: String,
}

/// Records what a child starts from, before it is started.
pub(super) fn write_intent(dir: &Path, snapshot: &Snapshot) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let path = dir.join(INTENT);
    let text = serde_json::to_vec(&Intent { snapshot: snapshot.clone() })
        .map_err(|e| Error::Backend(format!("cannot encode the intent of {}: {e}", dir.display())))?;
    std::fs::write(&path, text).map_err(|e| Error::io(&path, e))
}

/// What the child in `dir` starts from, when its intent was written and reads back whole.
pub(super) fn read_intent(dir: &Path) -> Option<Snapshot> {
    read_small(&dir.join(INTENT)).and_then(|b| serde_json::from_slice::<Intent>(&b).ok()).map(|i| i.snapshot)
}

pub(crate) fn read_small(path: &Path) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    std::fs::File::open(path).ok()?.take(MAX_FILE_BYTES).read_to_end(&mut buf).ok()?;
    Some(buf)
}

/// Why the sandbox in `dir` ended: the shim's `ended.json` when it left one, else "runtime gone".
pub(crate) fn end_reason(dir: &Path) -> String {
    let Some(ended) = read_small(&dir.join(ENDED)).and_then(|b| serde_json::from_slice::<Ended>(&b).ok())
    else {
        return "runtime gone".into();
    };
    // Written by a process that watched a hostile workload: keep it short and printable.
    let reason: String =
        ended.reason.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '_').take(32).collect();
    let detail: String = ended.detail.chars().filter(|c| !c.is_control()).take(MAX_DETAIL_CHARS).collect();
    match (reason.is_empty(), detail.is_empty()) {
        (true, _) => "runtime gone".into(),
        (false, true) => reason,
        (false, false) => format!("{reason}: {detail}"),
    }
}

/// Appends one JSON line to the audit log at `path` (moved to `.1` past its size limit).
pub(crate) fn append_audit(path: &Path, action: &str, what: &impl Serialize) {
    if std::fs::metadata(path).is_ok_and(|m| m.len() > AUDIT_MAX_BYTES) {
        let _ = std::fs::rename(path, path.with_extension("log.1"));
    }
    let line =
        serde_json::json!({ "at_ms": now_ms(), "pid": std::process::id(), "action": action, "report": what });
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
    if let Err(e) = written {
        eprintln!("branchbox: could not append to {}: {e}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shims_end_reason_is_read_bounded_and_cleaned() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(end_reason(dir.path()), "runtime gone");
        std::fs::write(dir.path().join(ENDED), r#"{"reason":"memory_limit","detail":"oom at 512 MiB"}"#)
            .unwrap();
        assert_eq!(end_reason(dir.path()), "memory_limit: oom at 512 MiB");
        let hostile = format!(r#"{{"reason":"x\u001b[2J","detail":"{}\n"}}"#, "d".repeat(5000));
        std::fs::write(dir.path().join(ENDED), hostile).unwrap();
        let r = end_reason(dir.path());
        assert!(r.starts_with("x2J: ") && r.len() <= 5 + MAX_DETAIL_CHARS, "{r}");
        std::fs::write(dir.path().join(ENDED), "not json").unwrap();
        assert_eq!(end_reason(dir.path()), "runtime gone");
    }
}
