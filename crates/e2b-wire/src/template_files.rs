//! The archives E2B's SDK uploads for a template's COPY steps (a tar, gzipped by default, of the
//! paths a COPY names, relative to its context; `docs/e2b.md`), read as hostile client input:
//! [`read_archive`] walks one within [`Limits`], hands each entry to an [`Unpack`] under its
//! checked, normalized path, and recomputes E2B's files hash, the SDK's
//! `calculate_files_hash`: `COPY <src> <dest>`, then per entry its path, `st_mode` and, for a
//! file, size and content. Only regular files and directories are taken: symlinks (the SDK's
//! default keeps them as links; `resolve_symlinks=True` copies what they point to), hard links
//! and devices are refused by path, as are absolute paths and `..`. What writes the entries
//! (branchboxd, into a fresh directory) is the caller's. Pure, unit-tested below and fuzzed
//! (`fuzz/fuzz_targets/e2b_template_archive.rs`).

use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Component, Path};

/// The limits an uploaded archive is read within.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most entries (files and directories).
    pub entries: usize,
    /// Most bytes of file content, all files together.
    pub bytes: u64,
    /// Most bytes of one entry's path.
    pub path_bytes: usize,
}

impl Limits {
    /// Most bytes the archive may unpack to (a gzip bomb stops here): the file content plus a
    /// header block per entry (and extension headers) at most.
    fn unpacked(&self) -> u64 {
        self.bytes.saturating_add((self.entries as u64).saturating_add(8).saturating_mul(4096))
    }
}

/// What [`read_archive`] hands each entry to, with its checked path (relative, normalized, `.`
/// for the context itself) and its permission bits (`mode & 0o7777`). An error ends the walk
/// and is returned as is, so it names the entry itself.
pub trait Unpack {
    /// A directory.
    fn dir(&mut self, path: &str, mode: u32) -> Result<(), String>;
    /// A regular file of `size` bytes: where its content is written.
    fn file(&mut self, path: &str, mode: u32, size: u64) -> Result<Box<dyn Write + '_>, String>;
}

/// Unpacks nothing: [`read_archive`] only checks the archive and computes its hash.
pub struct CheckOnly;

impl Unpack for CheckOnly {
    fn dir(&mut self, _: &str, _: u32) -> Result<(), String> {
        Ok(())
    }
    fn file(&mut self, _: &str, _: u32, _: u64) -> Result<Box<dyn Write + '_>, String> {
        Ok(Box::new(std::io::sink()))
    }
}

