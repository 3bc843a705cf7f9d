//! Chain hashes: a step's cache key is the hash of its parent's key, the step's own content and
//! the hashes of its inputs (an upload's files), so editing step k changes the keys of k and
//! everything after it and nothing before.

use crate::context_file::{hash_open, open_at, open_context};
use crate::spec::check_rel;
use crate::{Error, Result, Scanned, Step, MAX_UPLOAD_BYTES, MAX_UPLOAD_ENTRIES};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// Bumped when what a key covers changes, so old cache entries are never mistaken for new.
const VERSION: &str = "branchbox-template-chain-v1";

fn hash(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        // Length-prefixed, so no two different part lists hash the same bytes.
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    hex::encode(h.finalize())
}

/// The key of a template's starting point: `base` says what it is (an image id and backend,
/// or the key of another template's last step).
pub fn base_key(base: &str) -> String {
    hash(&[VERSION.as_bytes(), b"base", base.as_bytes()])
}

/// The key of `step` after `parent`, with `input` the hash of its local inputs (uploads).
pub fn step_key(parent: &str, step: &Step, input: Option<&str>) -> String {
    // Serializing a validated step cannot fail; an empty body would still key it by kind.
    let body = serde_json::to_vec(step).unwrap_or_default();
    hash(&[VERSION.as_bytes(), b"step", parent.as_bytes(), &body, input.unwrap_or("").as_bytes()])
}

/// One entry of an upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A directory to create.
    Dir {
        /// Path relative to the upload's root ("" is the root).
        rel: String,
    },
    /// A file to write.
    File {
        /// Path relative to the upload's root ("" when the upload is one file).
        rel: String,
        /// Local path.
        local: PathBuf,
        /// Permission bits.
        mode: u32,
        /// SHA-256 of the content when scanned.
        sha256: String,
        /// Which file was hashed; [`Scanned::open`] sends only that one.
        scanned: Scanned,
    },
}

/// What an upload step sends, scanned once: its entries and their hash.
#[derive(Debug, Clone)]
pub struct Upload {
    /// Entries, parents before children, in name order.
    pub entries: Vec<Entry>,
    /// True when the source is one file.
    pub single_file: bool,
    /// Hash over every entry's path, kind, mode and content.
    pub hash: String,
    /// Bytes of all files.
    pub bytes: u64,
}

fn mode_of(md: &std::fs::Metadata) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    md.permissions().mode() & 0o7777
}

impl Upload {
    /// Scans `src` under `context`, refusing anything that leaves it: `..`, absolute paths,
    /// and symlinks anywhere (a link could point outside, and following it would copy host
    /// files the context does not hold). Every file and directory is opened from its parent's
    /// descriptor without following a link, so one swapped in during the scan is refused too.
    /// Bounded by [`MAX_UPLOAD_ENTRIES`] and [`MAX_UPLOAD_BYTES`].
    pub fn scan(context: &Path, src: &str) -> Result<Upload> {
        check_rel("upload", src)?;
        let ctx = context.canonicalize().map_err(|e| Error::io(context, e))?;
        let mut root = ctx.clone();
        let mut open = open_context(&ctx)?;
        for c in Path::new(src).components() {
            if let std::path::Component::Normal(name) = c {
                root.push(name);
                open = open_at(&open, name, &root)?;
            }
        }
        let mut up = Upload { entries: Vec::new(), single_file: false, hash: String::new(), bytes: 0 };
        let md = open.metadata().map_err(|e| Error::io(&root, e))?;
        if md.is_file() {
            up.single_file = true;
            up.push_file(String::new(), &root, open, &md)?;
        } else if md.is_dir() {
            up.walk(&open, &root, String::new(), src)?;
        } else {
            return Err(Error::Invalid(format!(
                "upload {src:?}: {} is a special file; only files and directories are uploaded",
                root.display()
            )));
        }
        let mut h = Sha256::new();
        for e in &up.entries {
            let line = match e {
                Entry::Dir { rel } => format!("d {rel:?}\n"),
                Entry::File { rel, mode, sha256, .. } => format!("f {rel:?} {mode:o} {sha256}\n"),
            };
            h.update(line.as_bytes());
        }
        up.hash = hex::encode(h.finalize());
        Ok(up)
    }

    fn count(&self, src: &str) -> Result<()> {
        if self.entries.len() >= MAX_UPLOAD_ENTRIES {
            return Err(Error::Invalid(format!(
                "upload {src:?} has more than {MAX_UPLOAD_ENTRIES} files and directories; archive it and upload the archive"
            )));
        }
        Ok(())
    }

