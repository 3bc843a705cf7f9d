//! Chain manifests: which base, which frozen deltas (oldest first) and which writable top make
//! one disk. A manifest is replaced atomically (temporary file, fsync, rename, fsync of the
//! directory), so a crash leaves the old chain or the new one, never a mix.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::layer::{io_err, sync_dir};
use crate::LayerError;

/// The manifest format version.
const MANIFEST_VERSION: u32 = 1;
/// The largest manifest read; a chain at the depth limit needs a few KiB.
const MAX_MANIFEST_BYTES: u64 = 256 << 10;
/// The most deltas one chain may have; flatten keeps real chains far below it.
pub const MAX_DEPTH: usize = 256;
/// The longest chain name.
const MAX_NAME: usize = 64;

/// A frozen delta as a manifest names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeltaRef {
    /// The layer's id, 16 hex digits.
    pub id: String,
    /// How many clusters (filled index slots) it holds.
    pub clusters: u64,
}

/// One chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Manifest {
    pub version: u32,
    /// The read-only base disk (absolute path).
    pub base: PathBuf,
    /// The disk's size in bytes; every layer and the base must have it.
    pub disk_size: u64,
    /// Frozen deltas, oldest first.
    pub deltas: Vec<DeltaRef>,
    /// The writable top's id; none for a frozen chain (a snapshot).
    pub top: Option<String>,
}

impl Manifest {
    pub(crate) fn new(base: PathBuf, disk_size: u64, deltas: Vec<DeltaRef>, top: Option<u64>) -> Manifest {
        Manifest { version: MANIFEST_VERSION, base, disk_size, deltas, top: top.map(id_text) }
    }

    /// The deltas' ids and cluster counts, parsed.
    pub(crate) fn delta_ids(&self, path: &Path) -> Result<Vec<(u64, u64)>, LayerError> {
        self.deltas.iter().map(|d| Ok((parse_id(&d.id, path)?, d.clusters))).collect()
    }

    /// The top's id, parsed.
    pub(crate) fn top_id(&self, path: &Path) -> Result<Option<u64>, LayerError> {
        self.top.as_deref().map(|t| parse_id(t, path)).transpose()
    }

    /// Every layer id the manifest references.
    pub(crate) fn all_ids(&self, path: &Path) -> Result<Vec<u64>, LayerError> {
        let mut ids: Vec<u64> = self.delta_ids(path)?.into_iter().map(|(id, _)| id).collect();
        ids.extend(self.top_id(path)?);
        Ok(ids)
    }

    /// Reads and checks the manifest at `path`.
    pub(crate) fn load(path: &Path) -> Result<Manifest, LayerError> {
        let file = File::open(path).map_err(io_err("cannot open chain manifest", path))?;
        let mut text = Vec::new();
        file.take(MAX_MANIFEST_BYTES + 1)
            .read_to_end(&mut text)
            .map_err(io_err("cannot read chain manifest", path))?;
        let bad = |reason: String| LayerError::Manifest { path: path.display().to_string(), reason };
        if text.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(bad(format!("larger than {MAX_MANIFEST_BYTES} bytes")));
        }
        let m: Manifest = serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
        if m.version != MANIFEST_VERSION {
            return Err(bad(format!("version {}; this build reads version {MANIFEST_VERSION}", m.version)));
        }
        if !m.base.is_absolute() {
            return Err(bad(format!("the base {} is not an absolute path", m.base.display())));
        }
        if m.deltas.len() > MAX_DEPTH {
            return Err(bad(format!("{} deltas; at most {MAX_DEPTH} (flatten the chain)", m.deltas.len())));
        }
        m.all_ids(path)?;
        Ok(m)
    }

    /// Replaces the manifest at `path` atomically; durably when `durable` (else the caller
    /// syncs the directory once after writing several).
    pub(crate) fn store(&self, path: &Path, durable: bool) -> Result<(), LayerError> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let tmp = dir.join(format!(".{name}.tmp"));
        let text = serde_json::to_vec_pretty(self)
            .map_err(|e| LayerError::Manifest { path: path.display().to_string(), reason: e.to_string() })?;
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(io_err("cannot create chain manifest", &tmp))?;
        file.write_all(&text).map_err(io_err("cannot write chain manifest", &tmp))?;
        file.sync_all().map_err(io_err("cannot sync chain manifest", &tmp))?;
        std::fs::rename(&tmp, path).map_err(io_err("cannot replace chain manifest", path))?;
        if durable {
            sync_dir(dir)?;
        }
        Ok(())
    }
}

/// A layer id as manifests and file names spell it.
pub(crate) fn id_text(id: u64) -> String {
    format!("{id:016x}")
}

fn parse_id(text: &str, path: &Path) -> Result<u64, LayerError> {
    let id = (text.len() == 16 && text.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u64::from_str_radix(text, 16).ok())
        .flatten()
        .filter(|&id| id != 0);
    id.ok_or_else(|| LayerError::Manifest {
        path: path.display().to_string(),
        reason: format!("layer id {text:?} is not 16 hex digits naming a non-zero id"),
    })
}

/// Checks a chain name: 1 to 64 of `A-Z a-z 0-9 _ -`, so it is a plain file name.
pub(crate) fn check_name(name: &str) -> Result<(), LayerError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(LayerError::ChainName { name: name.to_string() })
    }
}
