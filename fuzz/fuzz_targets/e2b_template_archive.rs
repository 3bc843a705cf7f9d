//! Fuzz target: the archives E2B's SDK uploads for a template's COPY steps, as branchboxd reads
//! them (`branchbox-e2b-wire`'s `template_files::read_archive`). The first byte picks the limits
//! (branchboxd's own, or tiny ones so that the limits themselves are reached); the rest is the
//! upload, any bytes a client may send, gzipped or not. Every upload must be read or refused
//! with a message, never panic; what is read must stay within the limits, hand on only
//! relative, normalized paths, hash the same whether it is unpacked or only checked, and its
//! hash must be E2B's files hash of exactly the entries handed on.
#![no_main]

use branchbox_e2b_wire::template_files::{read_archive, CheckOnly, Limits, Unpack};
use branchbox_template::{MAX_PATH_BYTES, MAX_UPLOAD_BYTES, MAX_UPLOAD_ENTRIES};
use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};
use std::io::Write;

const REAL: Limits = Limits { entries: MAX_UPLOAD_ENTRIES, bytes: MAX_UPLOAD_BYTES, path_bytes: MAX_PATH_BYTES };
const TINY: Limits = Limits { entries: 3, bytes: 64, path_bytes: 16 };

/// An entry handed on: its path, its mode, and for a file its content.
type Entry = (String, u32, Option<Vec<u8>>);

/// Keeps what the archive unpacks to.
#[derive(Default)]
struct Record(Vec<Entry>);

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
        self.0.push((path.to_string(), mode, None));
        Ok(())
    }
    fn file(&mut self, path: &str, mode: u32, _size: u64) -> Result<Box<dyn Write + '_>, String> {
        self.0.push((path.to_string(), mode, Some(Vec::new())));
        let content = self.0.last_mut().and_then(|e| e.2.as_mut()).expect("just pushed");
        Ok(Box::new(Content(content)))
    }
}

/// E2B's files hash of `entries`, as its SDK computes it.
fn e2b_hash(entries: &[Entry]) -> String {
    let mut h = Sha256::new();
    h.update("COPY app /srv/");
    for (path, mode, content) in entries {
        h.update(path.as_bytes());
        match content {
            Some(c) => {
                h.update((0o100000 | mode).to_string());
                h.update(c.len().to_string());
                h.update(c);
            }
            None => h.update((0o040000 | mode).to_string()),
        }
    }
    hex::encode(h.finalize())
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, archive)) = data.split_first() else { return };
    let limits = if pick & 1 == 0 { REAL } else { TINY };
    let mut record = Record::default();
    let unpacked = read_archive(archive, ("app", "/srv/"), &limits, &mut record);
    let checked = read_archive(archive, ("app", "/srv/"), &limits, &mut CheckOnly);
    let Ok(hash) = unpacked else {
        assert!(checked.is_err(), "refused when unpacked, read when only checked");
        return;
    };
    assert_eq!(checked.as_ref(), Ok(&hash), "unpacking does not change the hash");
    assert_eq!(hash, e2b_hash(&record.0), "the hash is E2B's of the entries handed on");
    assert!(!record.0.is_empty() && record.0.len() <= limits.entries);
    let bytes: usize = record.0.iter().filter_map(|e| e.2.as_ref().map(Vec::len)).sum();
    assert!(bytes as u64 <= limits.bytes);
    for (path, mode, _) in &record.0 {
        assert!(path.len() <= limits.path_bytes && *mode <= 0o7777);
        assert!(path == "." || path.split('/').all(|c| !c.is_empty() && c != "." && c != ".."), "{path:?}");
    }
});
