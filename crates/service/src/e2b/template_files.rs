//! The files of E2B's COPY steps: the archive E2B's SDK uploads (a tar, gzipped by default, of
//! the paths a COPY names, relative to its context) is read as hostile input by
//! [`branchbox_e2b_wire::template_files::read_archive`] (pure, fuzzed), which walks it once
//! within the template limits, refuses anything but regular files and directories under
//! relative paths, and recomputes E2B's files hash. [`read_archive`] here opens the upload and,
//! when told where, unpacks what that walk hands on. A build uses an upload only when the hash
//! it recomputes is the step's `filesHash`, so the files built are the ones the SDK hashed,
//! with one exception, [`unpack_copy`]'s: E2B's JavaScript SDK also hashes each directory's
//! size on its own disk, which no archive carries, so an upload that holds a directory, all
//! under the step's source, is taken unverified (the caller keeps it to the template whose link
//! it came through and says so in the build's log); one of files only must verify.
//!
//! [`Uploads`] keeps the uploads, each under the template whose link it came through, so only
//! that template's `present` answers and builds ever see it: an upload taken unverified never
//! stands for another template's files.
//!
//! A fresh directory that holds no link is what is unpacked into, and files are created with
//! `create_new` and `O_NOFOLLOW`, so no entry can write outside it.

use branchbox_e2b_wire::template::Copy;
use branchbox_e2b_wire::template_files::{self as wire, CheckOnly, Limits, Unpack};
use branchbox_template::{MAX_PATH_BYTES, MAX_UPLOAD_BYTES, MAX_UPLOAD_ENTRIES};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

/// Most bytes of one uploaded archive, as sent (a gzipped one unpacks to at most
/// [`MAX_UPLOAD_BYTES`] of file content).
pub const MAX_ARCHIVE_BYTES: u64 = MAX_UPLOAD_BYTES;

/// How long an upload no build used is kept.
const ARCHIVE_TTL: Duration = Duration::from_secs(24 * 3600);

/// The limits of an upload: those of a template's uploads.
const LIMITS: Limits =
    Limits { entries: MAX_UPLOAD_ENTRIES, bytes: MAX_UPLOAD_BYTES, path_bytes: MAX_PATH_BYTES };

/// Unpacks into a directory that exists and is empty.
struct IntoDir<'a>(&'a Path);

impl IntoDir<'_> {
    fn target(&self, rel: &str) -> std::path::PathBuf {
        if rel == "." {
            self.0.to_path_buf()
        } else {
            self.0.join(rel)
        }
    }
}

fn mkdir(rel: &str, dir: &Path) -> Result<(), String> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|e| format!("entry {rel:?}: {e}"))
}

impl Unpack for IntoDir<'_> {
    fn dir(&mut self, rel: &str, _mode: u32) -> Result<(), String> {
        mkdir(rel, &self.target(rel))
    }

    fn file(&mut self, rel: &str, mode: u32, _size: u64) -> Result<Box<dyn Write + '_>, String> {
        let t = self.target(rel);
        if let Some(parent) = t.parent() {
            mkdir(rel, parent)?;
        }
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o600)
            .open(&t)
            .map_err(|e| format!("entry {rel:?}: {e} (is it in the archive twice?)"))?;
        // The mode the SDK sent, whatever the service's umask: the upload step copies it into
        // the sandbox.
        f.set_permissions(std::fs::Permissions::from_mode(mode & 0o777))
            .map_err(|e| format!("entry {rel:?}: {e}"))?;
        Ok(Box::new(f))
    }
}

/// Walks an uploaded archive (gzipped or not) within the limits. Returns E2B's files hash of
/// it for `COPY <src> <dest>` (`copy`: the two as the SDK sent them); with `into` (a directory
/// that exists and is empty), unpacks it there. An error says which entry and why.
pub fn read_archive(archive: &Path, copy: (&str, &str), into: Option<&Path>) -> Result<String, String> {
    let file = std::fs::File::open(archive).map_err(|e| format!("the upload cannot be read: {e}"))?;
    match into {
        Some(dir) => wire::read_archive(file, copy, &LIMITS, &mut IntoDir(dir)),
        None => wire::read_archive(file, copy, &LIMITS, &mut CheckOnly),
    }
}

/// How a COPY's upload was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    /// It hashes to the step's `filesHash`.
    Verified,
    /// It does not, but it holds a directory, every entry under the step's source: the hash of
    /// E2B's JavaScript SDK, which counts directory sizes, cannot be recomputed.
    Unverified,
}

/// Counts an archive's directories and finds the first entry outside the step's source, while
/// handing each entry on.
struct Watch<'a, U> {
    inner: U,
    source: &'a str,
    dirs: usize,
    outside: Option<String>,
}

