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

/// The sandbox's disk chain in its store.
pub(crate) const DISK_CHAIN: &str = "root";

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

/// The last lines of the guest's serial log, joined with " / ", or a note that it is empty.
pub(crate) fn serial_tail(dir: &Path) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let path = serial_log(dir);
    let mut bytes = Vec::new();
    if let Ok(mut f) = std::fs::File::open(&path) {
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
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let control = control(dir);
    let ours = cmdline.split(|b| *b == 0).any(|arg| arg == control.as_os_str().as_encoded_bytes());
    (ours && running(pid)).then_some(pid)
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
        assert!(serial_tail(dir.path()).contains("is empty"));
        let mut log: Vec<u8> = (0..40).flat_map(|i| format!("line {i}\r\n").into_bytes()).collect();
        log.extend_from_slice(b"\x1b[2Jcleared\xff\n");
        std::fs::write(serial_log(dir.path()), log).unwrap();
        let tail = serial_tail(dir.path());
        assert!(tail.ends_with("line 38 / line 39 / ?[2Jcleared\u{fffd}"), "{tail}");
        assert!(!tail.contains("line 28 "), "only the last {TAIL_LINES} lines: {tail}");
        assert!(!tail.chars().any(char::is_control), "{tail:?}");
    }
}
