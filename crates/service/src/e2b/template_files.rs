//! The files of E2B's COPY steps: the archive E2B's SDK uploads (a tar, gzipped by default, of
//! the paths a COPY names, relative to its context) read as hostile input. [`read_archive`]
//! walks it once, within limits, and both recomputes E2B's files hash (the SDK's
//! `calculate_files_hash`: `COPY <src> <dest>`, then per entry its path, `st_mode` and, for a
//! file, size and content) and, when told where, unpacks it. A build uses an upload only when
//! the hash it recomputes is the step's `filesHash`, so the files built are the ones the SDK
//! hashed.
//!
//! Only regular files and directories are taken: symlinks (the SDK's default keeps them as
//! links; `resolve_symlinks=True` copies what they point to), hard links and devices are
//! refused by path, as are absolute paths and `..`. A fresh directory that holds no link is
//! what is unpacked into, and files are created with `create_new`, so no entry can write
//! outside it.

use branchbox_template::{MAX_PATH_BYTES, MAX_UPLOAD_BYTES, MAX_UPLOAD_ENTRIES};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path};

/// Most bytes of one uploaded archive, as sent (a gzipped one unpacks to at most
/// [`MAX_UPLOAD_BYTES`] of file content).
pub const MAX_ARCHIVE_BYTES: u64 = MAX_UPLOAD_BYTES;

/// A reader that fails once more than `left` bytes were read (a gzip bomb stops here).
struct Capped<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.left = self.left.checked_sub(n as u64).ok_or_else(|| {
            std::io::Error::other(format!(
                "the archive unpacks to over {} MiB; copy less in one step",
                MAX_UPLOAD_BYTES >> 20
            ))
        })?;
        Ok(n)
    }
}

/// Writes to `out` while hashing.
struct Hashing<'a, W> {
    out: W,
    hash: &'a mut Sha256,
}

impl<W: Write> Write for Hashing<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// An entry's path in the archive, checked and normalized (`.` for the context itself).
fn entry_path(raw: &[u8]) -> Result<String, String> {
    let text = std::str::from_utf8(raw).map_err(|_| "an entry's path is not UTF-8".to_string())?;
    let shown: String = text.chars().take(256).collect();
    if text.len() > MAX_PATH_BYTES || text.contains('\0') {
        return Err(format!("entry {shown:?}: the path is over {MAX_PATH_BYTES} bytes or holds a NUL"));
    }
    let mut parts = Vec::new();
    for c in Path::new(text).components() {
        match c {
            Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
            Component::CurDir => {}
            _ => {
                return Err(format!("entry {shown:?}: the path is absolute or leaves the archive with '..'"))
            }
        }
    }
    Ok(if parts.is_empty() { ".".into() } else { parts.join("/") })
}

