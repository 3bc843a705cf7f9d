//! File operations. Paths must be absolute, at most 4096 bytes, without NUL; writes replace a
//! file atomically (temporary file in the same directory, then rename). An operation made for
//! an account of the image runs with that account's filesystem ids on its thread (see
//! [`crate::account::act_as`]), so the kernel allows and refuses exactly what the account's own
//! commands would get, and what it creates is the account's.

use crate::cancel::{cancelled, Token};
use crate::Failure;
use branchbox_protocol::{ErrorCode, FileKind, FileStat, CHUNK};
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;

/// Longest path accepted.
const MAX_PATH: usize = 4096;
/// The most of a pseudo-file (`/proc`, `/sys`) read when the host set no limit.
const MAX_PSEUDO_FILE: u64 = 16 << 20;
/// Most entries a listing returns.
pub const MAX_ENTRIES: usize = 100_000;

/// Checks a path from the host.
pub fn check_path(p: &str) -> Result<PathBuf, Failure> {
    if p.len() > MAX_PATH || p.contains('\0') || !p.starts_with('/') {
        return Err(Failure::new(
            ErrorCode::BadRequest,
            format!(
                "invalid path {:?}: give an absolute path without NUL, at most {MAX_PATH} bytes",
                truncate(p)
            ),
        ));
    }
    Ok(PathBuf::from(p))
}

fn truncate(p: &str) -> String {
    p.chars().take(200).collect()
}

fn stat_of(name: String, md: &fs::Metadata) -> FileStat {
    let ft = md.file_type();
    let kind = if ft.is_symlink() {
        FileKind::Symlink
    } else if ft.is_dir() {
        FileKind::Dir
    } else if ft.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    };
    FileStat {
        name,
        kind,
        size: md.len(),
        mode: md.mode() & 0o7777,
        mtime_ns: md.mtime().saturating_mul(1_000_000_000).saturating_add(md.mtime_nsec()),
        owner: None,
        group: None,
    }
}

/// [`stat_of`] with the owner's and group's names.
fn owned_stat(name: String, md: &fs::Metadata, names: &crate::account::Names) -> FileStat {
    FileStat { owner: Some(names.user(md.uid())), group: Some(names.group(md.gid())), ..stat_of(name, md) }
}

fn ctx(path: &Path) -> impl Fn(std::io::Error) -> Failure + '_ {
    move |e| Failure::io_at(e, path)
}

/// Runs `op` acting as the image's account `user`; as the agent (root) when `None`.
fn as_user<T>(user: Option<&str>, op: impl FnOnce() -> Result<T, Failure>) -> Result<T, Failure> {
    let _acting = match user {
        Some(u) => Some(crate::account::act_as(&crate::account::lookup(u)?)?),
        None => None,
    };
    op()
}

/// Streams a regular file in chunks to `emit`, at most the size it had when opened; returns
/// the bytes sent. Anything else is refused: a FIFO or a device such as `/dev/zero` could
/// block a worker or stream forever. Stops when `token` is cancelled. Opened as `user`.
pub fn read(
    path: &str,
    max: Option<u64>,
    user: Option<&str>,
    token: &Token,
    emit: &mut dyn FnMut(&[u8]),
) -> Result<u64, Failure> {
    as_user(user, || read_open(path, max, token, emit))
}