impl<U: Unpack> Watch<'_, U> {
    fn see(&mut self, rel: &str) {
        let under = self.source == "."
            || rel == self.source
            || rel.strip_prefix(self.source).is_some_and(|r| r.starts_with('/'));
        if !under && self.outside.is_none() {
            self.outside = Some(rel.to_string());
        }
    }
}

impl<U: Unpack> Unpack for Watch<'_, U> {
    fn dir(&mut self, rel: &str, mode: u32) -> Result<(), String> {
        self.see(rel);
        self.dirs += 1;
        self.inner.dir(rel, mode)
    }

    fn file(&mut self, rel: &str, mode: u32, size: u64) -> Result<Box<dyn Write + '_>, String> {
        self.see(rel);
        self.inner.file(rel, mode, size)
    }
}

/// A COPY source as the archive names it: normalized, `.` for the whole context.
fn source_of(src: &str) -> String {
    let parts: Vec<_> = Path::new(src)
        .components()
        .filter_map(|c| match c {
            Component::Normal(p) => Some(p.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect();
    if parts.is_empty() {
        ".".into()
    } else {
        parts.join("/")
    }
}

/// Unpacks COPY `c`'s upload into `into` (a directory that exists and is empty) and says how it
/// was taken; refuses it (the caller names the step) when it does not hash to the step's
/// `filesHash` and holds no directory, or holds an entry the step's source does not name.
pub fn unpack_copy(archive: &Path, c: &Copy, into: &Path) -> Result<Checked, String> {
    let source = source_of(&c.src);
    let file = std::fs::File::open(archive).map_err(|e| format!("the upload cannot be read: {e}"))?;
    let mut w = Watch { inner: IntoDir(into), source: &source, dirs: 0, outside: None };
    let got = wire::read_archive(file, (&c.src, &c.dest), &LIMITS, &mut w)?;
    if got == c.hash {
        return Ok(Checked::Verified);
    }
    if let Some(rel) = w.outside {
        return Err(format!(
            "the uploaded files hash to {got}, not the step's filesHash {}, and entry {rel:?} is not under the source {source:?}; upload them again",
            c.hash
        ));
    }
    if w.dirs == 0 {
        return Err(format!(
            "the uploaded files hash to {got}, not the step's filesHash {}; upload them again",
            c.hash
        ));
    }
    Ok(Checked::Unverified)
}

/// Where the COPY uploads are kept: `<root>/<template>/<filesHash>.tar`.
pub struct Uploads {
    root: PathBuf,
}

impl Uploads {
    /// Uploads kept under `root`.
    pub fn new(root: PathBuf) -> Uploads {
        Uploads { root }
    }

    /// Where the upload for `hash` through one of `template`'s links is kept: only that
    /// template's answers and builds look there.
    pub fn path(&self, template: &str, hash: &str) -> PathBuf {
        self.root.join(template).join(format!("{hash}.tar"))
    }

    /// Whether `template` has an upload for `hash` that no build used yet.
    pub fn present(&self, template: &str, hash: &str) -> bool {
        self.path(template, hash).is_file()
    }

    /// Removes the uploads in a template's `dir` that no build used within [`ARCHIVE_TTL`] (a
    /// client that uploaded and never built).
    pub fn prune(dir: &Path) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|a| a > ARCHIVE_TTL));
            if old {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    /// Unpacks each COPY's upload for template `name` into `ctx`, refusing one that is missing
    /// or that [`unpack_copy`] refuses, naming the step. Returns, per upload taken unverified,
    /// E2B's step number and the line the build's log says it with.
    pub fn unpack(&self, name: &str, copies: &[Copy], ctx: &Path) -> Result<Vec<(String, String)>, String> {
        let mut notes = Vec::new();
        for c in copies {
            let at = format!("step {} (COPY {})", c.step, c.src);
            let archive = self.path(name, &c.hash);
            if !archive.is_file() {
                return Err(format!(
                    "{at}: no files were uploaded for filesHash {} to template {name}; ask GET /templates/{{id}}/files/{{hash}} for a link and put them there",
                    c.hash
                ));
            }
            let into = ctx.join(&c.dir);
            let _ = std::fs::remove_dir_all(&into);
            std::fs::create_dir_all(&into).map_err(|e| format!("{at}: {e}"))?;
            if unpack_copy(&archive, c, &into).map_err(|e| format!("{at}: {e}"))? == Checked::Unverified {
                let note = format!(
                    "{at}: the files hash could not be checked (it counts directory sizes, which the upload does not carry); \
                     the files are used as uploaded through this template's link"
                );
                notes.push((c.step.to_string(), note));
            }
        }
        Ok(notes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(dir: &Path, gz: bool, build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> std::path::PathBuf {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        let data = b.into_inner().unwrap();
        let data = if gz {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(&data).unwrap();
            e.finish().unwrap()
        } else {
            data
        };
        let p = dir.join(format!("a{}.tar", rand::random::<u32>()));
        std::fs::write(&p, data).unwrap();
        p
    }

    fn file(b: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32, data: &[u8]) {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        h.set_path(path).unwrap();
        h.set_cksum();
        b.append(&h, data).unwrap();
    }

    fn dir(b: &mut tar::Builder<Vec<u8>>, path: &str) {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        h.set_path(path).unwrap();
        h.set_cksum();
        b.append(&h, &[][..]).unwrap();
    }

    #[test]
    fn the_files_unpack_with_their_modes_and_the_same_hash() {
        let t = tempfile::tempdir().unwrap();
        for gz in [false, true] {
            let a = archive(t.path(), gz, |b| {
                dir(b, "app/");
                file(b, "app/run.sh", 0o755, b"#!/bin/sh\necho hi\n");
                file(b, "app/x.txt", 0o644, b"x");
            });
            let want = read_archive(&a, ("app", "/srv/"), None).unwrap();
            let into = t.path().join(format!("u{gz}"));
            std::fs::create_dir(&into).unwrap();
            assert_eq!(read_archive(&a, ("app", "/srv/"), Some(&into)).unwrap(), want);
            assert_eq!(std::fs::read(into.join("app/x.txt")).unwrap(), b"x");
            let mode = std::fs::metadata(into.join("app/run.sh")).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o755);
        }
        let missing = read_archive(&t.path().join("none"), ("a", "/a"), None).unwrap_err();
        assert!(missing.contains("cannot be read"), "{missing}");
    }

    /// COPY `src` to `/srv/` of `archive`, with `hash` as the step's filesHash.
    fn copy_of(src: &str, hash: String) -> Copy {
        Copy { step: 2, hash, src: src.into(), dest: "/srv/".into(), dir: "s2".into() }
    }

    fn fresh(t: &Path, name: &str) -> std::path::PathBuf {
        let into = t.join(name);
        std::fs::create_dir(&into).unwrap();
        into
    }

    #[test]
    fn an_upload_that_hashes_to_the_files_hash_is_verified() {
        let t = tempfile::tempdir().unwrap();
        let a = archive(t.path(), true, |b| {
            dir(b, "app/");
            file(b, "app/x.txt", 0o644, b"x");
        });
        let hash = read_archive(&a, ("./app", "/srv/"), None).unwrap();
        let got = unpack_copy(&a, &copy_of("./app", hash), &fresh(t.path(), "u")).unwrap();
        assert_eq!(got, Checked::Verified);
        assert_eq!(std::fs::read(t.path().join("u/app/x.txt")).unwrap(), b"x");
    }

    #[test]
    fn a_directory_whose_hash_cannot_be_recomputed_is_taken_unverified() {
        let t = tempfile::tempdir().unwrap();
        let a = archive(t.path(), true, |b| {
            dir(b, "conf/");
            dir(b, "conf/sub/");
            file(b, "conf/sub/b.ini", 0o644, b"b = 2\n");
        });
        // What E2B's JavaScript SDK sends: its hash counts each directory's size (4096 here).
        let js = "f".repeat(64);
        let got = unpack_copy(&a, &copy_of("conf/", js.clone()), &fresh(t.path(), "u")).unwrap();
        assert_eq!(got, Checked::Unverified);
        assert_eq!(std::fs::read(t.path().join("u/conf/sub/b.ini")).unwrap(), b"b = 2\n");
        // An entry the step's source does not name is refused, directory or not.
        let e = unpack_copy(&a, &copy_of("con", js.clone()), &fresh(t.path(), "v")).unwrap_err();
        assert!(e.contains("entry \"conf\" is not under the source \"con\""), "{e}");
        let any = unpack_copy(&a, &copy_of(".", js), &fresh(t.path(), "w")).unwrap();
        assert_eq!(any, Checked::Unverified);
    }

    #[test]
    fn files_only_that_do_not_hash_to_the_files_hash_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let a = archive(t.path(), false, |b| file(b, "a.txt", 0o644, b"other"));
        let right = read_archive(&a, ("a.txt", "/srv/"), None).unwrap();
        let wrong = "0".repeat(64);
        let e = unpack_copy(&a, &copy_of("a.txt", wrong.clone()), &fresh(t.path(), "u")).unwrap_err();
        assert_eq!(
            e,
            format!(
                "the uploaded files hash to {right}, not the step's filesHash {wrong}; upload them again"
            )
        );
    }

    fn raw_entry(b: &mut tar::Builder<Vec<u8>>, name: &[u8], kind: tar::EntryType, data: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        if kind == tar::EntryType::Symlink {
            h.set_link_name("/etc/passwd").unwrap();
        }
        h.set_cksum();
        b.append(&h, data).unwrap();
    }

    #[test]
    fn hostile_entries_are_refused_by_path_and_nothing_escapes() {
        let t = tempfile::tempdir().unwrap();
        let cases: [(&[u8], tar::EntryType, &str); 5] = [
            (b"../evil", tar::EntryType::Regular, "leaves the archive"),
            (b"/etc/evil", tar::EntryType::Regular, "absolute"),
            (b"link", tar::EntryType::Symlink, "symbolic link"),
            (b"fifo", tar::EntryType::Fifo, "not a regular file"),
            (b"hard", tar::EntryType::Link, "not a regular file"),
        ];
        for (name, kind, want) in cases {
            let a = archive(t.path(), false, |b| raw_entry(b, name, kind, b""));
            let into = t.path().join("into");
            let _ = std::fs::remove_dir_all(&into);
            std::fs::create_dir(&into).unwrap();
            let e = read_archive(&a, ("x", "/x"), Some(&into)).unwrap_err();
            assert!(e.contains(want), "{e:?} does not say {want:?}");
            assert!(!t.path().join("evil").exists());
        }
        let twice = archive(t.path(), false, |b| {
            file(b, "a", 0o644, b"1");
            file(b, "a", 0o644, b"2");
        });
        let into = t.path().join("twice");
        std::fs::create_dir(&into).unwrap();
        assert!(read_archive(&twice, ("a", "/a"), Some(&into)).unwrap_err().contains("twice"));
        let empty = archive(t.path(), false, |_| {});
        assert!(read_archive(&empty, ("a", "/a"), None).unwrap_err().contains("empty"));
    }

    /// Keeps `archive` as the upload through a link of `template` for `hash`.
    fn keep(u: &Uploads, template: &str, hash: &str, archive: &Path) {
        let at = u.path(template, hash);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::fs::copy(archive, at).unwrap();
    }

    fn conf(t: &Path) -> std::path::PathBuf {
        archive(t, true, |b| {
            dir(b, "conf/");
            file(b, "conf/b.ini", 0o644, b"b = 2\n");
        })
    }

    #[test]
    fn a_verified_upload_is_present_and_used_by_the_templates_builds() {
        let t = tempfile::tempdir().unwrap();
        let u = Uploads::new(t.path().join("files"));
        let a = conf(t.path());
        let hash = read_archive(&a, ("conf", "/srv/"), None).unwrap();
        keep(&u, "web", &hash, &a);
        assert!(u.present("web", &hash));
        let ctx = t.path().join("ctx");
        assert_eq!(u.unpack("web", &[copy_of("conf", hash.clone())], &ctx), Ok(Vec::new()));
        assert_eq!(std::fs::read(ctx.join("s2/conf/b.ini")).unwrap(), b"b = 2\n");
        // Used again by a later build while it is kept.
        let again = u.unpack("web", &[copy_of("conf", hash)], &t.path().join("ctx2"));
        assert_eq!(again, Ok(Vec::new()));
    }

    #[test]
    fn an_unverified_upload_serves_only_the_template_whose_link_it_came_through() {
        let t = tempfile::tempdir().unwrap();
        let u = Uploads::new(t.path().join("files"));
        // The JavaScript SDK's hash of `conf`: it counts the directory's size, so ours differs.
        let js = "a".repeat(64);
        keep(&u, "web", &js, &conf(t.path()));
        assert!(u.present("web", &js));
        let ctx = t.path().join("ctx");
        let notes = u.unpack("web", &[copy_of("conf", js.clone())], &ctx).unwrap();
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert_eq!(notes[0].0, "2");
        assert!(
            notes[0].1.starts_with("step 2 (COPY conf): the files hash could not be checked"),
            "{notes:?}"
        );
        assert_eq!(std::fs::read(ctx.join("s2/conf/b.ini")).unwrap(), b"b = 2\n");

        assert!(!u.present("other", &js), "another template is told the upload is there");
        let e = u.unpack("other", &[copy_of("conf", js)], &t.path().join("ctx2")).unwrap_err();
        assert!(e.contains("no files were uploaded for filesHash"), "{e}");
    }

    #[test]
    fn an_upload_of_files_only_that_does_not_verify_is_refused_naming_the_step() {
        let t = tempfile::tempdir().unwrap();
        let u = Uploads::new(t.path().join("files"));
        let wrong = "b".repeat(64);
        keep(&u, "web", &wrong, &archive(t.path(), false, |b| file(b, "a.txt", 0o644, b"a")));
        let e = u.unpack("web", &[copy_of("a.txt", wrong.clone())], &t.path().join("ctx")).unwrap_err();
        assert!(e.starts_with("step 2 (COPY a.txt): the uploaded files hash to "), "{e}");
        assert!(e.contains(&format!("not the step's filesHash {wrong}")), "{e}");
    }
}
