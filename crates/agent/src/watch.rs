//! Watching a directory with inotify: each change under it becomes one JSON line of a
//! [`WatchEvent`], sent in batches until the client cancels or the directory goes.

use crate::cancel::{cancelled, Token};
use crate::files::check_path;
use crate::Failure;
use branchbox_protocol::{ErrorCode, WatchEvent, WatchKind};
use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Most directories one recursive watch follows.
pub const MAX_WATCHED_DIRS: usize = 8192;
/// Renames of hidden write files awaiting their other half, and files written but not yet
/// closed, remembered at most.
const MAX_MOVES: usize = 1024;
/// Events sent per batch at most (one `data` frame).
const BATCH: usize = 256;

/// A write is reported for each `IN_MODIFY`, as envd's watcher (fsnotify) does; the close after
/// writing only when no modification of that file was seen (it was written before its
/// directory's watch began, as in a directory made and filled at once).
const MASK: u32 = libc::IN_CREATE
    | libc::IN_MODIFY
    | libc::IN_CLOSE_WRITE
    | libc::IN_DELETE
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_ATTRIB
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_ONLYDIR;

struct Watcher {
    fd: OwnedFd,
    dirs: HashMap<i32, PathBuf>,
    root: i32,
    recursive: bool,
}

impl Watcher {
    fn add(&mut self, dir: &Path) -> Result<i32, Failure> {
        if self.dirs.len() >= MAX_WATCHED_DIRS {
            return Err(Failure::new(
                ErrorCode::BadRequest,
                format!("more than {MAX_WATCHED_DIRS} directories to watch; watch a smaller tree"),
            ));
        }
        let c = CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| Failure::new(ErrorCode::BadRequest, "a path with NUL"))?;
        // SAFETY: a valid inotify fd and a NUL-terminated path.
        let wd = unsafe { libc::inotify_add_watch(self.fd.as_raw_fd(), c.as_ptr(), MASK) };
        if wd < 0 {
            return Err(Failure::io_at(std::io::Error::last_os_error(), dir));
        }
        self.dirs.insert(wd, dir.to_path_buf());
        Ok(wd)
    }

    /// Adds `dir` and, for a recursive watch, every directory below it (symlinks not followed);
    /// returns what it found below `dir`.
    fn add_tree(&mut self, dir: &Path) -> Result<Vec<PathBuf>, Failure> {
        let mut stack = vec![dir.to_path_buf()];
        let mut found = Vec::new();
        while let Some(d) = stack.pop() {
            self.add(&d)?;
            if !self.recursive {
                continue;
            }
            let Ok(entries) = std::fs::read_dir(&d) else { continue };
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
                found.push(e.path());
            }
        }
        Ok(found)
    }
}

fn kind_of(mask: u32) -> Option<WatchKind> {
    if mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0 {
        Some(WatchKind::Create)
    } else if mask & libc::IN_MODIFY != 0 {
        Some(WatchKind::Write)
    } else if mask & libc::IN_DELETE != 0 {
        Some(WatchKind::Remove)
    } else if mask & libc::IN_MOVED_FROM != 0 {
        Some(WatchKind::Rename)
    } else if mask & libc::IN_ATTRIB != 0 {
        Some(WatchKind::Chmod)
    } else {
        None
    }
}

