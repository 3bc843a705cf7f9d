//! The manifest: what a pushed snapshot is (its record, where it can run, its files as lists
//! of chunks). Written last, so a manifest in the store means every chunk it names is there.
//! Read from the store as hostile input: bounded, parsed typed, checked before use.

use crate::{Error, Result, MAX_CHUNK};
use branchbox_model::{BackendKind, Name, Snapshot, SnapshotId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

/// The manifest format this code writes and reads.
pub const FORMAT: u32 = 1;
/// Most bytes of a manifest read from the store.
pub const MAX_MANIFEST_BYTES: u64 = 32 << 20;
/// Most files in one snapshot.
pub const MAX_FILES: usize = 100_000;
/// Most chunks in one snapshot (4 TiB at the largest chunk size).
pub const MAX_CHUNKS: usize = 1 << 20;
/// Longest relative path of a file.
const MAX_PATH: usize = 1024;

/// Where a snapshot can be restored: a pull refuses a snapshot whose fingerprint differs from
/// the host's in any field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fingerprint {
    /// The backend that restores it.
    pub backend: BackendKind,
    /// gvisor: the first line of `runsc --version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runsc: Option<String>,
    /// gvisor: runsc's platform (`ptrace`, `systrap`, `kvm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<String>,
    /// microvm: the host CPU's model name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_model: Option<String>,
    /// microvm: the host CPU's feature flags, sorted, space-separated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_flags: Option<String>,
    /// microvm: the guest kernel's build hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
}

impl Fingerprint {
    /// Fields of `self` (the snapshot's) that differ from `host`, as `name: snapshot's vs host's`.
    pub fn differences(&self, host: &Fingerprint) -> Vec<String> {
        let mut out = Vec::new();
        let mut cmp = |name: &str, a: String, b: String| {
            if a != b {
                out.push(format!("{name}: {a:?} here {b:?}"));
            }
        };
        cmp("backend", self.backend.as_str().into(), host.backend.as_str().into());
        let s = |v: &Option<String>| v.clone().unwrap_or_default();
        cmp("runsc", s(&self.runsc), s(&host.runsc));
        cmp("platform", s(&self.platform), s(&host.platform));
        cmp("cpu model", s(&self.cpu_model), s(&host.cpu_model));
        cmp("kernel", s(&self.kernel), s(&host.kernel));
        // Flags are long: name only the ones that differ.
        if self.cpu_flags != host.cpu_flags {
            let a: BTreeSet<&str> = self.cpu_flags.as_deref().unwrap_or("").split(' ').collect();
            let b: BTreeSet<&str> = host.cpu_flags.as_deref().unwrap_or("").split(' ').collect();
            let missing: Vec<&str> = a.difference(&b).take(8).copied().collect();
            let extra: Vec<&str> = b.difference(&a).take(8).copied().collect();
            out.push(format!("cpu flags: missing here {missing:?}, extra here {extra:?}"));
        }
        out
    }
}

/// One chunk of a file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChunkRef {
    /// SHA-256 of its bytes, 64 lowercase hex digits; its object is `chunks/<hash>`.
    pub hash: String,
    /// Its length in bytes.
    pub size: u64,
}

/// One file of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Its path under the snapshot's directory (`checkpoint/pages.img`).
    pub path: String,
    /// Its permission bits.
    pub mode: u32,
    /// Its size in bytes: the sum of its chunks' sizes.
    pub size: u64,
    /// Its chunks in order.
    pub chunks: Vec<ChunkRef>,
}

/// A pushed snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: u32,
    /// The snapshot's record as the pushing data directory has it.
    pub snapshot: Snapshot,
    /// Where it can be restored.
    pub fingerprint: Fingerprint,
    /// Its files, sorted by path.
    pub files: Vec<FileEntry>,
}

