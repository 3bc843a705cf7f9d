//! Differences between the files of two snapshots.
//!
//! A gVisor snapshot keeps its files inside the checkpoint's in-memory overlay, which only
//! gVisor can read. So the first diff of a snapshot starts it once, headless, walks its tree
//! through the agent and stores the listing as `manifest.json` beside the checkpoint; every
//! later diff reads the stored listings only. A file counts as changed when its type, size,
//! permissions or modification time differ; a directory when its type or permissions do. The identity files the after-fork hook writes
//! (`/etc/machine-id`, `/etc/hostname`, `/run/branchbox`) are left out.
//!
//! A text diff of one file ([`file_diff`]) reads its contents from each side: the listing says
//! whether it is there, a regular file and small enough ([`MAX_TEXT_BYTES`]); only then is the
//! snapshot started headless to read it ([`Engine::snapshot_file`]). The diff is unified, made
//! with `similar`; a side that is binary, too large or not a regular file is reported as such
//! and no diff is made.

use crate::engine::{Engine, FileAt};
use branchbox_model::{Error, Result, SnapshotId};
use branchbox_protocol::{FileKind, FileStat};
use serde::Serialize;
use std::collections::BTreeMap;

/// Directories never walked: kernel views, not files.
pub const NOT_WALKED: [&str; 3] = ["/proc", "/sys", "/dev"];
/// Paths the after-fork hook rewrites in every copy.
const IDENTITY: [&str; 4] =
    ["/etc/machine-id", "/etc/hostname", "/run/branchbox", "/run/branchbox/sandbox-id"];

/// What changed from one snapshot to another.
#[derive(Debug, Serialize)]
pub struct Diff {
    /// The older side.
    pub from: SnapshotId,
    /// The newer side.
    pub to: SnapshotId,
    /// Paths only in `to`.
    pub added: Vec<String>,
    /// Paths only in `from`.
    pub removed: Vec<String>,
    /// Paths in both whose type, size, mode or mtime differ.
    pub changed: Vec<String>,
}

fn index(entries: Vec<FileStat>) -> BTreeMap<String, FileStat> {
    entries
        .into_iter()
        .filter(|e| !IDENTITY.contains(&e.name.as_str()))
        .map(|e| (e.name.clone(), e))
        .collect()
}

/// A directory changes with every entry added or removed below it, which the listing already
/// shows; directories count as changed only when their type or permissions do.
fn differs(o: &FileStat, n: &FileStat) -> bool {
    if o.kind == FileKind::Dir && n.kind == FileKind::Dir {
        return o.mode != n.mode;
    }
    (o.kind, o.size, o.mode, o.mtime_ns) != (n.kind, n.size, n.mode, n.mtime_ns)
}

/// Compares the files of two snapshots (ids, names or refs).
pub fn diff(engine: &Engine, from: &str, to: &str) -> Result<Diff> {
    let (a, b) = (engine.find_snapshot(from)?, engine.find_snapshot(to)?);
    for s in [&a, &b] {
        if s.deleted_ms.is_some() {
            return Err(Error::Conflict(format!("snapshot {} was deleted; its files are gone", s.id)));
        }
    }
    let (old, new) = (index(engine.manifest(&a)?), index(engine.manifest(&b)?));
    let added = new.keys().filter(|k| !old.contains_key(*k)).cloned().collect();
    let removed = old.keys().filter(|k| !new.contains_key(*k)).cloned().collect();
    let changed = new
        .iter()
        .filter(|(k, n)| old.get(*k).is_some_and(|o| differs(o, n)))
        .map(|(k, _)| k.clone())
        .collect();
    Ok(Diff { from: a.id, to: b.id, added, removed, changed })
}

/// Largest file whose contents a text diff reads, per side.
pub const MAX_TEXT_BYTES: u64 = 256 * 1024;
/// Longest a line diff may search before settling for a coarser (still correct) diff.
const DIFF_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// What one side of a file diff holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SideState {
    /// Text (UTF-8 without NUL bytes), diffed.
    Text,
    /// Nothing at that path (diffed as empty, like git's `/dev/null`).
    Absent,
    /// Bytes that are not UTF-8 text, or contain NUL.
    Binary,
    /// A regular file over [`MAX_TEXT_BYTES`].
    TooLarge,
    /// A directory, link or special file.
    NotRegular,
}

/// One side of a file diff.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Side {
    /// What it holds.
    pub state: SideState,
    /// Its size in bytes (absent for `absent` and `not_regular`).
    pub size: Option<u64>,
}

/// One file compared between two snapshots.
#[derive(Debug, Clone, Serialize)]
pub struct FileDiff {
    /// The older side.
    pub from: SnapshotId,
    /// The newer side.
    pub to: SnapshotId,
    /// The path compared.
    pub path: String,
    /// The file in `from`.
    pub old: Side,
    /// The file in `to`.
    pub new: Side,
    /// True when both sides are text (or absent) and equal.
    pub identical: bool,
    /// The unified diff (`---`/`+++` header, `@@` hunks), when both sides are text or absent
    /// and differ; `None` otherwise.
    pub unified: Option<String>,
    /// Lines only in `to`.
    pub added_lines: usize,
    /// Lines only in `from`.
    pub removed_lines: usize,
}

/// How one side reads: its state, and its text when it is text (`""` when absent).
fn read_side(at: &FileAt) -> (Side, Option<&str>) {
    match at {
        FileAt::Absent => (Side { state: SideState::Absent, size: None }, Some("")),
        FileAt::NotRegular(_) => (Side { state: SideState::NotRegular, size: None }, None),
        FileAt::TooLarge(n) => (Side { state: SideState::TooLarge, size: Some(*n) }, None),
        FileAt::Bytes(b) => match std::str::from_utf8(b) {
            Ok(t) if !t.contains('\0') => {
                (Side { state: SideState::Text, size: Some(b.len() as u64) }, Some(t))
            }
            _ => (Side { state: SideState::Binary, size: Some(b.len() as u64) }, None),
        },
    }
}