/// Walks an uploaded archive (gzipped or not) within the limits. Returns E2B's files hash of
/// it for `COPY <src> <dest>` (`copy`: the two as the SDK sent them); with `into` (a directory
/// that exists and is empty), unpacks it there. An error says which entry and why.
pub fn read_archive(archive: &Path, copy: (&str, &str), into: Option<&Path>) -> Result<String, String> {
    let mut file = std::fs::File::open(archive).map_err(|e| format!("the upload cannot be read: {e}"))?;
    let mut magic = [0u8; 2];
    let gz = file.read(&mut magic).map_err(|e| e.to_string())? == 2 && magic == [0x1f, 0x8b];
    drop(file);
    let file = std::fs::File::open(archive).map_err(|e| format!("the upload cannot be read: {e}"))?;
    let raw: Box<dyn Read> = if gz {
        Box::new(flate2::read::GzDecoder::new(file))
    } else {
        Box::new(std::io::BufReader::new(file))
    };
    // File content plus a header block per entry (and extension headers) at most.
    let left = MAX_UPLOAD_BYTES + (MAX_UPLOAD_ENTRIES as u64 + 8) * 4096;
    let mut tar = tar::Archive::new(Capped { inner: raw, left });
    let mut hash = Sha256::new();
    hash.update(format!("COPY {} {}", copy.0, copy.1).as_bytes());
    let (mut count, mut bytes) = (0usize, 0u64);
    let bad = |e: std::io::Error| format!("the upload is not a tar archive the SDK makes: {e}");
    for entry in tar.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        count += 1;
        if count > MAX_UPLOAD_ENTRIES {
            return Err(format!("the archive has over {MAX_UPLOAD_ENTRIES} entries; copy fewer in one step"));
        }
        let rel = entry_path(&entry.path_bytes())?;
        let mode = entry.header().mode().map_err(bad)? & 0o7777;
        let kind = entry.header().entry_type();
        let target = into.map(|d| if rel == "." { d.to_path_buf() } else { d.join(&rel) });
        hash.update(rel.as_bytes());
        if kind.is_dir() {
            hash.update((libc::S_IFDIR | mode).to_string().as_bytes());
            if let Some(t) = &target {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(t)
                    .map_err(|e| format!("entry {rel:?}: {e}"))?;
            }
        } else if kind.is_file() {
            let size = entry.size();
            bytes = bytes.saturating_add(size);
            if bytes > MAX_UPLOAD_BYTES {
                return Err(format!(
                    "the archive's files are over {} MiB; copy less in one step",
                    MAX_UPLOAD_BYTES >> 20
                ));
            }
            hash.update((libc::S_IFREG | mode).to_string().as_bytes());
            hash.update(size.to_string().as_bytes());
            let out: Box<dyn Write> = match &target {
                Some(t) => {
                    if let Some(parent) = t.parent() {
                        std::fs::DirBuilder::new()
                            .recursive(true)
                            .mode(0o755)
                            .create(parent)
                            .map_err(|e| format!("entry {rel:?}: {e}"))?;
                    }
                    let f = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .custom_flags(libc::O_NOFOLLOW)
                        .mode(0o600)
                        .open(t)
                        .map_err(|e| format!("entry {rel:?}: {e} (is it in the archive twice?)"))?;
                    // The mode the SDK sent, whatever the service's umask: the upload step
                    // copies it into the sandbox.
                    f.set_permissions(std::fs::Permissions::from_mode(mode & 0o777))
                        .map_err(|e| format!("entry {rel:?}: {e}"))?;
                    Box::new(f)
                }
                None => Box::new(std::io::sink()),
            };
            let mut w = Hashing { out, hash: &mut hash };
            let copied = std::io::copy(&mut entry, &mut w).map_err(bad)?;
            if copied != size {
                return Err(format!("entry {rel:?}: the archive ends inside it"));
            }
        } else if kind.is_symlink() {
            return Err(format!(
                "entry {rel:?} is a symbolic link, which is not copied; pass resolve_symlinks=True to copy what it points to"
            ));
        } else {
            return Err(format!(
                "entry {rel:?} is not a regular file or directory ({kind:?}); only those are copied"
            ));
        }
    }
    if count == 0 {
        return Err("the archive is empty".into());
    }
    Ok(hex::encode(hash.finalize()))
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

    /// E2B's `calculate_files_hash`, as its SDK computes it, for the same entries.
    fn e2b_hash(src: &str, dest: &str, entries: &[(&str, u32, Option<&[u8]>)]) -> String {
        let mut h = Sha256::new();
        h.update(format!("COPY {src} {dest}"));
        for (path, mode, data) in entries {
            h.update(path.as_bytes());
            match data {
                Some(d) => {
                    h.update(format!("{}", 0o100000 | mode));
                    h.update(format!("{}", d.len()));
                    h.update(d);
                }
                None => h.update(format!("{}", 0o040000 | mode)),
            }
        }
        hex::encode(h.finalize())
    }

    #[test]
    fn the_hash_is_e2bs_files_hash_and_the_files_unpack() {
        let t = tempfile::tempdir().unwrap();
        for gz in [false, true] {
            let a = archive(t.path(), gz, |b| {
                dir(b, "app/");
                file(b, "app/run.sh", 0o755, b"#!/bin/sh\necho hi\n");
                file(b, "app/x.txt", 0o644, b"x");
            });
            let want = e2b_hash(
                "app",
                "/srv/",
                &[
                    ("app", 0o755, None),
                    ("app/run.sh", 0o755, Some(b"#!/bin/sh\necho hi\n")),
                    ("app/x.txt", 0o644, Some(b"x")),
                ],
            );
            assert_eq!(read_archive(&a, ("app", "/srv/"), None).unwrap(), want);
            assert_ne!(read_archive(&a, ("app", "/srv"), None).unwrap(), want, "dest is part of the hash");
            let into = t.path().join(format!("u{gz}"));
            std::fs::create_dir(&into).unwrap();
            assert_eq!(read_archive(&a, ("app", "/srv/"), Some(&into)).unwrap(), want);
            assert_eq!(std::fs::read(into.join("app/x.txt")).unwrap(), b"x");
            let mode = std::fs::metadata(into.join("app/run.sh")).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o755);
        }
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

    #[test]
    fn arbitrary_bytes_never_panic() {
        let t = tempfile::tempdir().unwrap();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let real = std::fs::read(archive(t.path(), true, |b| file(b, "a", 0o644, b"hello"))).unwrap();
        for i in 0..300 {
            let mut data = if i % 2 == 0 { real.clone() } else { vec![0u8; 1024] };
            for _ in 0..(1 + i % 8) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let at = (seed as usize) % data.len();
                data[at] = (seed >> 32) as u8;
            }
            data.truncate(data.len() - (seed as usize % 64).min(data.len()));
            let p = t.path().join("fuzz.tar");
            std::fs::write(&p, &data).unwrap();
            let _ = read_archive(&p, ("a", "/a"), None);
        }
    }
}
