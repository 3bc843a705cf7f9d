//! Flags a sandbox whose answers broke a limit the host enforces. An honest agent never sends
//! more than it was asked for, so such an answer means something in the sandbox forged the
//! agent's frames (docs/security.md): the call already failed, and the flag keeps the fact with
//! the sandbox (`ls`, the service's `flagged`, the SDK) and in the audit log.

use super::records::{append_audit, read_small};
use branchbox_model::{now_ms, SandboxId};
use branchbox_protocol::ViolationHook;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The flag in a sandbox's directory: the latest violation.
const FLAG: &str = "flagged.json";
/// Most characters of a violation kept in the flag.
const MAX_CHARS: usize = 300;

#[derive(Serialize, Deserialize)]
struct Flag {
    at_ms: i64,
    violation: String,
}

/// A hook that flags sandbox `id` (its directory `dir`) and audits it in `audit_log`.
pub(crate) fn hook(id: SandboxId, dir: PathBuf, audit_log: PathBuf) -> ViolationHook {
    Arc::new(move |e| {
        let violation: String = e.to_string().chars().take(MAX_CHARS).collect();
        let flag = Flag { at_ms: now_ms(), violation: violation.clone() };
        let tmp = dir.join(format!("{FLAG}.tmp"));
        let written = serde_json::to_vec(&flag)
            .map_err(std::io::Error::other)
            .and_then(|text| std::fs::write(&tmp, text))
            .and_then(|()| std::fs::rename(&tmp, dir.join(FLAG)));
        if let Err(e) = written {
            eprintln!("branchbox: could not flag sandbox {id} in {}: {e}", dir.display());
        }
        append_audit(
            &audit_log,
            "sandbox.flagged",
            &serde_json::json!({"sandbox": id, "violation": violation}),
        );
    })
}

/// The violation the sandbox in `dir` was flagged for, if any (read bounded, kept printable:
/// the directory is the host's, but the text quotes what the sandbox did).
pub(crate) fn read(dir: &Path) -> Option<String> {
    let flag: Flag = serde_json::from_slice(&read_small(&dir.join(FLAG))?).ok()?;
    Some(flag.violation.chars().filter(|c| !c.is_control()).take(MAX_CHARS).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use branchbox_protocol::ClientError;

    #[test]
    fn a_violation_flags_the_sandbox_and_is_audited() {
        let dir = tempfile::tempdir().unwrap();
        let audit = dir.path().join("audit.log");
        assert_eq!(read(dir.path()), None);
        let id = SandboxId::generate();
        hook(id.clone(), dir.path().to_path_buf(), audit.clone())(&ClientError::LimitExceeded {
            what: "the command's output",
            limit: 16,
        });
        let flagged = read(dir.path()).expect("flagged");
        assert!(flagged.contains("the command's output went over the host's limit of 16 bytes"), "{flagged}");
        let line = std::fs::read_to_string(&audit).unwrap();
        assert!(line.contains("sandbox.flagged") && line.contains(id.as_str()), "{line}");
    }
}
