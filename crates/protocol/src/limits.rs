//! What the host accepts from an agent. The agent enforces its own caps too, but anything in
//! the sandbox can write to the agent's pipes (under gVisor, `/proc/1/fd/1`), so the host never
//! relies on them: a call whose answer breaks one of these limits ends with
//! [`crate::ClientError::LimitExceeded`] or [`crate::ClientError::Timeout`].

use std::time::Duration;

/// Output cap of a command whose spec sets none (stdout and stderr together): the one limit
/// the CLI, the service and the agent apply (docs/limits.md).
pub const DEFAULT_OUTPUT_CAP: u64 = crate::MAX_EXEC_OUTPUT;
/// Output a background process keeps per stream; `wait` returns at most this much of each.
pub const PROC_TAIL: usize = 1024 * 1024;
/// Most entries a walk returns.
pub const MAX_WALK_ENTRIES: u64 = 2_000_000;
/// Longest JSON line of one walk entry: a path of 4096 bytes, every byte escaped (`\u00XX`),
/// plus the other fields.
pub const MAX_WALK_LINE: usize = 6 * MAX_GUEST_PATH + 256;
/// Most bytes of a whole walk held by the host.
pub const MAX_WALK_BYTES: u64 = 256 * 1024 * 1024;
/// Longest path inside a sandbox a client may name (Linux's `PATH_MAX`).
pub const MAX_GUEST_PATH: usize = 4096;

/// Checks a path inside a sandbox as every host entry point takes one (the service, MCP):
/// absolute, at most [`MAX_GUEST_PATH`] bytes, no NUL. The error quotes at most 64 characters.
pub fn check_guest_path(p: &str) -> Result<(), String> {
    if !p.starts_with('/') || p.len() > MAX_GUEST_PATH || p.contains('\0') {
        return Err(format!(
            "path {:?} must be absolute (start with /), at most {MAX_GUEST_PATH} bytes, without NUL",
            p.chars().take(64).collect::<String>()
        ));
    }
    Ok(())
}

/// Room left in a request header for the shim, which replaces the client's request id with
/// its own (at most 20 digits).
pub const SHIM_HEADER_ROOM: usize = 64;

/// Host-side limits of one [`crate::AgentClient`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest wait for the next frame of a call's answer; `None` waits forever. A command or
    /// `wait` with a timeout of its own gets that timeout plus [`Limits::grace`] instead,
    /// whichever is longer.
    pub timeout: Option<Duration>,
    /// Added to a command's own timeout: the agent needs a moment to kill it and report.
    pub grace: Duration,
    /// Output cap of a command whose spec sets none.
    pub output_bytes: u64,
    /// Most bytes a file read delivers when the caller gives no maximum.
    pub file_bytes: u64,
    /// Most entries of a walk.
    pub walk_entries: u64,
    /// Most bytes of a walk's entries, together.
    pub walk_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout: Some(Duration::from_secs(60)),
            grace: Duration::from_secs(30),
            output_bytes: DEFAULT_OUTPUT_CAP,
            file_bytes: 1024 * 1024 * 1024,
            walk_entries: MAX_WALK_ENTRIES,
            walk_bytes: MAX_WALK_BYTES,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_paths_are_absolute_bounded_and_without_nul() {
        assert!(check_guest_path("/root/a").is_ok());
        assert!(check_guest_path(&format!("/{}", "a".repeat(MAX_GUEST_PATH - 1))).is_ok());
        for bad in ["root/a", "", "/a\0b", &format!("/{}", "a".repeat(MAX_GUEST_PATH))] {
            assert!(check_guest_path(bad).is_err(), "{bad:?}");
        }
        let e = check_guest_path(&format!("x{}", "a".repeat(5000))).unwrap_err();
        assert!(e.len() < 200, "the error quotes the whole path: {e}");
    }
}