/// True for 64 lowercase hex digits.
pub fn is_hash(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The object key of a snapshot's manifest.
pub fn manifest_key(id: &SnapshotId) -> String {
    format!("manifests/{id}.json")
}

/// The object key of a chunk.
pub fn chunk_key(hash: &str) -> String {
    format!("chunks/{hash}")
}

/// A relative path made of plain components only, or why not.
pub fn safe_path(p: &str) -> Result<PathBuf> {
    let bad = |why: &str| Error::Invalid(format!("manifest file path {p:?} {why}"));
    if p.is_empty() || p.len() > MAX_PATH {
        return Err(bad("is empty or too long"));
    }
    let path = Path::new(p);
    if !path.components().all(|c| matches!(c, Component::Normal(_))) || p.contains('\0') || p.ends_with('/') {
        return Err(bad("is not a plain relative path"));
    }
    Ok(path.to_path_buf())
}

impl Manifest {
    /// Total bytes of its files.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    /// Number of chunk references (a chunk used twice counts twice).
    pub fn chunk_count(&self) -> usize {
        self.files.iter().map(|f| f.chunks.len()).sum()
    }

    /// Parses and checks a manifest read from the store for snapshot `id`.
    pub fn parse(bytes: &[u8], id: &SnapshotId) -> Result<Manifest> {
        if bytes.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(Error::Invalid(format!("the manifest of {id} is over {MAX_MANIFEST_BYTES} bytes")));
        }
        let m: Manifest = serde_json::from_slice(bytes)
            .map_err(|e| Error::Invalid(format!("the manifest of {id} is unreadable: {e}")))?;
        m.check(id)?;
        Ok(m)
    }

    /// Checks every bound and rule a manifest must keep.
    pub fn check(&self, id: &SnapshotId) -> Result<()> {
        let bad = |why: String| Error::Invalid(format!("the manifest of {id} is refused: {why}"));
        if self.format != FORMAT {
            return Err(bad(format!("format {} (this branchbox reads format {FORMAT})", self.format)));
        }
        if &self.snapshot.id != id {
            return Err(bad(format!("it describes snapshot {}", self.snapshot.id)));
        }
        if self.snapshot.backend != self.fingerprint.backend {
            return Err(bad("its record and fingerprint name different backends".into()));
        }
        let img = &self.snapshot.image;
        if img.is_empty()
            || img.len() > 128
            || !img.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return Err(bad(format!("image {img:?} is not an image id")));
        }
        if let Some(n) = &self.snapshot.name {
            Name::parse("snapshot name", n).map_err(|e| bad(e.to_string()))?;
        }
        if self.files.len() > MAX_FILES {
            return Err(bad(format!("{} files (at most {MAX_FILES})", self.files.len())));
        }
        if self.chunk_count() > MAX_CHUNKS {
            return Err(bad(format!("{} chunks (at most {MAX_CHUNKS})", self.chunk_count())));
        }
        let mut seen = BTreeSet::new();
        for f in &self.files {
            safe_path(&f.path).map_err(|e| bad(e.to_string()))?;
            if !seen.insert(f.path.as_str()) {
                return Err(bad(format!("file {:?} is listed twice", f.path)));
            }
            if f.mode & !0o777 != 0 {
                return Err(bad(format!("file {:?} has mode {:o}", f.path, f.mode)));
            }
            let mut sum: u64 = 0;
            for c in &f.chunks {
                if !is_hash(&c.hash) || c.size == 0 || c.size > MAX_CHUNK as u64 {
                    return Err(bad(format!(
                        "file {:?} names a bad chunk {:?} of {} bytes",
                        f.path, c.hash, c.size
                    )));
                }
                sum += c.size;
            }
            if sum != f.size {
                return Err(bad(format!(
                    "file {:?}: its chunks add up to {sum} bytes, not {}",
                    f.path, f.size
                )));
            }
        }
        // A file may not sit where another's directory is (`a` and `a/b`).
        for f in &self.files {
            let mut p = Path::new(&f.path).parent();
            while let Some(dir) = p.filter(|d| !d.as_os_str().is_empty()) {
                if dir.to_str().is_some_and(|d| seen.contains(d)) {
                    return Err(bad(format!("file {:?} lies under file {:?}", f.path, dir.display())));
                }
                p = dir.parent();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use branchbox_model::{Limits, SnapshotKind};

    fn manifest() -> Manifest {
        let id = SnapshotId::generate();
        Manifest {
            format: FORMAT,
            snapshot: Snapshot {
                id,
                parent: None,
                source: None,
                backend: BackendKind::Gvisor,
                image: "img-0123abcd".into(),
                kind: SnapshotKind::Snapshot,
                name: None,
                created_ms: 1,
                size_bytes: 3,
                limits: Limits::default(),
                expires_ms: None,
                deleted_ms: None,
            },
            fingerprint: Fingerprint {
                backend: BackendKind::Gvisor,
                runsc: Some("runsc version x".into()),
                platform: Some("ptrace".into()),
                cpu_model: None,
                cpu_flags: None,
                kernel: None,
            },
            files: vec![FileEntry {
                path: "checkpoint/pages.img".into(),
                mode: 0o600,
                size: 3,
                chunks: vec![ChunkRef { hash: "a".repeat(64), size: 3 }],
            }],
        }
    }

    #[test]
    fn a_written_manifest_reads_back() {
        let m = manifest();
        let bytes = serde_json::to_vec(&m).unwrap();
        assert_eq!(Manifest::parse(&bytes, &m.snapshot.id).unwrap(), m);
    }

    #[test]
    fn hostile_manifests_are_refused() {
        let m = manifest();
        let id = m.snapshot.id.clone();
        let mut cases: Vec<(&str, Manifest)> = Vec::new();
        let mut c = m.clone();
        c.files[0].path = "../escape".into();
        cases.push(("parent path", c));
        let mut c = m.clone();
        c.files[0].path = "/etc/passwd".into();
        cases.push(("absolute path", c));
        let mut c = m.clone();
        c.files[0].chunks[0].size = MAX_CHUNK as u64 + 1;
        c.files[0].size = MAX_CHUNK as u64 + 1;
        cases.push(("chunk too large", c));
        let mut c = m.clone();
        c.files[0].size = 4;
        cases.push(("sizes disagree", c));
        let mut c = m.clone();
        c.files[0].chunks[0].hash = "../../x".into();
        cases.push(("bad hash", c));
        let mut c = m.clone();
        c.files[0].mode = 0o4755;
        cases.push(("setuid", c));
        let mut c = m.clone();
        c.files.push(c.files[0].clone());
        cases.push(("duplicate", c));
        let mut c = m.clone();
        let mut under = c.files[0].clone();
        under.path = "checkpoint/pages.img/x".into();
        c.files.push(under);
        cases.push(("file under file", c));
        let mut c = m.clone();
        c.snapshot.image = "../../etc".into();
        cases.push(("image path", c));
        let mut c = m.clone();
        c.format = 2;
        cases.push(("format", c));
        for (what, c) in cases {
            let bytes = serde_json::to_vec(&c).unwrap();
            assert!(Manifest::parse(&bytes, &id).is_err(), "{what} accepted");
        }
        // Another snapshot's manifest under this id.
        let bytes = serde_json::to_vec(&m).unwrap();
        assert!(Manifest::parse(&bytes, &SnapshotId::generate()).is_err());
        // Not JSON, unknown fields, a bad id.
        assert!(Manifest::parse(b"\xff{", &id).is_err());
        let mut v = serde_json::to_value(&m).unwrap();
        v["extra"] = 1.into();
        assert!(Manifest::parse(&serde_json::to_vec(&v).unwrap(), &id).is_err());
        v = serde_json::to_value(&m).unwrap();
        v["snapshot"]["id"] = "snap-../../x".into();
        assert!(Manifest::parse(&serde_json::to_vec(&v).unwrap(), &id).is_err());
    }

    #[test]
    fn fingerprints_name_what_differs() {
        let a = manifest().fingerprint;
        let mut b = a.clone();
        assert!(a.differences(&b).is_empty());
        b.runsc = Some("runsc version y".into());
        let d = a.differences(&b);
        assert_eq!(d.len(), 1);
        assert!(d[0].starts_with("runsc"), "{d:?}");
    }

    proptest::proptest! {
        /// Any bytes, and any valid manifest with one byte changed, parse or are refused: never
        /// a panic, and what parses keeps every rule.
        #[test]
        fn no_input_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048),
                           at in 0usize..4096, with in proptest::prelude::any::<u8>()) {
            let m = manifest();
            let id = m.snapshot.id.clone();
            let _ = Manifest::parse(&bytes, &id);
            let mut valid = serde_json::to_vec(&m).unwrap();
            let i = at % valid.len();
            valid[i] = with;
            if let Ok(p) = Manifest::parse(&valid, &id) {
                proptest::prop_assert!(p.check(&id).is_ok());
                for f in &p.files {
                    proptest::prop_assert!(safe_path(&f.path).is_ok());
                }
            }
        }
    }
}