    fn push_file(
        &mut self,
        rel: String,
        path: &Path,
        file: std::fs::File,
        md: &std::fs::Metadata,
    ) -> Result<()> {
        self.bytes += md.len();
        if self.bytes > MAX_UPLOAD_BYTES {
            return Err(Error::Invalid(format!(
                "upload reaches {} bytes at {}, over the limit of {MAX_UPLOAD_BYTES}",
                self.bytes,
                path.display()
            )));
        }
        let (sha256, scanned) = hash_open(file, md, path)?;
        self.entries.push(Entry::File { rel, local: path.to_path_buf(), mode: mode_of(md), sha256, scanned });
        Ok(())
    }

    /// Adds the tree of the open directory `open`, at `dir`. Names are listed by path, but each
    /// is opened from `open` itself: a directory swapped for a link after it was opened can
    /// only make a listed name missing, never lead outside.
    fn walk(&mut self, open: &std::fs::File, dir: &Path, rel: String, src: &str) -> Result<()> {
        self.count(src)?;
        self.entries.push(Entry::Dir { rel: rel.clone() });
        let mut names: Vec<std::fs::DirEntry> = std::fs::read_dir(dir)
            .map_err(|e| Error::io(dir, e))?
            .collect::<std::io::Result<_>>()
            .map_err(|e| Error::io(dir, e))?;
        names.sort_by_key(|e| e.file_name());
        for e in names {
            let path = e.path();
            let name = e.file_name().into_string().map_err(|n| {
                Error::Invalid(format!("upload {src:?}: the name {n:?} is not UTF-8; rename it"))
            })?;
            let child = if rel.is_empty() { name } else { format!("{rel}/{name}") };
            let file = open_at(open, &e.file_name(), &path)?;
            let md = file.metadata().map_err(|e| Error::io(&path, e))?;
            if md.is_dir() {
                self.walk(&file, &path, child, src)?;
            } else if md.is_file() {
                self.count(src)?;
                self.push_file(child, &path, file, &md)?;
            } else {
                return Err(Error::Invalid(format!(
                    "upload {src:?}: {} is a symlink or special file; only files and directories are uploaded",
                    path.display()
                )));
            }
        }
        Ok(())
    }

