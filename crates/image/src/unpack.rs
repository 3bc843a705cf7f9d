//! Applying image layers (tar streams) to a root filesystem, treating every layer as hostile:
//! no entry lands outside the root, symlinks already in the tree are followed only as they
//! would be inside the root (like a chroot), device nodes are skipped, and bytes and entries are
//! counted against limits.

use crate::tar_members::{shown, Members};
use branchbox_model::{Error, Result};
use std::collections::HashSet;
use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Most symlinks followed while resolving one path (Linux's own limit).
const MAX_HOPS: u32 = 40;
/// Longest name of one path component (Linux's NAME_MAX).
const NAME_MAX: usize = 255;
/// Longest path (Linux's PATH_MAX).
const PATH_MAX: usize = 4096;

/// What one import may unpack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImportLimits {
    /// Most bytes of uncompressed layer streams, all layers together.
    pub max_bytes: u64,
    /// Most tar entries, all layers together.
    pub max_entries: u64,
    /// Most layers.
    pub max_layers: usize,
}

impl Default for ImportLimits {
    fn default() -> Self {
        ImportLimits { max_bytes: 8 << 30, max_entries: 1_000_000, max_layers: 256 }
    }
}

/// The entry limit and what was skipped, across the layers of one import.
#[derive(Debug)]
pub(crate) struct Budget {
    pub(crate) limits: ImportLimits,
    pub(crate) entries: u64,
    /// Device nodes and fifos not created.
    pub(crate) skipped: u64,
}

impl Budget {
    pub(crate) fn new(limits: ImportLimits) -> Budget {
        Budget { limits, entries: 0, skipped: 0 }
    }
}

/// A reader that counts the bytes it passes against a limit: layers are counted uncompressed,
/// so a small compressed layer cannot unpack into an unbounded stream.
pub(crate) struct Counted<R> {
    pub(crate) inner: R,
    pub(crate) used: u64,
    pub(crate) limit: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.used += n as u64;
        if self.used > self.limit {
            return Err(std::io::Error::other(format!(
                "the layers unpack to more than the limit of {} bytes",
                self.limit
            )));
        }
        Ok(n)
    }
}

fn bad(msg: String) -> Error {
    Error::InvalidInput(msg)
}

/// The components of a path inside an image: `.` dropped, `..` and absolute paths refused, and
/// paths no system call takes (over 4096 bytes, a name over 255 or with a NUL) refused before
/// they reach one, whose error would repeat them whole.
pub(crate) fn components(path: &Path) -> Result<Vec<&OsStr>> {
    if path.as_os_str().len() > PATH_MAX {
        return Err(bad(format!("the layer entry {} is longer than {PATH_MAX} bytes", shown(path))));
    }
    let mut out = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(n) if n.len() > NAME_MAX || n.as_bytes().contains(&0) => {
                return Err(bad(format!(
                    "the layer entry {} has a name over {NAME_MAX} bytes or with a NUL byte",
                    shown(path)
                )))
            }
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(bad(format!(
                    "the layer entry {} leaves the image root (absolute paths and '..' are refused)",
                    shown(path)
                )))
            }
        }
    }
    Ok(out)
}

