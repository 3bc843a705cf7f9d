//! File operations. Paths must be absolute, at most 4096 bytes, without NUL; writes replace a
//! file atomically (temporary file in the same directory, then rename).

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
    }
}

fn ctx(path: &Path) -> impl Fn(std::io::Error) -> Failure + '_ {
    move |e| Failure::io_at(e, path)
}

/// Streams a regular file in chunks to `emit`, at most the size it had when opened; returns
/// the bytes sent. Anything else is refused: a FIFO or a device such as `/dev/zero` could
/// block a worker or stream forever. Stops when `token` is cancelled.
pub fn read(
    path: &str,
    max: Option<u64>,
    token: &Token,
    emit: &mut dyn FnMut(&[u8]),
) -> Result<u64, Failure> {
    let p = check_path(path)?;
    // Non-blocking, so that opening a FIFO returns at once instead of waiting for a writer.
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
    /// The image's account that owns the file and the directories made for it.
    pub owner: Option<&'a str>,
}

/// Writes the chunks arriving on `chunks` (ended by `None`) to `target`. On failure the rest of
/// the stream is drained, so the connection stays in step. A cancelled write (its stream ends
/// without `eof`) leaves the file as it was.
pub fn write(
    target: &WriteTarget<'_>,
    chunks: &Receiver<Option<Vec<u8>>>,
    token: &Token,
) -> Result<u64, Failure> {
    let result = write_stream(target, chunks, token);
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
    let owner = t.owner.map(crate::account::lookup).transpose()?;
    let mode = mode.unwrap_or(0o644) & 0o7777;
    let dir = p.parent().ok_or_else(|| Failure::new(ErrorCode::BadRequest, "cannot write to /"))?;
    if parents {
        make_dirs(dir, owner.as_ref())?;
    }
    let target = if append {
        p.clone()
    } else {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        dir.join(format!(".{name}.branchbox-{}", std::process::id() ^ rand_suffix()))
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
    // Only a file made here changes owner: appending keeps the file's own.
    if let (Some(a), false) = (&owner, append) {
        if let Err(e) = std::os::unix::fs::fchown(&f, Some(a.uid), Some(a.gid)) {
            let _ = fs::remove_file(&target);
            return Err(ctx(&p)(e));
        }
    }
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
        if !append {
            fs::set_permissions(&target, fs::Permissions::from_mode(mode)).map_err(ctx(&p))?;
            fs::rename(&target, &p).map_err(ctx(&p))?;
        }
        Ok(total)
    })();
    if outcome.is_err() && !append {
        let _ = fs::remove_file(&target);
    }
    outcome
}

fn rand_suffix() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: getrandom into a local buffer.
    unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    u32::from_ne_bytes(b)
}

/// Lists a directory, sorted by name, at most [`MAX_ENTRIES`] entries.
pub fn list(path: &str) -> Result<(Vec<FileStat>, bool), Failure> {
    let p = check_path(path)?;
    let mut out = Vec::new();
    let mut truncated = false;
    for entry in fs::read_dir(&p).map_err(ctx(&p))? {
        let entry = entry.map_err(ctx(&p))?;
        if out.len() >= MAX_ENTRIES {
            truncated = true;
            break;
        }
        if let Ok(md) = entry.path().symlink_metadata() {
            out.push(stat_of(entry.file_name().to_string_lossy().into_owned(), &md));
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((out, truncated))
}

/// Stats a path without following a final symlink.
pub fn stat(path: &str) -> Result<FileStat, Failure> {
    let p = check_path(path)?;
    let md = p.symlink_metadata().map_err(ctx(&p))?;
    Ok(stat_of(path.to_string(), &md))
}

/// Removes a file or directory.
pub fn remove(path: &str, recursive: bool) -> Result<(), Failure> {
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

/// Renames a path.
pub fn rename(from: &str, to: &str) -> Result<(), Failure> {
    let (f, t) = (check_path(from)?, check_path(to)?);
    fs::rename(&f, &t).map_err(ctx(&f))
}

/// Creates a directory.
pub fn mkdir(path: &str, parents: bool, owner: Option<&str>) -> Result<(), Failure> {
    let p = check_path(path)?;
    let owner = owner.map(crate::account::lookup).transpose()?;
    if parents {
        return make_dirs(&p, owner.as_ref());
    }
    fs::create_dir(&p).map_err(ctx(&p))?;
    match &owner {
        Some(a) => crate::account::chown(&p, a).map_err(ctx(&p)),
        None => Ok(()),
    }
}

/// Creates `dir` and its missing parents, those it created owned by `owner` when given.
fn make_dirs(dir: &Path, owner: Option<&crate::account::Account>) -> Result<(), Failure> {
    let missing: Vec<&Path> = dir.ancestors().take_while(|a| fs::symlink_metadata(a).is_err()).collect();
    fs::create_dir_all(dir).map_err(ctx(dir))?;
    if let Some(a) = owner {
        for d in missing {
            crate::account::chown(d, a).map_err(ctx(d))?;
        }
    }
    Ok(())
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