/// A reader that fails once more than `left` bytes were read (a gzip bomb stops here).
struct Capped<R> {
    inner: R,
    left: u64,
    limit: u64,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.left = self.left.checked_sub(n as u64).ok_or_else(|| {
            std::io::Error::other(format!(
                "the archive unpacks to over {} MiB; copy less in one step",
                self.limit >> 20
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
fn entry_path(raw: &[u8], max: usize) -> Result<String, String> {
    let text = std::str::from_utf8(raw).map_err(|_| "an entry's path is not UTF-8".to_string())?;
    let shown: String = text.chars().take(256).collect();
    if text.len() > max || text.contains('\0') {
        return Err(format!("entry {shown:?}: the path is over {max} bytes or holds a NUL"));
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

/// `st_mode`'s file type bits of a directory and of a regular file.
const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;

/// Walks an uploaded archive (gzipped or not) within `limits`, handing each entry to
/// `unpack`. Returns E2B's files hash of it for `COPY <src> <dest>` (`copy`: the two as the SDK
/// sent them). An error says which entry and why.
pub fn read_archive(
    mut archive: impl Read,
    copy: (&str, &str),
    limits: &Limits,
    unpack: &mut dyn Unpack,
) -> Result<String, String> {
    let mut magic = [0u8; 2];
    let mut got = 0;
    while got < magic.len() {
        match archive.read(&mut magic[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    let whole = (&magic[..got]).chain(archive);
    let raw: Box<dyn Read> = if got == 2 && magic == [0x1f, 0x8b] {
        Box::new(flate2::read::GzDecoder::new(whole))
    } else {
        Box::new(std::io::BufReader::new(whole))
    };
    let mut tar = tar::Archive::new(Capped { inner: raw, left: limits.unpacked(), limit: limits.bytes });
    let mut hash = Sha256::new();
    hash.update(format!("COPY {} {}", copy.0, copy.1).as_bytes());
    let (mut count, mut bytes) = (0usize, 0u64);
    let bad = |e: std::io::Error| format!("the upload is not a tar archive the SDK makes: {e}");
    for entry in tar.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        count += 1;
        if count > limits.entries {
            return Err(format!("the archive has over {} entries; copy fewer in one step", limits.entries));
        }
        let rel = entry_path(&entry.path_bytes(), limits.path_bytes)?;
        let mode = entry.header().mode().map_err(bad)? & 0o7777;
        let kind = entry.header().entry_type();
        hash.update(rel.as_bytes());
        if kind.is_dir() {
            hash.update((S_IFDIR | mode).to_string().as_bytes());
            unpack.dir(&rel, mode)?;
        } else if kind.is_file() {
            let size = entry.size();
            bytes = bytes.saturating_add(size);
            if bytes > limits.bytes {
                return Err(format!(
                    "the archive's files are over {} MiB; copy less in one step",
                    limits.bytes >> 20
                ));
            }
            hash.update((S_IFREG | mode).to_string().as_bytes());
            hash.update(size.to_string().as_bytes());
            let out = unpack.file(&rel, mode, size)?;
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

    /// Real limits, as branchboxd reads uploads with.
    const LIMITS: Limits = Limits { entries: 10_000, bytes: 512 << 20, path_bytes: 4096 };

    fn archive(gz: bool, build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        let data = b.into_inner().unwrap();
        if gz {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(&data).unwrap();
            e.finish().unwrap()
        } else {
            data
        }
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

    /// Records what an archive unpacks to.
    #[derive(Default)]
    struct Record(Vec<(String, u32, Option<Vec<u8>>)>);

    struct Content<'a>(&'a mut Vec<u8>);

    impl Write for Content<'_> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Unpack for Record {
        fn dir(&mut self, path: &str, mode: u32) -> Result<(), String> {
            self.0.push((path.into(), mode, None));
            Ok(())
        }
        fn file(&mut self, path: &str, mode: u32, _: u64) -> Result<Box<dyn Write + '_>, String> {
            self.0.push((path.into(), mode, Some(Vec::new())));
            Ok(Box::new(Content(self.0.last_mut().and_then(|e| e.2.as_mut()).unwrap())))
        }
    }

    #[test]
    fn the_hash_is_e2bs_files_hash_and_the_entries_are_handed_on() {
        for gz in [false, true] {
            let a = archive(gz, |b| {
                dir(b, "./app/");
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
            assert_eq!(read_archive(&a[..], ("app", "/srv/"), &LIMITS, &mut CheckOnly).unwrap(), want);
            let other = read_archive(&a[..], ("app", "/srv"), &LIMITS, &mut CheckOnly).unwrap();
            assert_ne!(other, want, "dest is part of the hash");
            let mut r = Record::default();
            assert_eq!(read_archive(&a[..], ("app", "/srv/"), &LIMITS, &mut r).unwrap(), want);
            assert_eq!(r.0[0], ("app".to_string(), 0o755, None));
            assert_eq!(r.0[2], ("app/x.txt".to_string(), 0o644, Some(b"x".to_vec())));
        }
    }

    #[test]
    fn archives_the_sdk_made_hash_to_the_files_hash_it_sent() {
        // The fuzz seeds: archives E2B's SDK made (`tar_file_stream`) of `app` and `a.txt`,
        // after a byte for the fuzz target, and the build start it sent with their hashes.
        let sent: serde_json::Value =
            serde_json::from_str(include_str!("../../../fuzz/seeds/e2b_template_steps/sdk_build.json"))
                .unwrap();
        let hash_of = |i: usize| sent["steps"][i]["filesHash"].as_str().unwrap().to_string();
        let app = include_bytes!("../../../fuzz/seeds/e2b_template_archive/app_gz");
        let file = include_bytes!("../../../fuzz/seeds/e2b_template_archive/file_plain");
        assert_eq!(read_archive(&app[1..], ("app", "/srv/"), &LIMITS, &mut CheckOnly), Ok(hash_of(1)));
        assert_eq!(read_archive(&file[1..], ("./a.txt", "notes/"), &LIMITS, &mut CheckOnly), Ok(hash_of(2)));
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
    fn hostile_entries_are_refused_by_path_before_they_are_handed_on() {
        let cases: [(&[u8], tar::EntryType, &str); 6] = [
            (b"../evil", tar::EntryType::Regular, "leaves the archive"),
            (b"/etc/evil", tar::EntryType::Regular, "absolute"),
            (b"\xff", tar::EntryType::Regular, "not UTF-8"),
            (b"link", tar::EntryType::Symlink, "symbolic link"),
            (b"fifo", tar::EntryType::Fifo, "not a regular file"),
            (b"hard", tar::EntryType::Link, "not a regular file"),
        ];
        for (name, kind, want) in cases {
            let a = archive(false, |b| raw_entry(b, name, kind, b""));
            let mut r = Record::default();
            let e = read_archive(&a[..], ("x", "/x"), &LIMITS, &mut r).unwrap_err();
            assert!(e.contains(want), "{e:?} does not say {want:?}");
            assert!(r.0.is_empty(), "{want}: {:?} was handed on", r.0);
        }
        let empty = archive(false, |_| {});
        let e = read_archive(&empty[..], ("a", "/a"), &LIMITS, &mut CheckOnly).unwrap_err();
        assert!(e.contains("empty"), "{e}");
        let e = read_archive(&b"not a tar"[..], ("a", "/a"), &LIMITS, &mut CheckOnly).unwrap_err();
        assert!(e.contains("not a tar archive"), "{e}");
    }

    #[test]
    fn the_limits_hold() {
        let small = Limits { entries: 2, bytes: 4 << 20, path_bytes: 8 };
        let many = archive(false, |b| (0..3).for_each(|i| file(b, &format!("f{i}"), 0o644, b"")));
        let e = read_archive(&many[..], ("a", "/a"), &small, &mut CheckOnly).unwrap_err();
        assert!(e.contains("over 2 entries"), "{e}");
        let long = archive(false, |b| file(b, "a/very/long/path", 0o644, b""));
        let e = read_archive(&long[..], ("a", "/a"), &small, &mut CheckOnly).unwrap_err();
        assert!(e.contains("over 8 bytes"), "{e}");
        let big = archive(true, |b| {
            file(b, "a", 0o644, &vec![0; 3 << 20]);
            file(b, "b", 0o644, &vec![0; 3 << 20]);
        });
        let e = read_archive(&big[..], ("a", "/a"), &small, &mut CheckOnly).unwrap_err();
        assert!(e.contains("over 4 MiB"), "{e}");
        // A bomb: a long name (which the tar reader reads whole, before any entry) of 2 MiB of
        // zeros, a few KiB gzipped, stops at the unpacked limit.
        let bomb = archive(true, |b| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::GNULongName);
            h.set_size(2 << 20);
            h.set_cksum();
            b.append(&h, &vec![0u8; 2 << 20][..]).unwrap();
            file(b, "a", 0o644, b"");
        });
        assert!(bomb.len() < 64 << 10);
        let tiny = Limits { entries: 1, bytes: 1 << 20, path_bytes: 64 };
        let e = read_archive(&bomb[..], ("a", "/a"), &tiny, &mut CheckOnly).unwrap_err();
        assert!(e.contains("unpacks to over 1 MiB"), "{e}");
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let real = archive(true, |b| file(b, "a", 0o644, b"hello"));
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
            let _ = read_archive(&data[..], ("a", "/a"), &LIMITS, &mut CheckOnly);
        }
    }
}