fn read_open(
    path: &str,
    max: Option<u64>,
    token: &Token,
    emit: &mut dyn FnMut(&[u8]),
) -> Result<u64, Failure> {
    let p = check_path(path)?;
    // Non-blocking, so that opening a FIFO returns at once instead of waiting for a writer; the
    // type is then checked on the descriptor opened, not on the path (which may change).
    let f = fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&p).map_err(ctx(&p))?;
    let md = f.metadata().map_err(ctx(&p))?;
    if md.is_dir() {
        return Err(Failure::new(ErrorCode::BadRequest, format!("{path} is a directory; use ls")));
    }
    if !md.is_file() {
        return Err(Failure::new(
            ErrorCode::BadRequest,
            format!(
                "{path} is not a regular file (a FIFO, socket or device); only regular files can be read"
            ),
        ));
    }
    let size = md.len();
    if size == 0 && (p.starts_with("/proc") || p.starts_with("/sys")) {
        return read_pseudo(&p, f, max.unwrap_or(MAX_PSEUDO_FILE), emit);
    }
    if let Some(max) = max.filter(|m| size > *m) {
        return Err(Failure::new(
            ErrorCode::BadRequest,
            format!("{path} has {size} bytes, over the limit of {max} bytes for this read"),
        ));
    }
    // A file that grows while it is read is cut at its size at open, so the host can rely on
    // the stat it may have taken first.
    let mut f = f.take(size);
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    loop {
        if token.is_cancelled() {
            return Err(cancelled());
        }
        let n = f.read(&mut buf).map_err(ctx(&p))?;
        if n == 0 {
            return Ok(total);
        }
        emit(&buf[..n]);
        total += n as u64;
    }
}

/// Kernel pseudo-files (procfs, sysfs) say they hold 0 bytes and are made as they are read:
/// such a file is read whole into memory first, at most `max` bytes (refused past that, as a
/// regular file is), then sent.
fn read_pseudo(p: &Path, f: fs::File, max: u64, emit: &mut dyn FnMut(&[u8])) -> Result<u64, Failure> {
    let mut data = Vec::new();
    f.take(max.saturating_add(1)).read_to_end(&mut data).map_err(ctx(p))?;
    if data.len() as u64 > max {
        return Err(Failure::new(
            ErrorCode::BadRequest,
            format!("{} has more than {max} bytes, over the limit for this read", p.display()),
        ));
    }
    for chunk in data.chunks(CHUNK) {
        emit(chunk);
    }
    Ok(data.len() as u64)
}

/// Where and how a `write_file` request writes.
pub struct WriteTarget<'a> {
    /// Absolute path.
    pub path: &'a str,
    /// Permission bits; 0o644 when absent.
    pub mode: Option<u32>,
    /// Append instead of replacing atomically.
    pub append: bool,
    /// Create missing parent directories.
    pub parents: bool,
    /// The image's account that writes the file and makes the directories (root when absent).
    pub user: Option<&'a str>,
}

/// Writes the chunks arriving on `chunks` (ended by `None`) to `target`. On failure the rest of
/// the stream is drained, so the connection stays in step. A cancelled write (its stream ends
/// without `eof`) leaves the file as it was.
pub fn write(
    target: &WriteTarget<'_>,
    chunks: &Receiver<Option<Vec<u8>>>,
    token: &Token,
) -> Result<u64, Failure> {
    let result = as_user(target.user, || write_stream(target, chunks, token));
    if result.is_err() {
        while let Ok(Some(_)) = chunks.recv() {}
    }
    result
}

