//! The shim's log, `shim.log`, capped and rotated. The container's standard error is the
//! shim's: anything in the sandbox can write to it (`/proc/1/fd/2`), so it goes through a pipe
//! that a thread drains into at most [`LOG_MAX`] bytes of `shim.log` plus one older file,
//! `shim.log.1`. A flood costs at most twice that on disk, and the newest lines stay.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Most bytes of one log file.
pub const LOG_MAX: u64 = 1024 * 1024;

/// The log file name in a sandbox directory.
pub const LOG_NAME: &str = "shim.log";

/// The rotated log's name for `log`.
pub fn older(log: &Path) -> PathBuf {
    let mut name = log.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

/// A log file that starts over, keeping one older file, when it would pass its cap.
pub struct RotatingLog {
    path: PathBuf,
    file: Option<File>,
    size: u64,
    max: u64,
}

impl RotatingLog {
    /// Appends to `path` (created when missing), rotating at `max` bytes.
    pub fn open(path: PathBuf, max: u64) -> Self {
        let file = OpenOptions::new().create(true).append(true).open(&path).ok();
        let size = file.as_ref().and_then(|f| f.metadata().ok()).map_or(0, |m| m.len());
        RotatingLog { path, file, size, max }
    }

    /// Writes `chunk`, rotating first when it would not fit. Failures are dropped: a log that
    /// cannot be written must not stop the sandbox.
    pub fn write(&mut self, mut chunk: &[u8]) {
        while !chunk.is_empty() {
            if self.size >= self.max {
                let _ = std::fs::rename(&self.path, older(&self.path));
                self.file = File::create(&self.path).ok();
                self.size = 0;
            }
            let n = chunk.len().min((self.max - self.size) as usize);
            if let Some(f) = self.file.as_mut() {
                let _ = f.write_all(&chunk[..n]);
            }
            self.size += n as u64;
            chunk = &chunk[n..];
        }
    }
}

/// The drained pipe and its log. Every read of the pipe happens under the lock, so
/// [`flush`] sees no chunk in flight.
struct Drain {
    reader: std::io::PipeReader,
    log: RotatingLog,
}

static DRAIN: OnceLock<Mutex<Drain>> = OnceLock::new();

impl Drain {
    /// Moves what the pipe holds now into the log.
    fn pump(&mut self, buf: &mut [u8]) {
        while let Ok(n) = self.reader.read(buf) {
            if n == 0 {
                break;
            }
            self.log.write(&buf[..n]);
        }
    }
}

fn drain() -> Option<MutexGuard<'static, Drain>> {
    DRAIN.get().map(|d| d.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Points this process's standard error, which runsc and so the container inherit, at a pipe
/// drained into a [`RotatingLog`] at `dir/shim.log`.
pub fn capture_stderr(dir: &Path) -> std::io::Result<()> {
    let (reader, writer) = std::io::pipe()?;
    let fd = reader.as_raw_fd();
    // SAFETY: fcntl and dup2 on descriptors we own; dup2 closes the old stderr.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0
            || libc::dup2(writer.as_raw_fd(), 2) < 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    drop(writer);
    let log = RotatingLog::open(dir.join(LOG_NAME), LOG_MAX);
    if DRAIN.set(Mutex::new(Drain { reader, log })).is_err() {
        return Err(std::io::Error::other("standard error is captured already"));
    }
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd; the reader lives in a static, so fd stays open.
            unsafe { libc::poll(&mut pfd, 1, -1) };
            match drain() {
                Some(mut d) => d.pump(&mut buf),
                None => return,
            }
        }
    });
    Ok(())
}

/// Writes what standard error holds now into the log; call it before exiting, so the last
/// words reach `shim.log`.
pub fn flush() {
    if let Some(mut d) = drain() {
        d.pump(&mut vec![0u8; 64 * 1024]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_keeps_two_capped_files_with_the_newest_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOG_NAME);
        let mut log = RotatingLog::open(path.clone(), 1000);
        for i in 0..10_000u32 {
            log.write(format!("line {i}\n").as_bytes());
        }
        let now = std::fs::read_to_string(&path).unwrap();
        let before = std::fs::read_to_string(older(&path)).unwrap();
        assert!(now.len() <= 1000 && before.len() == 1000, "{} and {}", now.len(), before.len());
        assert!(now.ends_with("line 9999\n"), "{now}");
        let mut big = RotatingLog::open(dir.path().join("big.log"), 1000);
        big.write(&[b'x'; 5000]);
        assert_eq!(std::fs::metadata(dir.path().join("big.log")).unwrap().len(), 1000);
    }
}