/// The host path of the directory `comps` names inside `root`, following symlinks as they would
/// resolve with `root` as `/`. Missing directories are made when `create` is set.
fn resolve_dir(root: &Path, comps: &[&OsStr], create: bool) -> Result<PathBuf> {
    let mut queue: std::collections::VecDeque<std::ffi::OsString> =
        comps.iter().map(|c| c.to_os_string()).collect();
    let mut cur: Vec<std::ffi::OsString> = Vec::new();
    let mut hops = 0;
    while let Some(c) = queue.pop_front() {
        if c == "." || c.is_empty() {
            continue;
        }
        if c == ".." {
            cur.pop();
            continue;
        }
        let here: PathBuf = root.join(cur.iter().collect::<PathBuf>()).join(&c);
        match std::fs::symlink_metadata(&here) {
            Ok(m) if m.file_type().is_symlink() => {
                hops += 1;
                if hops > MAX_HOPS {
                    return Err(bad(format!("too many levels of symbolic links under {}", here.display())));
                }
                let target = std::fs::read_link(&here).map_err(|e| Error::io(&here, e))?;
                if target.is_absolute() {
                    cur.clear();
                }
                for (i, t) in target.iter().filter(|t| *t != "/").enumerate() {
                    queue.insert(i, t.to_os_string());
                }
            }
            Ok(m) if m.is_dir() => cur.push(c),
            Ok(_) => return Err(bad(format!("{} in the image is not a directory", here.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
                make_dir(&here, 0o755)?;
                cur.push(c);
            }
            Err(e) => return Err(Error::io(&here, e)),
        }
    }
    Ok(root.join(cur.iter().collect::<PathBuf>()))
}

/// The host path of `path` inside `root`: its parent resolved as [`resolve_dir`] does, its last
/// component not followed. Parents are made when `create` is set.
pub(crate) fn resolve_in_root(root: &Path, path: impl AsRef<Path>, create: bool) -> Result<PathBuf> {
    let path = path.as_ref();
    let relative = path.strip_prefix("/").unwrap_or(path);
    let comps = components(relative)?;
    let Some((last, parents)) = comps.split_last() else {
        return Ok(root.to_path_buf());
    };
    Ok(resolve_dir(root, parents, create)?.join(last))
}

/// Makes the directory `path` with exactly `mode`: the CLI runs with umask 077, which would
/// leave directories inside images unreadable to a sandbox's non-root users.
pub(crate) fn make_dir(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir(path).map_err(|e| Error::io(path, e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| Error::io(path, e))
}

/// Removes whatever is at `path` (never following a symlink); nothing there is fine.
pub(crate) fn remove_any(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path).map_err(|e| Error::io(path, e)),
        Ok(_) => std::fs::remove_file(path).map_err(|e| Error::io(path, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(path, e)),
    }
}

const WHITEOUT: &[u8] = b".wh.";
const OPAQUE: &[u8] = b".wh..wh..opq";

/// Applies one uncompressed layer to `root`.
pub(crate) fn apply_layer(root: &Path, layer: impl Read, budget: &mut Budget) -> Result<()> {
    let mut archive = tar::Archive::new(layer);
    // Written by this layer: an opaque directory hides lower layers only.
    let mut written: HashSet<PathBuf> = HashSet::new();
    let root_is_root = euid_is_root();
    let members =
        Members::new(&mut archive).map_err(|e| bad(format!("the layer is not a tar archive: {e}")))?;
    for member in members {
        let mut member = member.map_err(|e| bad(format!("a layer entry cannot be read: {e}")))?;
        budget.entries += 1;
        if budget.entries > budget.limits.max_entries {
            return Err(bad(format!(
                "the layers hold more than the limit of {} entries",
                budget.limits.max_entries
            )));
        }
        let path = member.path().to_path_buf();
        let comps = components(&path)?;
        let Some((&name, parents)) = comps.split_last() else {
            continue; // the root itself
        };
        let kind = member.entry.header().entry_type();
        if name.as_bytes() == OPAQUE {
            let dir = resolve_dir(root, parents, true)?;
            let rel: PathBuf = parents.iter().collect();
            for child in std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))? {
                let child = child.map_err(|e| Error::io(&dir, e))?;
                if !written.contains(&rel.join(child.file_name())) {
                    remove_any(&child.path())?;
                }
            }
            continue;
        }
        if let Some(hidden) = name.as_bytes().strip_prefix(WHITEOUT) {
            // `.wh.`, `.wh..` and `.wh...` would name the directory itself or its parent.
            if matches!(hidden, b"" | b"." | b"..") || hidden.contains(&b'/') {
                return Err(bad(format!(
                    "the whiteout {} hides no name (empty, '.' or '..'); the layer is malformed",
                    shown(&path)
                )));
            }
            let dir = resolve_dir(root, parents, true)?;
            remove_any(&dir.join(OsStr::from_bytes(hidden)))?;
            continue;
        }
        let dir = resolve_dir(root, parents, true)?;
        let dest = dir.join(name);
        written.insert(comps.iter().collect());
        let mode = member.entry.header().mode().unwrap_or(0o644) & 0o7777;
        use std::os::unix::fs::PermissionsExt;
        match kind {
            tar::EntryType::Directory => {
                if !std::fs::symlink_metadata(&dest).map(|m| m.is_dir()).unwrap_or(false) {
                    remove_any(&dest)?;
                    std::fs::create_dir(&dest).map_err(|e| Error::io(&dest, e))?;
                }
                std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(mode))
                    .map_err(|e| Error::io(&dest, e))?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                remove_any(&dest)?;
                // create_new: O_EXCL never follows a symlink at the last component.
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&dest)
                    .map_err(|e| Error::io(&dest, e))?;
                std::io::copy(&mut member.entry, &mut f)
                    .map_err(|e| bad(format!("the layer entry {} cannot be unpacked: {e}", shown(&path))))?;
                f.set_permissions(std::fs::Permissions::from_mode(mode)).map_err(|e| Error::io(&dest, e))?;
                if let Ok(mtime) = member.entry.header().mtime() {
                    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(mtime);
                    let _ = f.set_modified(t);
                }
            }
            tar::EntryType::Symlink => {
                let target = member
                    .link_name()
                    .ok_or_else(|| bad(format!("the symlink {} has no target", shown(&path))))?;
                remove_any(&dest)?;
                std::os::unix::fs::symlink(target, &dest).map_err(|e| Error::io(&dest, e))?;
            }
            tar::EntryType::Link => {
                let target = member
                    .link_name()
                    .ok_or_else(|| bad(format!("the hard link {} has no target", shown(&path))))?
                    .to_path_buf();
                let source = resolve_in_root(root, &target, false)?;
                if std::fs::symlink_metadata(&source).map(|m| m.is_dir()).unwrap_or(true) {
                    return Err(bad(format!(
                        "the hard link {} points at {}, which is missing or a directory",
                        shown(&path),
                        shown(&target)
                    )));
                }
                remove_any(&dest)?;
                // std's hard_link uses linkat without following a symlink at the source.
                std::fs::hard_link(&source, &dest).map_err(|e| Error::io(&dest, e))?;
            }
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                budget.skipped += 1;
                continue;
            }
            // Global PAX headers and unknown kinds carry nothing for the tree.
            _ => continue,
        }
        if root_is_root {
            let uid = member.uid().and_then(|u| u32::try_from(u).ok());
            let gid = member.gid().and_then(|g| u32::try_from(g).ok());
            std::os::unix::fs::lchown(&dest, uid, gid).map_err(|e| Error::io(&dest, e))?;
            if kind != tar::EntryType::Symlink && mode & 0o7000 != 0 {
                // chown clears set-id bits; put them back.
                std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(mode))
                    .map_err(|e| Error::io(&dest, e))?;
            }
        }
    }
    Ok(())
}

fn euid_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