/// Watches `root` until `token` is cancelled (an error the caller does not send: the client is
/// gone) or `root` itself is removed or moved (`Ok` with the number of events sent). An empty
/// chunk goes to `emit` once the watch is in place; then events, as JSON lines, in batches.
pub fn watch(
    root: &str,
    recursive: bool,
    token: &Token,
    emit: &mut dyn FnMut(&[u8]),
) -> Result<u64, Failure> {
    let root = check_path(root)?;
    let md = std::fs::metadata(&root).map_err(|e| Failure::io_at(e, &root))?;
    if !md.is_dir() {
        return Err(Failure::new(ErrorCode::BadRequest, format!("{} is not a directory", root.display())));
    }
    // SAFETY: plain syscall; the fd is owned below.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
    if fd < 0 {
        return Err(Failure::io(std::io::Error::last_os_error()));
    }
    // SAFETY: a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut w = Watcher { fd, dirs: HashMap::new(), root: -1, recursive };
    w.root = w.add(&root)?;
    w.add_tree(&root)?;
    // An empty chunk first: the watch is in place, so every change from now on is reported.
    emit(&[]);
    let mut buf = vec![0u8; 64 * 1024];
    let mut sent = 0u64;
    // Renames away from an atomic write's hidden file, by inotify cookie, until their other half.
    let mut moves: HashMap<u32, bool> = HashMap::new();
    // Files modified since their last close (whose close is then not reported again).
    let mut written: HashSet<PathBuf> = HashSet::new();
    loop {
        if token.is_cancelled() {
            return Err(cancelled());
        }
        let mut p = libc::pollfd { fd: w.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut p, 1, 200) } <= 0 {
            continue;
        }
        // SAFETY: reading into a buffer we own, at most its length.
        let n = unsafe { libc::read(w.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            continue;
        }
        let mut lines: Vec<u8> = Vec::new();
        let mut count = 0usize;
        let mut at = 0usize;
        let mut gone = false;
        let header = std::mem::size_of::<libc::inotify_event>();
        while at + header <= n as usize {
            // SAFETY: the kernel wrote whole events; read_unaligned copes with the byte buffer.
            let ev: libc::inotify_event = unsafe { std::ptr::read_unaligned(buf.as_ptr().add(at).cast()) };
            let name_at = at + header;
            let name_end = (name_at + ev.len as usize).min(n as usize);
            let raw = &buf[name_at..name_end];
            let name = &raw[..raw.iter().position(|b| *b == 0).unwrap_or(raw.len())];
            at = name_end;
            if ev.wd == w.root && ev.mask & (libc::IN_DELETE_SELF | libc::IN_MOVE_SELF) != 0 {
                gone = true;
                continue;
            }
            let Some(dir) = w.dirs.get(&ev.wd).cloned() else { continue };
            if ev.mask & libc::IN_IGNORED != 0 {
                w.dirs.remove(&ev.wd);
                continue;
            }
            if name.is_empty() {
                continue;
            }
            // The hidden file of the agent's own atomic write is not reported; its rename over
            // the file written is, as that file's write (and creation, when it was new).
            if let Some(replaces) = crate::files::temp_of(name) {
                if ev.mask & libc::IN_MOVED_FROM != 0 {
                    if moves.len() >= MAX_MOVES {
                        moves.clear();
                    }
                    moves.insert(ev.cookie, replaces);
                }
                continue;
            }
            let path = dir.join(std::ffi::OsStr::from_bytes(name));
            let moved_in = (ev.mask & libc::IN_MOVED_TO != 0).then(|| moves.remove(&ev.cookie)).flatten();
            let kinds = match moved_in {
                Some(true) => vec![WatchKind::Write],
                Some(false) => vec![WatchKind::Create, WatchKind::Write],
                None if ev.mask & libc::IN_CLOSE_WRITE != 0 => {
                    if written.remove(&path) {
                        Vec::new()
                    } else {
                        vec![WatchKind::Write]
                    }
                }
                None => {
                    let kind = kind_of(ev.mask);
                    if kind == Some(WatchKind::Write) {
                        if written.len() >= MAX_MOVES {
                            written.clear();
                        }
                        written.insert(path.clone());
                    }
                    kind.into_iter().collect()
                }
            };
            let Some(&kind) = kinds.first() else { continue };
            let shown = path.to_string_lossy().into_owned();
            let mut events: Vec<WatchEvent> =
                kinds.into_iter().map(|kind| WatchEvent { kind, name: shown.clone() }).collect();
            if recursive && ev.mask & libc::IN_ISDIR != 0 && kind == WatchKind::Create {
                // A directory made (or moved in) later is followed too. What was put in it
                // before its watch began is reported as created, so nothing made in it is
                // missed; past the cap, only its own event is.
                let found = w.add_tree(&path).unwrap_or_default();
                events.extend(
                    found.into_iter().map(|p| WatchEvent {
                        kind: WatchKind::Create,
                        name: p.to_string_lossy().into_owned(),
                    }),
                );
            }
            for event in events {
                if let Ok(line) = serde_json::to_vec(&event) {
                    lines.extend_from_slice(&line);
                    lines.push(b'\n');
                    count += 1;
                }
            }
            if count >= BATCH {
                emit(&lines);
                sent += count as u64;
                lines.clear();
                count = 0;
            }
        }
        if count > 0 {
            emit(&lines);
            sent += count as u64;
        }
        if gone {
            return Ok(sent);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cancel::Registry;
    use std::sync::mpsc;

    /// Watches `dir` on a thread, runs `act` once the watch is in place, and answers the events
    /// seen until the marker file `zz-end` is created.
    fn events_of(dir: &Path, act: impl FnOnce()) -> Vec<(WatchKind, String)> {
        let (reg, root) = (Registry::default(), dir.to_str().unwrap().to_string());
        let token = reg.start(1);
        let (tx, rx) = mpsc::channel::<Vec<u8>>();
        let t = std::thread::spawn(move || watch(&root, false, &token, &mut |c| drop(tx.send(c.to_vec()))));
        assert!(rx.recv().unwrap().is_empty(), "the watch was not in place first");
        act();
        std::fs::write(dir.join("zz-end"), b"").unwrap();
        let mut seen = Vec::new();
        while !seen.iter().any(|(_, n): &(WatchKind, String)| n.ends_with("zz-end")) {
            let chunk = rx.recv_timeout(std::time::Duration::from_secs(20)).expect("no events");
            for line in chunk.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                let e: WatchEvent = serde_json::from_slice(line).unwrap();
                seen.push((e.kind, e.name));
            }
        }
        reg.cancel(1);
        assert!(t.join().unwrap().is_err(), "a cancelled watch ends with the cancel");
        seen.retain(|(_, n)| !n.ends_with("zz-end"));
        seen
    }

    fn write(path: &Path, data: &[u8]) {
        let (tx, rx) = mpsc::sync_channel(2);
        tx.send(Some(data.to_vec())).unwrap();
        tx.send(None).unwrap();
        let t = crate::files::WriteTarget {
            path: path.to_str().unwrap(),
            mode: None,
            append: false,
            parents: false,
            user: None,
        };
        crate::files::write(&t, &rx, &crate::cancel::Token::default()).unwrap();
    }

    #[test]
    fn an_atomic_write_shows_only_the_files_own_create_and_write() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("f.txt");
        let name = f.to_str().unwrap().to_string();
        let seen = events_of(d.path(), || write(&f, b"one"));
        assert_eq!(seen, vec![(WatchKind::Create, name.clone()), (WatchKind::Write, name.clone())]);
        let seen = events_of(d.path(), || write(&f, b"two"));
        assert_eq!(seen, vec![(WatchKind::Write, name.clone())]);
        // A plain write is a write per modification, its close not reported again; a file
        // closed without a modification seen is reported written at its close.
        let g = d.path().join("g.txt");
        let gname = g.to_str().unwrap().to_string();
        let seen = events_of(d.path(), || std::fs::write(&g, b"plain").unwrap());
        assert_eq!(seen, vec![(WatchKind::Create, gname.clone()), (WatchKind::Write, gname.clone())]);
        let seen = events_of(d.path(), || drop(std::fs::OpenOptions::new().append(true).open(&g).unwrap()));
        assert_eq!(seen, vec![(WatchKind::Write, gname.clone())]);
        std::fs::remove_file(&g).unwrap();
        // Any other rename is reported as it happened.
        let seen = events_of(d.path(), || std::fs::rename(&f, d.path().join("g")).unwrap());
        assert_eq!(seen[0], (WatchKind::Rename, name));
        assert_eq!(seen[1].0, WatchKind::Create);
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 2, "a hidden file was left behind");
    }

    #[test]
    fn event_kinds_follow_the_masks() {
        assert_eq!(kind_of(libc::IN_CREATE | libc::IN_ISDIR), Some(WatchKind::Create));
        assert_eq!(kind_of(libc::IN_MOVED_TO), Some(WatchKind::Create));
        assert_eq!(kind_of(libc::IN_MODIFY), Some(WatchKind::Write));
        assert_eq!(kind_of(libc::IN_CLOSE_WRITE), None);
        assert_eq!(kind_of(libc::IN_DELETE), Some(WatchKind::Remove));
        assert_eq!(kind_of(libc::IN_MOVED_FROM), Some(WatchKind::Rename));
        assert_eq!(kind_of(libc::IN_ATTRIB), Some(WatchKind::Chmod));
        assert_eq!(kind_of(libc::IN_OPEN), None);
    }
}