fn write_stream(
    t: &WriteTarget<'_>,
    chunks: &Receiver<Option<Vec<u8>>>,
    token: &Token,
) -> Result<u64, Failure> {
    let (path, mode, append, parents) = (t.path, t.mode, t.append, t.parents);
    let p = check_path(path)?;
    let mode = mode.unwrap_or(0o644) & 0o7777;
    let dir = p.parent().ok_or_else(|| Failure::new(ErrorCode::BadRequest, "cannot write to /"))?;
    if parents {
        fs::create_dir_all(dir).map_err(ctx(dir))?;
    }
    let target = if append {
        p.clone()
    } else {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        dir.join(temp_name(&name, p.symlink_metadata().is_ok()))
    };
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .append(append)
        .truncate(!append)
        .mode(mode)
        .open(&target)
        // Name the path the user gave, not our hidden temporary file.
        .map_err(ctx(&p))?;
    let mut total = 0u64;
    let outcome = (|| {
        loop {
            match chunks.recv() {
                Ok(Some(chunk)) => {
                    f.write_all(&chunk).map_err(ctx(&p))?;
                    total += chunk.len() as u64;
                }
                Ok(None) => break,
                // The stream was dropped without `eof`: only a cancel does that.
                Err(_) => return Err(cancelled()),
            }
        }
        if token.is_cancelled() {
            return Err(cancelled());
        }
        f.flush().map_err(ctx(&p))?;
        Ok(total)
    })();
    // Closed before the rename, so a watcher sees the close under the hidden name.
    drop(f);
    let outcome = outcome.and_then(|total| {
        if !append {
            fs::set_permissions(&target, fs::Permissions::from_mode(mode)).map_err(ctx(&p))?;
            fs::rename(&target, &p).map_err(ctx(&p))?;
        }
        Ok(total)
    });
    if outcome.is_err() && !append {
        let _ = fs::remove_file(&target);
    }
    outcome
}

/// What marks the hidden file an atomic write goes through.
const TEMP_MARK: &str = ".branchbox-";

/// The hidden name an atomic write of `name` goes through before its rename over `name`.
/// `replaces` (a file of that name was there as the write began) is part of the name, so a
/// watcher can report the rename as the file's own events: its write, and its creation too
/// when it was not there (see [`temp_of`]).
fn temp_name(name: &str, replaces: bool) -> String {
    let kind = if replaces { 'w' } else { 'c' };
    format!(".{name}{TEMP_MARK}{kind}{}", std::process::id() ^ rand_suffix())
}

/// For the hidden name of an atomic write (a file name, no directory): `Some(replaces)`, as
/// [`temp_name`] made it; `None` for any other name.
pub fn temp_of(name: &[u8]) -> Option<bool> {
    let mark = TEMP_MARK.as_bytes();
    let at = name.windows(mark.len()).rposition(|w| w == mark)?;
    if name.first() != Some(&b'.') || at < 2 {
        return None;
    }
    let (kind, digits) = name[at + mark.len()..].split_first()?;
    if digits.is_empty() || digits.len() > 10 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    match kind {
        b'w' => Some(true),
        b'c' => Some(false),
        _ => None,
    }
}

fn rand_suffix() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: getrandom into a local buffer.
    unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    u32::from_ne_bytes(b)
}

/// Lists a directory as `user`, sorted by name, at most [`MAX_ENTRIES`] entries.
pub fn list(path: &str, user: Option<&str>) -> Result<(Vec<FileStat>, bool), Failure> {
    as_user(user, || list_dir(path))
}

