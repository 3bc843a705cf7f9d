//! The one rule for names users give snapshots and refs, shared by the engine, the service,
//! the CLI (and mirrored in the Python SDK): a name can never be mistaken for a path or for an
//! id, so `restore NAME` and `/v1/snapshots/NAME` always mean exactly one thing.

use crate::ids::{SandboxId, SnapshotId};
use crate::Error;
use std::fmt;

/// Longest name, in bytes (UTF-8).
pub const MAX_NAME_BYTES: usize = 128;

/// What a name may be, for error messages and docs.
pub const NAME_RULE: &str = "1-128 bytes of printable characters without spaces or '/', not starting \
                             with '-', not '.' or '..', and not shaped like an id (snap-/sbx- and 16 hex digits)";

/// A snapshot name or ref name that passed [`Name::parse`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(String);

impl Name {
    /// Checks `s` against the naming rule; `what` ("snapshot name", "ref name") goes into the error.
    pub fn parse(what: &str, s: &str) -> Result<Name, Error> {
        let why = if s.is_empty() {
            Some("it is empty".to_string())
        } else if s.len() > MAX_NAME_BYTES {
            Some(format!("it is {} bytes long, over the limit of {MAX_NAME_BYTES}", s.len()))
        } else if s == "." || s == ".." {
            Some("'.' and '..' are path components".to_string())
        } else if s.starts_with('-') {
            Some("a leading '-' reads as a command-line option".to_string())
        } else if let Some(c) = s.chars().find(|c| *c == '/' || c.is_control() || c.is_whitespace()) {
            Some(format!("it contains {c:?}"))
        } else if SnapshotId::parse(s).is_ok() || SandboxId::parse(s).is_ok() {
            Some("it has the shape of an id, so lookups would be ambiguous".to_string())
        } else {
            None
        };
        match why {
            None => Ok(Name(s.to_string())),
            Some(why) => Err(Error::InvalidInput(format!("invalid {what} {s:?}: {why}; use {NAME_RULE}"))),
        }
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Checks a reference to a snapshot (its id, its name or a ref) before it is looked up: an id,
/// or anything [`Name::parse`] accepts. Snapshots whose names predate the rule stay reachable
/// by id.
pub fn check_snapshot_ref(s: &str) -> Result<(), Error> {
    if SnapshotId::parse(s).is_ok() {
        return Ok(());
    }
    Name::parse("snapshot reference", s).map(drop).map_err(|_| {
        Error::InvalidInput(format!(
            "{s:?} is neither a snapshot id (snap-<16 hex digits>) nor a valid name ({NAME_RULE})"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_like_control_and_id_shaped_names_are_refused() {
        for bad in [
            "",
            ".",
            "..",
            "../../etc/passwd",
            "a/b",
            "/abs",
            "a\0b",
            "tab\there",
            "new\nline",
            "two words",
            "-rf",
            "snap-0123456789abcdef",
            "sbx-0123456789abcdef",
            &"x".repeat(MAX_NAME_BYTES + 1),
        ] {
            let e = Name::parse("ref name", bad).expect_err(bad);
            assert!(e.to_string().contains("invalid ref name"), "{e}");
            if bad != "snap-0123456789abcdef" {
                assert!(check_snapshot_ref(bad).is_err(), "{bad:?} accepted as a reference");
            }
        }
    }

    #[test]
    fn ordinary_names_and_ids_pass() {
        for good in ["warm", "v1.0", "a..b", ".hidden", "snap-named", "café", &"x".repeat(MAX_NAME_BYTES)] {
            assert_eq!(Name::parse("snapshot name", good).expect(good).as_str(), good);
            check_snapshot_ref(good).expect(good);
        }
        check_snapshot_ref("snap-0123456789abcdef").expect("an id is a reference");
    }

    #[test]
    fn the_error_names_the_input_and_the_limit() {
        let e = Name::parse("snapshot name", &"y".repeat(200)).unwrap_err().to_string();
        assert!(e.contains("200 bytes") && e.contains("128"), "{e}");
    }
}
