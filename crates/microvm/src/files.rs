//! A microvm sandbox's runtime files, all in its directory: the VMM's control socket, pid
//! and log, the vsock device's socket, the guest's serial log and the disk's layer store.

use branchbox_model::{Error, Result};
use std::path::{Path, PathBuf};

/// Unix socket paths must fit `sockaddr_un` (108 bytes with the terminator).
const MAX_SOCKET_PATH: usize = 107;
/// Lines of the serial log an error quotes.
const TAIL_LINES: usize = 12;
/// Bytes read from the end of the serial log for its tail (the log itself is capped at 8 MiB).
const TAIL_BYTES: u64 = 16 * 1024;

/// The VMM's control socket.
pub(crate) fn control(dir: &Path) -> PathBuf {
    dir.join("vmm.sock")
}

/// The vsock device's host socket.
pub(crate) fn vsock(dir: &Path) -> PathBuf {
    dir.join("vsock.sock")
}

/// The guest's console.
pub(crate) fn serial_log(dir: &Path) -> PathBuf {
    dir.join("serial.log")
}

/// The VMM process's standard error.
pub(crate) fn vmm_log(dir: &Path) -> PathBuf {
    dir.join("vmm.log")
}

/// The VMM process's id.
pub(crate) fn pid_file(dir: &Path) -> PathBuf {
    dir.join("vmm.pid")
}

/// The layer store of the guest's disk: its chain's top layer over the root disk, and the
/// frozen chains its snapshots record.
pub(crate) fn disk_store(dir: &Path) -> PathBuf {
    dir.join("disk")
}

/// The sandbox's disk chain in its store, as booted or restored.
pub(crate) const DISK_CHAIN: &str = "root";

/// Records the sandbox's current disk chain once a rollback has replaced [`DISK_CHAIN`] (each
/// rollback forks a new chain over the snapshot's frozen disk, `root-1`, `root-2`, ...).
fn chain_record(dir: &Path) -> PathBuf {
    dir.join("disk.chain")
}

/// The name of the sandbox's current disk chain.
pub(crate) fn current_chain(dir: &Path) -> Result<String> {
    let path = chain_record(dir);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let name = text.trim();
            chain_generation(name).map(|_| name.to_owned()).ok_or_else(|| {
                Error::Backend(format!("{} names no chain of this backend: {name:?}", path.display()))
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(DISK_CHAIN.into()),
        Err(e) => Err(Error::io(&path, e)),
    }
}

/// `root` is generation 0, `root-N` generation N.
fn chain_generation(name: &str) -> Option<u64> {
    match name.strip_prefix(DISK_CHAIN)? {
        "" => Some(0),
        rest => rest.strip_prefix('-')?.parse().ok().filter(|n| *n > 0),
    }
}

/// The chain a rollback forks after `current`.
pub(crate) fn next_chain(current: &str) -> Result<String> {
    chain_generation(current)
        .and_then(|n| n.checked_add(1))
        .map(|n| format!("{DISK_CHAIN}-{n}"))
        .ok_or_else(|| Error::Backend(format!("no chain follows {current:?}")))
}

/// Makes `name` the sandbox's current chain (written whole, then renamed into place).
pub(crate) fn record_chain(dir: &Path, name: &str) -> Result<()> {
    write_atomic(&chain_record(dir), name.as_bytes())
}

/// Replaces `path` with `bytes` in one rename, so a reader sees the old or the new content.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path)).map_err(|e| Error::io(path, e))
}

/// Refuses a sandbox directory whose sockets would not fit a socket address.
pub(crate) fn check_socket_paths(dir: &Path) -> Result<()> {
    for sock in [control(dir), vsock(dir)] {
        if sock.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(Error::InvalidInput(format!(
                "{} is {} bytes, over the {MAX_SOCKET_PATH}-byte limit of a Unix socket path; choose a shorter --data-dir",
                sock.display(),
                sock.as_os_str().len()
            )));
        }
    }
    Ok(())
}

/// The last lines of the guest's serial log at `path`, joined with " / ", or a note that it
/// is empty.
pub(crate) fn serial_tail(path: &Path) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let mut bytes = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)));
        let _ = f.take(TAIL_BYTES).read_to_end(&mut bytes);
    }
    // The guest writes this log: no control characters (terminal escapes) reach an error.
    let text: String = String::from_utf8_lossy(&bytes)
        .chars()
        .map(|c| if c.is_control() && c != '\n' { '?' } else { c })
        .collect();
    let lines: Vec<&str> =
        text.lines().map(|l| l.trim_end_matches(['?', ' '])).filter(|l| !l.is_empty()).collect();
    if lines.is_empty() {
        return format!("the serial log {} is empty", path.display());
    }
    format!(
        "serial log {} ends: {}",
        path.display(),
        lines[lines.len().saturating_sub(TAIL_LINES)..].join(" / ")
    )
}

/// The VMM's pid from its pid file, if it is still that sandbox's VMM (pids are reused: the
/// process's command line must name this directory's control socket).
pub(crate) fn our_vmm(dir: &Path) -> Option<i32> {
    let pid = std::fs::read_to_string(pid_file(dir)).ok()?.trim().parse::<i32>().ok()?;
    (names_control(pid, dir) && running(pid)).then_some(pid)
}

/// True when process `pid`'s command line names `dir`'s control socket (a VMM of this
/// sandbox: during a rollback two of them do).
pub(crate) fn names_control(pid: i32, dir: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
    let control = control(dir);
    cmdline.split(|b| *b == 0).any(|arg| arg == control.as_os_str().as_encoded_bytes())
}

/// True while process `pid` exists and has not yet ended (a zombie has). An exiting process
/// loses its command line before it ends: this still sees it.
pub(crate) fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_serial_tail_keeps_the_last_lines_without_control_characters() {
        let dir = tempfile::tempdir().unwrap();
        assert!(serial_tail(&serial_log(dir.path())).contains("is empty"));
        let mut log: Vec<u8> = (0..40).flat_map(|i| format!("line {i}\r\n").into_bytes()).collect();
        log.extend_from_slice(b"\x1b[2Jcleared\xff\n");
        std::fs::write(serial_log(dir.path()), log).unwrap();
        let tail = serial_tail(&serial_log(dir.path()));
        assert!(tail.ends_with("line 38 / line 39 / ?[2Jcleared\u{fffd}"), "{tail}");
        assert!(!tail.contains("line 28 "), "only the last {TAIL_LINES} lines: {tail}");
        assert!(!tail.chars().any(char::is_control), "{tail:?}");
    }

    #[test]
    fn each_rollback_names_the_next_chain_and_a_bad_record_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(current_chain(dir.path()).unwrap(), "root", "no record: the booted chain");
        assert_eq!(next_chain("root").unwrap(), "root-1");
        assert_eq!(next_chain("root-41").unwrap(), "root-42");
        record_chain(dir.path(), "root-7").unwrap();
        assert_eq!(current_chain(dir.path()).unwrap(), "root-7");
        for bad in ["", "root-0", "root-", "root-x", "other", "root-1/..", "root-18446744073709551616"] {
            std::fs::write(chain_record(dir.path()), bad).unwrap();
            assert!(current_chain(dir.path()).is_err(), "{bad:?} accepted");
            assert!(next_chain(bad).is_err(), "{bad:?} has a successor");
        }
        assert!(next_chain("root-18446744073709551615").is_err(), "the counter cannot wrap");
    }
}