/// Compares one file's two sides, read already: a unified diff when both are text (or one is
/// absent), else the sides' states only.
pub fn text_diff(from: SnapshotId, to: SnapshotId, path: &str, old: &FileAt, new: &FileAt) -> FileDiff {
    let ((o, old_text), (n, new_text)) = (read_side(old), read_side(new));
    let mut d = FileDiff {
        from,
        to,
        path: path.to_string(),
        identical: false,
        unified: None,
        added_lines: 0,
        removed_lines: 0,
        old: o,
        new: n,
    };
    let (Some(a), Some(b)) = (old_text, new_text) else { return d };
    if d.old.state == SideState::Absent && d.new.state == SideState::Absent {
        return d;
    }
    if a == b {
        d.identical = true;
        return d;
    }
    let diff = similar::TextDiff::configure().timeout(DIFF_TIME).diff_lines(a, b);
    for c in diff.iter_all_changes() {
        match c.tag() {
            similar::ChangeTag::Insert => d.added_lines += 1,
            similar::ChangeTag::Delete => d.removed_lines += 1,
            similar::ChangeTag::Equal => {}
        }
    }
    let label = |state: SideState, id: &SnapshotId| {
        if state == SideState::Absent {
            "/dev/null".to_string()
        } else {
            format!("{id}:{path}")
        }
    };
    let (la, lb) = (label(d.old.state, &d.from), label(d.new.state, &d.to));
    d.unified =
        Some(diff.unified_diff().context_radius(3).missing_newline_hint(true).header(&la, &lb).to_string());
    d
}

/// Compares one file between two snapshots (ids, names or refs): reads it from each (see
/// [`Engine::snapshot_file`]) and diffs the text.
pub fn file_diff(engine: &Engine, from: &str, to: &str, path: &str) -> Result<FileDiff> {
    let (a, b) = (engine.find_snapshot(from)?, engine.find_snapshot(to)?);
    for s in [&a, &b] {
        if s.deleted_ms.is_some() {
            return Err(Error::Conflict(format!("snapshot {} was deleted; its files are gone", s.id)));
        }
    }
    let old = engine.snapshot_file(&a, path, MAX_TEXT_BYTES)?;
    let new = engine.snapshot_file(&b, path, MAX_TEXT_BYTES)?;
    Ok(text_diff(a.id, b.id, path, &old, &new))
}

#[cfg(test)]
mod tests {
    use super::*;
    use branchbox_protocol::FileKind;

    fn ids() -> (SnapshotId, SnapshotId) {
        (SnapshotId::generate(), SnapshotId::generate())
    }

    fn bytes(s: &str) -> FileAt {
        FileAt::Bytes(s.as_bytes().to_vec())
    }

    #[test]
    fn two_texts_give_a_unified_diff_with_their_lines_counted() {
        let (a, b) = ids();
        let d = text_diff(
            a.clone(),
            b.clone(),
            "/root/f.txt",
            &bytes("one\ntwo\nthree\n"),
            &bytes("one\n2\nthree\nfour\n"),
        );
        let u = d.unified.unwrap();
        assert!(u.starts_with(&format!("--- {a}:/root/f.txt\n+++ {b}:/root/f.txt\n@@ ")), "{u}");
        let lines: Vec<&str> = u.lines().collect();
        for want in ["-two", "+2", "+four", " one", " three"] {
            assert!(lines.contains(&want), "{want:?} missing from\n{u}");
        }
        assert_eq!((d.added_lines, d.removed_lines, d.identical), (2, 1, false));
        assert_eq!((d.old.state, d.new.state), (SideState::Text, SideState::Text));
    }

    #[test]
    fn an_added_file_is_diffed_against_nothing_and_equal_texts_have_no_diff() {
        let (a, b) = ids();
        let d = text_diff(a.clone(), b.clone(), "/x", &FileAt::Absent, &bytes("new\n"));
        assert_eq!(d.old, Side { state: SideState::Absent, size: None });
        let u = d.unified.unwrap();
        assert!(u.starts_with(&format!("--- /dev/null\n+++ {b}:/x\n")) && u.contains("\n+new\n"), "{u}");
        let same = text_diff(a.clone(), b.clone(), "/x", &bytes("same"), &bytes("same"));
        assert!(same.identical && same.unified.is_none());
        let neither = text_diff(a, b, "/x", &FileAt::Absent, &FileAt::Absent);
        assert!(!neither.identical && neither.unified.is_none());
    }

    #[test]
    fn binary_large_and_irregular_sides_are_named_and_not_diffed() {
        let (a, b) = ids();
        for (side, state, size) in [
            (FileAt::Bytes(vec![0, 159, 146, 150]), SideState::Binary, Some(4)),
            (FileAt::Bytes(b"a\0b".to_vec()), SideState::Binary, Some(3)),
            (FileAt::TooLarge(MAX_TEXT_BYTES + 1), SideState::TooLarge, Some(MAX_TEXT_BYTES + 1)),
            (FileAt::NotRegular(FileKind::Dir), SideState::NotRegular, None),
        ] {
            let d = text_diff(a.clone(), b.clone(), "/x", &bytes("text\n"), &side);
            assert_eq!(d.new, Side { state, size }, "{side:?}");
            assert_eq!(d.old.state, SideState::Text);
            assert!(d.unified.is_none() && !d.identical, "{side:?}");
        }
    }
}