fn list_dir(path: &str) -> Result<(Vec<FileStat>, bool), Failure> {
    let p = check_path(path)?;
    let names = crate::account::Names::read();
    let mut out = Vec::new();
    let mut truncated = false;
    for entry in fs::read_dir(&p).map_err(ctx(&p))? {
        let entry = entry.map_err(ctx(&p))?;
        if out.len() >= MAX_ENTRIES {
            truncated = true;
            break;
        }
        if let Ok(md) = entry.path().symlink_metadata() {
            out.push(owned_stat(entry.file_name().to_string_lossy().into_owned(), &md, &names));
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((out, truncated))
}

/// Stats a path as `user` without following a final symlink.
pub fn stat(path: &str, user: Option<&str>) -> Result<FileStat, Failure> {
    let p = check_path(path)?;
    let md = as_user(user, || p.symlink_metadata().map_err(ctx(&p)))?;
    Ok(owned_stat(path.to_string(), &md, &crate::account::Names::read()))
}

/// Follows every symbolic link of `path` as `user`: the stat of where it leads, named by the
/// absolute path reached.
pub fn resolve(path: &str, user: Option<&str>) -> Result<FileStat, Failure> {
    let p = check_path(path)?;
    as_user(user, || {
        let real = fs::canonicalize(&p).map_err(ctx(&p))?;
        let md = real.symlink_metadata().map_err(ctx(&real))?;
        Ok(owned_stat(real.to_string_lossy().into_owned(), &md, &crate::account::Names::read()))
    })
}

/// Removes a file or directory as `user`.
pub fn remove(path: &str, recursive: bool, user: Option<&str>) -> Result<(), Failure> {
    as_user(user, || remove_path(path, recursive))
}

fn remove_path(path: &str, recursive: bool) -> Result<(), Failure> {
    let p = check_path(path)?;
    if p == Path::new("/") {
        return Err(Failure::new(ErrorCode::BadRequest, "refusing to remove /"));
    }
    let md = p.symlink_metadata().map_err(ctx(&p))?;
    let r = if md.is_dir() {
        if recursive {
            fs::remove_dir_all(&p)
        } else {
            fs::remove_dir(&p)
        }
    } else {
        fs::remove_file(&p)
    };
    r.map_err(ctx(&p))
}

/// Renames a path as `user`.
pub fn rename(from: &str, to: &str, user: Option<&str>) -> Result<(), Failure> {
    let (f, t) = (check_path(from)?, check_path(to)?);
    as_user(user, || fs::rename(&f, &t).map_err(ctx(&f)))
}

/// Creates a directory (with its missing parents when `parents`) as `user`.
pub fn mkdir(path: &str, parents: bool, user: Option<&str>) -> Result<(), Failure> {
    let p = check_path(path)?;
    as_user(user, || if parents { fs::create_dir_all(&p) } else { fs::create_dir(&p) }.map_err(ctx(&p)))
}

/// Most entries a walk returns (the host accepts no more).
const MAX_WALK: usize = branchbox_protocol::limits::MAX_WALK_ENTRIES as usize;

/// Walks the tree under `root` without following symlinks or entering `exclude`, handing
/// batches of JSON lines to `emit`; returns the number of entries.
pub fn walk(
    root: &str,
    exclude: &[String],
    token: &Token,
    emit: &mut dyn FnMut(&[u8]),
) -> Result<u64, Failure> {
    let root = check_path(root)?;
    let exclude: Vec<PathBuf> = exclude.iter().map(PathBuf::from).collect();
    let mut stack = vec![root];
    let mut batch: Vec<u8> = Vec::new();
    let mut count = 0u64;
    while let Some(dir) = stack.pop() {
        if token.is_cancelled() {
            return Err(cancelled());
        }
        let Ok(entries) = fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if exclude.iter().any(|x| x == &path) {
                continue;
            }
            let Ok(md) = path.symlink_metadata() else { continue };
            if md.is_dir() {
                stack.push(path.clone());
            }
            let st = stat_of(path.to_string_lossy().into_owned(), &md);
            if let Ok(line) = serde_json::to_vec(&st) {
                batch.extend_from_slice(&line);
                batch.push(b'\n');
            }
            count += 1;
            if count as usize >= MAX_WALK {
                return Err(Failure::new(ErrorCode::BadRequest, format!("more than {MAX_WALK} entries")));
            }
            if batch.len() >= CHUNK / 2 {
                emit(&batch);
                batch.clear();
            }
        }
    }
    if !batch.is_empty() {
        emit(&batch);
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{chown, lchown, symlink};

    /// Debian's `nobody`, in the host's /etc/passwd that the agent reads here.
    const NOBODY: Option<&str> = Some("nobody");

    /// A tree like a sandbox's: `etc` and `private` are root's, `home` is nobody's and holds
    /// `cfg -> etc`, a link nobody planted.
    fn tree() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().to_path_buf();
        fs::set_permissions(&base, fs::Permissions::from_mode(0o755)).unwrap();
        fs::create_dir(base.join("etc")).unwrap();
        fs::create_dir(base.join("home")).unwrap();
        chown(base.join("home"), Some(65534), Some(65534)).unwrap();
        symlink(base.join("etc"), base.join("home/cfg")).unwrap();
        lchown(base.join("home/cfg"), Some(65534), Some(65534)).unwrap();
        fs::create_dir(base.join("private")).unwrap();
        fs::set_permissions(base.join("private"), fs::Permissions::from_mode(0o700)).unwrap();
        fs::write(base.join("private/secret"), b"root only").unwrap();
        (dir, base)
    }

    fn s(p: &Path) -> &str {
        p.to_str().unwrap()
    }

    fn write_as(path: &Path, data: &[u8], user: Option<&str>) -> Result<u64, Failure> {
        let (tx, rx) = std::sync::mpsc::sync_channel(2);
        tx.send(Some(data.to_vec())).unwrap();
        tx.send(None).unwrap();
        let t = WriteTarget { path: s(path), mode: None, append: false, parents: true, user };
        write(&t, &rx, &Token::default())
    }

    fn read_as(path: &Path, user: Option<&str>) -> Result<Vec<u8>, Failure> {
        let mut out = Vec::new();
        read(s(path), None, user, &Token::default(), &mut |c| out.extend_from_slice(c))?;
        Ok(out)
    }

    fn denied<T: std::fmt::Debug>(r: Result<T, Failure>) {
        match r {
            Err(f) => assert_eq!(f.code, ErrorCode::PermissionDenied, "{}", f.message),
            Ok(v) => panic!("allowed: {v:?}"),
        }
    }

    #[test]
    fn a_write_as_an_account_does_not_follow_its_own_symlink_into_a_directory_it_cannot_write() {
        let (_d, base) = tree();
        denied(write_as(&base.join("home/cfg/ld.so.preload"), b"/evil.so", NOBODY));
        assert!(fs::read_dir(base.join("etc")).unwrap().next().is_none(), "something was made in etc");
        // Where it may write, the file and the directories made are its own.
        write_as(&base.join("home/a/b/f"), b"mine", NOBODY).unwrap();
        for p in ["home/a", "home/a/b", "home/a/b/f"] {
            let md = fs::symlink_metadata(base.join(p)).unwrap();
            assert_eq!((md.uid(), md.gid()), (65534, 65534), "{p}");
        }
        // Root's own calls are unchanged.
        write_as(&base.join("home/cfg/root-made"), b"r", None).unwrap();
        assert_eq!(fs::read(base.join("etc/root-made")).unwrap(), b"r");
    }

    #[test]
    fn reads_listings_and_stats_as_an_account_are_refused_where_its_commands_would_be() {
        let (_d, base) = tree();
        let secret = base.join("private/secret");
        denied(read_as(&secret, NOBODY));
        denied(list(s(&base.join("private")), NOBODY));
        denied(stat(s(&secret), NOBODY));
        assert_eq!(read_as(&secret, None).unwrap(), b"root only");
        assert_eq!(list(s(&base.join("private")), None).unwrap().0.len(), 1);
        // What it may read, it reads.
        write_as(&base.join("home/f"), b"hello", NOBODY).unwrap();
        assert_eq!(read_as(&base.join("home/f"), NOBODY).unwrap(), b"hello");
        assert_eq!(stat(s(&base.join("home/f")), NOBODY).unwrap().size, 5);
    }

    #[test]
    fn stats_and_listings_name_the_owner_and_group_or_give_their_numbers() {
        let n = crate::account::Names::parse(
            "root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/bash\n",
            "root:x:0:\nusers:x:100:user\n",
        );
        assert_eq!(
            (n.user(1000), n.group(100), n.user(4242), n.group(1000)),
            ("user".into(), "users".into(), "4242".into(), "1000".into())
        );
        let (_d, base) = tree();
        // The host's own account files are read here: nobody (65534) is in Debian's.
        let st = stat(s(&base.join("home")), None).unwrap();
        assert_eq!(st.owner.as_deref(), Some("nobody"));
        let listed = list(s(&base), None).unwrap().0;
        let home = listed.iter().find(|e| e.name == "home").unwrap();
        assert_eq!((home.owner.as_deref(), home.group.as_deref()), (Some("nobody"), st.group.as_deref()));
    }

    #[test]
    fn the_hidden_names_of_atomic_writes_say_whether_they_replace_and_no_other_name_passes() {
        for (name, replaces) in [("f.txt", true), ("f.txt", false), (".x.branchbox-c1", true)] {
            assert_eq!(temp_of(temp_name(name, replaces).as_bytes()), Some(replaces), "{name}");
        }
        for other in
            [".f.branchbox-123", "f.branchbox-c1", ".f.branchbox-c", ".f.branchbox-cx1", ".branchbox-c1", "x"]
        {
            assert_eq!(temp_of(other.as_bytes()), None, "{other}");
        }
    }

    #[test]
    fn resolve_follows_every_link_to_what_it_leads_to_and_a_dangling_link_is_not_found() {
        let (_d, base) = tree();
        fs::write(base.join("etc/f"), b"x").unwrap();
        symlink("../etc/f", base.join("home/one")).unwrap();
        symlink(base.join("home/one"), base.join("home/two")).unwrap();
        let real = fs::canonicalize(base.join("etc/f")).unwrap();
        let r = resolve(s(&base.join("home/two")), None).unwrap();
        assert_eq!((r.name.as_str(), r.kind, r.size), (s(&real), FileKind::File, 1));
        let d = resolve(s(&base.join("home/cfg")), NOBODY).unwrap();
        assert_eq!(d.kind, FileKind::Dir);
        assert_eq!(stat(s(&base.join("home/two")), None).unwrap().kind, FileKind::Symlink);
        symlink(base.join("nowhere"), base.join("home/dangling")).unwrap();
        assert_eq!(resolve(s(&base.join("home/dangling")), None).unwrap_err().code, ErrorCode::NotFound);
        // Through a directory the account cannot enter, it cannot resolve either.
        symlink(base.join("private/secret"), base.join("home/peek")).unwrap();
        denied(resolve(s(&base.join("home/peek")), NOBODY));
    }

    #[test]
    fn removes_renames_and_mkdirs_as_an_account_need_its_own_permissions() {
        let (_d, base) = tree();
        fs::write(base.join("etc/passwd"), b"root").unwrap();
        denied(remove(s(&base.join("home/cfg/passwd")), false, NOBODY));
        denied(rename(s(&base.join("etc/passwd")), s(&base.join("home/stolen")), NOBODY));
        denied(mkdir(s(&base.join("home/cfg/sub")), true, NOBODY));
        assert!(base.join("etc/passwd").exists() && !base.join("etc/sub").exists());
        mkdir(s(&base.join("home/d")), false, NOBODY).unwrap();
        assert_eq!(fs::metadata(base.join("home/d")).unwrap().uid(), 65534);
        rename(s(&base.join("home/d")), s(&base.join("home/e")), NOBODY).unwrap();
        remove(s(&base.join("home/e")), false, NOBODY).unwrap();
        assert!(!base.join("home/e").exists());
    }

    #[test]
    fn only_the_thread_acting_as_an_account_loses_roots_access() {
        let (_d, base) = tree();
        let secret = base.join("private/secret");
        let (acting_tx, acting_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || {
            as_user(NOBODY, || {
                acting_tx.send(()).unwrap();
                done_rx.recv().unwrap();
                Ok(())
            })
        });
        acting_rx.recv().unwrap();
        assert_eq!(read_as(&secret, None).unwrap(), b"root only");
        done_tx.send(()).unwrap();
        other.join().unwrap().unwrap();
        // The thread that acted is root again after the call.
        denied(as_user(NOBODY, || read_as(&secret, None)));
        assert_eq!(as_user(None, || read_as(&secret, None)).unwrap(), b"root only");
    }
}
