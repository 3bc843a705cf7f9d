//! The files of E2B's COPY steps: the archive E2B's SDK uploads (a tar, gzipped by default, of
//! the paths a COPY names, relative to its context) is read as hostile input by
//! [`branchbox_e2b_wire::template_files::read_archive`] (pure, fuzzed), which walks it once
//! within the template limits, refuses anything but regular files and directories under
//! relative paths, and recomputes E2B's files hash. [`read_archive`] here opens the upload and,
//! when told where, unpacks what that walk hands on. A build uses an upload only when the hash
//! it recomputes is the step's `filesHash`, so the files built are the ones the SDK hashed.
//!
//! A fresh directory that holds no link is what is unpacked into, and files are created with
//! `create_new` and `O_NOFOLLOW`, so no entry can write outside it.

use branchbox_e2b_wire::template_files::{self as wire, CheckOnly, Limits, Unpack};
use branchbox_template::{MAX_PATH_BYTES, MAX_UPLOAD_BYTES, MAX_UPLOAD_ENTRIES};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Most bytes of one uploaded archive, as sent (a gzipped one unpacks to at most
/// [`MAX_UPLOAD_BYTES`] of file content).
pub const MAX_ARCHIVE_BYTES: u64 = MAX_UPLOAD_BYTES;

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
}