    /// Where `rel` lands in the sandbox for destination `to` (see [`Step::Upload`]).
    pub fn dest(&self, src: &str, to: &str, rel: &str) -> String {
        if self.single_file {
            if to.ends_with('/') {
                let base =
                    Path::new(src).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                return format!("{to}{base}");
            }
            return to.to_string();
        }
        let dir = if to.len() > 1 { to.trim_end_matches('/') } else { to };
        match (rel.is_empty(), dir.ends_with('/')) {
            (true, _) => dir.to_string(),
            (false, true) => format!("{dir}{rel}"),
            (false, false) => format!("{dir}/{rel}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RunCmd;
    use std::io::Read;

    fn run(s: &str) -> Step {
        Step::Run(RunCmd::Shell(s.into()))
    }

    #[test]
    fn an_edit_changes_its_key_and_every_later_key_only() {
        let base = base_key("image:img-1");
        let keys = |steps: &[Step]| {
            let mut k = base.clone();
            steps
                .iter()
                .map(|s| {
                    k = step_key(&k, s, None);
                    k.clone()
                })
                .collect::<Vec<_>>()
        };
        let a = keys(&[run("a"), run("b"), run("c")]);
        let b = keys(&[run("a"), run("B"), run("c")]);
        assert_eq!(a[0], b[0]);
        assert_ne!(a[1], b[1]);
        assert_ne!(a[2], b[2], "a step after an edit keeps its key");
        assert_ne!(base_key("image:img-1"), base_key("image:img-2"));
        assert_ne!(step_key(&base, &run("a"), Some("x")), step_key(&base, &run("a"), Some("y")));
    }

    #[test]
    fn uploads_hash_content_and_refuse_what_leaves_the_context() {
        let ctx = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(ctx.path().join("app/sub")).unwrap();
        std::fs::write(ctx.path().join("app/a.txt"), "one").unwrap();
        std::fs::write(ctx.path().join("app/sub/b.txt"), "two").unwrap();
        let first = Upload::scan(ctx.path(), "app").unwrap();
        assert_eq!(first.entries.len(), 4);
        assert_eq!(first.dest("app", "/srv/", "sub/b.txt"), "/srv/sub/b.txt");
        std::fs::write(ctx.path().join("app/a.txt"), "ONE").unwrap();
        assert_ne!(Upload::scan(ctx.path(), "app").unwrap().hash, first.hash);
        let one = Upload::scan(ctx.path(), "app/a.txt").unwrap();
        assert_eq!(one.dest("app/a.txt", "/x/", ""), "/x/a.txt");
        assert_eq!(one.dest("app/a.txt", "/x/y", ""), "/x/y");

        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(outside.path(), ctx.path().join("app/link")).unwrap();
        let e = Upload::scan(ctx.path(), "app").unwrap_err().to_string();
        assert!(e.contains("symlink"), "{e}");
        std::os::unix::fs::symlink(outside.path(), ctx.path().join("out")).unwrap();
        let e = Upload::scan(ctx.path(), "out/secret").unwrap_err().to_string();
        assert!(e.contains("symlink"), "{e}");
        assert!(Upload::scan(ctx.path(), "../x").unwrap_err().to_string().contains("leaves"));
    }

    #[test]
    fn a_file_changed_after_the_scan_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, "before").unwrap();
        let up = Upload::scan(dir.path(), "f").unwrap();
        let Entry::File { sha256, scanned, .. } = &up.entries[0] else { panic!("not a file") };
        std::fs::write(&p, "after!").unwrap();
        let mut r = scanned.open(&p).unwrap();
        std::io::copy(&mut r, &mut std::io::sink()).unwrap();
        assert!(r.check(sha256, &p).unwrap_err().to_string().contains("changed during the build"));
    }

    /// The scanned files of `src` under `ctx`, by their path relative to the upload.
    fn scanned(ctx: &Path, src: &str) -> Vec<(String, PathBuf, Scanned)> {
        Upload::scan(ctx, src)
            .unwrap()
            .entries
            .into_iter()
            .filter_map(|e| match e {
                Entry::File { rel, local, scanned, .. } => Some((rel, local, scanned)),
                Entry::Dir { .. } => None,
            })
            .collect()
    }

    #[test]
    fn a_symlink_swapped_in_after_the_scan_is_not_followed() {
        let (ctx, outside) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::write(outside.path().join("secret"), "host secret").unwrap();
        std::fs::create_dir_all(ctx.path().join("app")).unwrap();
        std::fs::write(ctx.path().join("app/a.txt"), "context").unwrap();
        let files = scanned(ctx.path(), "app");
        let (_, local, file) = &files[0];
        std::fs::remove_file(local).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), local).unwrap();
        let e = file.open(local).err().expect("refused").to_string();
        assert!(e.contains("is a symlink"), "{e}");
    }

    #[test]
    fn a_directory_swapped_for_a_link_after_the_scan_sends_nothing_from_outside() {
        let (ctx, outside) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::write(outside.path().join("b.txt"), "host secret").unwrap();
        std::fs::create_dir_all(ctx.path().join("app/sub")).unwrap();
        std::fs::write(ctx.path().join("app/sub/b.txt"), "context").unwrap();
        let files = scanned(ctx.path(), "app");
        let (rel, local, file) = &files[0];
        assert_eq!(rel, "sub/b.txt");
        std::fs::rename(ctx.path().join("app/sub"), ctx.path().join("moved")).unwrap();
        std::os::unix::fs::symlink(outside.path(), ctx.path().join("app/sub")).unwrap();
        let e = file.open(local).err().expect("refused").to_string();
        assert!(e.contains("was replaced after the scan"), "{e}");
    }

    #[test]
    fn a_file_replaced_after_the_scan_is_refused_and_a_grown_one_sends_what_was_hashed() {
        let ctx = tempfile::tempdir().unwrap();
        let p = ctx.path().join("f");
        std::fs::write(&p, "scanned").unwrap();
        let up = Upload::scan(ctx.path(), "f").unwrap();
        let Entry::File { sha256, scanned, .. } = &up.entries[0] else { panic!("not a file") };
        std::fs::write(ctx.path().join("new"), "scanned").unwrap();
        std::fs::rename(ctx.path().join("new"), &p).unwrap();
        assert!(scanned.open(&p).err().expect("refused").to_string().contains("was replaced"));

        let up = Upload::scan(ctx.path(), "f").unwrap();
        let Entry::File { sha256: now, scanned, .. } = &up.entries[0] else { panic!("not a file") };
        assert_eq!(now, sha256, "the same bytes hash the same");
        use std::io::Write;
        std::fs::OpenOptions::new().append(true).open(&p).unwrap().write_all(b" and more").unwrap();
        let mut r = scanned.open(&p).unwrap();
        let mut sent = Vec::new();
        r.read_to_end(&mut sent).unwrap();
        assert_eq!(sent, b"scanned", "only the bytes hashed are sent");
        r.check(now, &p).unwrap();
    }

    #[test]
    fn a_scan_refuses_fifos_without_waiting_for_a_writer() {
        let ctx = tempfile::tempdir().unwrap();
        let fifo =
            std::ffi::CString::new(ctx.path().join("pipe").into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let e = Upload::scan(ctx.path(), "pipe").unwrap_err().to_string();
        assert!(e.contains("special file"), "{e}");
    }
}
