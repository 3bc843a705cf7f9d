//! Portable snapshots (docs/remote.md): a snapshot's files sealed into immutable,
//! content-addressed chunks (FastCDC, 256 KiB-4 MiB, named by SHA-256) and a manifest written last,
//! in any S3-compatible store. A push sends only the chunks the store lacks; a pull checks
//! every chunk's hash and writes into a directory the caller renames into place; a gc of the
//! store marks the chunks live manifests name and sweeps the rest, under leases. With a fleet
//! key ([`signing`]) manifests are signed by pushes and checked by pulls.

pub mod lease;
pub mod manifest;
pub mod peer;
pub mod s3;
pub mod signing;

use lease::{Lease, LeaseKind};
pub use manifest::MAX_MANIFEST_BYTES;
use manifest::{chunk_key, is_hash, manifest_key, ChunkRef, FileEntry, Fingerprint, Manifest};
use peer::ChunkSource;
use s3::Remote;
use serde::Serialize;
use sha2::{Digest, Sha256};
use signing::{signature_key, MAX_SIGNATURE_BYTES};
use std::collections::{BTreeSet, HashMap};
use std::io::{Read, Write};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Smallest chunk, except a file's last. Larger chunks dedup far worse: a child's memory
/// differs from its parent's in many small places (docs/remote.md has the measurement).
pub const MIN_CHUNK: usize = 256 << 10;
/// Chunk size FastCDC aims at.
pub const AVG_CHUNK: usize = 1 << 20;
/// Largest chunk: also the most bytes of one chunk read from the store.
pub const MAX_CHUNK: usize = 4 << 20;
/// The manifest a pushed or pulled snapshot keeps beside its files, for reuse of its chunks
/// by later pulls; never itself chunked.
pub const LOCAL_MANIFEST: &str = "remote-manifest.json";

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store failed or refused a request.
    #[error("{0}")]
    Remote(String),
    /// Input (a manifest, an address) broke a rule.
    #[error("{0}")]
    Invalid(String),
    /// A chunk's content does not match its name.
    #[error("chunk {hash} of snapshot {snapshot} is corrupt in the store (its content hashes to {actual}); the pull is refused and nothing was recorded")]
    Corrupt {
        /// The chunk's name.
        hash: String,
        /// The snapshot being pulled.
        snapshot: String,
        /// What its content hashes to.
        actual: String,
    },
    /// A chunk the manifest names is not in the store.
    #[error("chunk {hash} of snapshot {snapshot} is missing from the store; the pull is refused and nothing was recorded")]
    Missing {
        /// The chunk's name.
        hash: String,
        /// The snapshot being pulled.
        snapshot: String,
    },
    /// A manifest key is configured, and the manifest in the store is unsigned or its signature
    /// does not verify.
    #[error("the manifest of snapshot {snapshot} in the store is refused: {why}. This host takes only manifests signed with its manifest key (docs/remote.md, \"Signed manifests\"); nothing was pulled")]
    Unauthentic {
        /// The snapshot.
        snapshot: String,
        /// What is wrong with its signature.
        why: String,
    },
    /// No manifest for that snapshot.
    #[error("snapshot {0} is not in the store (no manifest)")]
    NotFound(String),
    /// The caller stopped the operation.
    #[error("stopped after {0} chunks; no manifest was written, the next push sends the rest")]
    Stopped(usize),
    /// A local file.
    #[error("{path}: {err}")]
    Io {
        /// The file.
        path: String,
        /// What happened.
        err: std::io::Error,
    },
}

/// This crate's results.
pub type Result<T> = std::result::Result<T, Error>;

fn io(path: &Path, err: std::io::Error) -> Error {
    Error::Io { path: path.display().to_string(), err }
}

/// Where an operation is, for a progress bar; the callback may stop a push.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Bytes handled so far (sent, skipped, fetched or reused).
    pub done_bytes: u64,
    /// Bytes in all.
    pub total_bytes: u64,
    /// Chunks handled so far.
    pub chunks: usize,
}

/// What a push did.
#[derive(Debug, Clone, Serialize)]
pub struct PushReport {
    /// The snapshot.
    pub snapshot: String,
    /// Chunks in its manifest.
    pub chunks: usize,
    /// Chunks uploaded.
    pub sent_chunks: usize,
    /// Bytes uploaded.
    pub sent_bytes: u64,
    /// Bytes the store had already.
    pub skipped_bytes: u64,
    /// Wall time.
    pub seconds: f64,
}

/// What a pull did.
#[derive(Debug, Clone, Serialize)]
pub struct PullReport {
    /// The snapshot.
    pub snapshot: String,
    /// Chunks in its manifest.
    pub chunks: usize,
    /// Bytes downloaded: `peer_bytes` + `s3_bytes`.
    pub fetched_bytes: u64,
    /// Bytes copied from snapshots already here.
    pub reused_bytes: u64,
    /// Bytes fetched from the peer (another node's branchboxd holding the snapshot).
    pub peer_bytes: u64,
    /// Bytes fetched from the store.
    pub s3_bytes: u64,
    /// Why the pull stopped asking the peer, when it had one and it failed.
    pub peer_error: Option<String>,
    /// Wall time.
    pub seconds: f64,
}

/// What a gc of the store did or would do.
#[derive(Debug, Clone, Serialize)]
pub struct GcReport {
    /// Only reported.
    pub dry_run: bool,
    /// False when live leases of others stopped the sweep.
    pub swept: bool,
    /// Live leases of pushes, pulls or other gcs found.
    pub live_leases: usize,
    /// Manifests marked from.
    pub manifests: usize,
    /// Chunks they name.
    pub live_chunks: usize,
    /// Chunks deleted (or that would be).
    pub deleted_chunks: Vec<String>,
    /// Their bytes.
    pub deleted_bytes: u64,
    /// Expired leases deleted (or that would be).
    pub expired_leases: usize,
    /// Manifest signatures without their manifest deleted (or that would be).
    pub deleted_signatures: usize,
}

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// The regular files under `dir` as sorted relative paths, skipping [`LOCAL_MANIFEST`] and
/// `tmp-*` leftovers; links and special files are refused (a snapshot has none).
fn files_of(dir: &Path) -> Result<Vec<String>> {
    fn walk(root: &Path, rel: &Path, out: &mut Vec<String>) -> Result<()> {
        let here = root.join(rel);
        for e in std::fs::read_dir(&here).map_err(|e| io(&here, e))? {
            let e = e.map_err(|e| io(&here, e))?;
            let name = e.file_name();
            let Some(n) = name.to_str() else {
                return Err(Error::Invalid(format!("{}: a file name that is not UTF-8", here.display())));
            };
            if rel.as_os_str().is_empty() && (n == LOCAL_MANIFEST || n.starts_with("tmp-")) {
                continue;
            }
            let ty = e.file_type().map_err(|err| io(&e.path(), err))?;
            let r = rel.join(n);
            if ty.is_dir() {
                walk(root, &r, out)?;
            } else if ty.is_file() {
                out.push(r.to_str().unwrap_or_default().to_string());
            } else {
                return Err(Error::Invalid(format!(
                    "{}: not a regular file or directory",
                    e.path().display()
                )));
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, Path::new(""), &mut out)?;
    out.sort();
    Ok(out)
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp-{:08x}", rand::random::<u32>()));
    std::fs::write(&tmp, bytes).map_err(|e| io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(path, e)
    })
}

/// Pushes the snapshot whose files are in `dir`, described by `snapshot` and `fingerprint`:
/// uploads the chunks the store lacks, then the manifest (its signature first, when the remote
/// has a manifest key). `progress` is called after each chunk; `Break` stops the push there (no
/// manifest is written). A snapshot whose manifest is in the store already is not pushed again
/// (with a key, that manifest must verify). Writes [`LOCAL_MANIFEST`] into `dir`.
pub fn push(
    remote: &Remote,
    dir: &Path,
    snapshot: &branchbox_model::Snapshot,
    fingerprint: Fingerprint,
    progress: &mut dyn FnMut(Progress) -> ControlFlow<()>,
) -> Result<PushReport> {
    let started = Instant::now();
    let id = snapshot.id.to_string();
    remote.ensure_bucket()?;
    let mkey = manifest_key(&snapshot.id);
    let mut lease = Lease::take(remote, LeaseKind::Push, &id)?;
    if remote.head(&mkey)?.is_some() {
        let m = fetch_manifest(remote, &snapshot.id)?;
        return Ok(PushReport {
            snapshot: id,
            chunks: m.chunk_count(),
            sent_chunks: 0,
            sent_bytes: 0,
            skipped_bytes: m.total_bytes(),
            seconds: started.elapsed().as_secs_f64(),
        });
    }
    let paths = files_of(dir)?;
    let mut total = 0;
    for p in &paths {
        let full = dir.join(p);
        total += std::fs::metadata(&full).map_err(|e| io(&full, e))?.len();
    }
    let mut report =
        PushReport { snapshot: id, chunks: 0, sent_chunks: 0, sent_bytes: 0, skipped_bytes: 0, seconds: 0.0 };
    // Chunks known to be in the store: this push's and ones it found there.
    let mut present: BTreeSet<String> = BTreeSet::new();
    let mut files = Vec::new();
    for p in paths {
        let full = dir.join(&p);
        let f = std::fs::File::open(&full).map_err(|e| io(&full, e))?;
        let meta = f.metadata().map_err(|e| io(&full, e))?;
        let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777;
        let mut entry = FileEntry { path: p, mode, size: 0, chunks: Vec::new() };
        for c in fastcdc::v2020::StreamCDC::new(f, MIN_CHUNK, AVG_CHUNK, MAX_CHUNK) {
            let c = c.map_err(|e| io(&full, std::io::Error::other(e.to_string())))?;
            let hash = sha256_hex(&c.data);
            let size = c.length as u64;
            if present.contains(&hash) || remote.head(&chunk_key(&hash))? == Some(size) {
                report.skipped_bytes += size;
            } else {
                remote.put(&chunk_key(&hash), &c.data)?;
                report.sent_chunks += 1;
                report.sent_bytes += size;
            }
            present.insert(hash.clone());
            entry.size += size;
            entry.chunks.push(ChunkRef { hash, size });
            report.chunks += 1;
            lease.renew_if_due()?;
            let at = Progress {
                done_bytes: report.sent_bytes + report.skipped_bytes,
                total_bytes: total,
                chunks: report.chunks,
            };
            if progress(at).is_break() {
                return Err(Error::Stopped(report.chunks));
            }
        }
        files.push(entry);
    }
    let manifest = Manifest { format: manifest::FORMAT, snapshot: snapshot.clone(), fingerprint, files };
    manifest.check(&snapshot.id)?;
    let bytes = serde_json::to_vec(&manifest).map_err(|e| Error::Invalid(e.to_string()))?;
    if let Some(key) = remote.manifest_key() {
        // Before the manifest, so that a manifest in the store always has its signature.
        remote.put(&signature_key(&snapshot.id), &key.sign(&snapshot.id, &bytes)?)?;
    }
    // Last: from here on the snapshot is in the store.
    remote.put(&mkey, &bytes)?;
    write_atomic(&dir.join(LOCAL_MANIFEST), &bytes)?;
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// A snapshot's manifest as the store has it, unparsed.
fn manifest_bytes(remote: &Remote, id: &branchbox_model::SnapshotId) -> Result<Vec<u8>> {
    remote.get(&manifest_key(id), MAX_MANIFEST_BYTES)?.ok_or_else(|| Error::NotFound(id.to_string()))
}

/// Reads and checks a snapshot's manifest from the store. When the remote has a manifest key,
/// the manifest's signature is checked first, before its bytes are parsed.
pub fn fetch_manifest(remote: &Remote, id: &branchbox_model::SnapshotId) -> Result<Manifest> {
    let bytes = manifest_bytes(remote, id)?;
    if let Some(key) = remote.manifest_key() {
        let sig = remote.get(&signature_key(id), MAX_SIGNATURE_BYTES)?;
        key.verify(id, &bytes, sig.as_deref())?;
    }
    Manifest::parse(&bytes, id)
}

/// Deletes a snapshot's manifest (then its signature) from the store, so that the next [`gc`]
/// sweeps the chunks no other manifest names. Pulls already running finish (their leases
/// hold the gc off).
pub fn remove(remote: &Remote, id: &branchbox_model::SnapshotId) -> Result<()> {
    if remote.head(&manifest_key(id))?.is_none() {
        return Err(Error::NotFound(id.to_string()));
    }
    remote.delete(&manifest_key(id))?;
    remote.delete(&signature_key(id))
}

/// Chunks available in snapshots of this data directory, from their [`LOCAL_MANIFEST`]s.
#[derive(Default)]
pub struct LocalChunks {
    at: HashMap<String, (PathBuf, u64, u64)>,
}

impl LocalChunks {
    /// Indexes the pushed or pulled snapshots under `snapshots_dir` (unreadable ones are skipped:
    /// every reused chunk is checked against its hash anyway).
    pub fn scan(snapshots_dir: &Path) -> LocalChunks {
        let mut at = HashMap::new();
        let Ok(dirs) = std::fs::read_dir(snapshots_dir) else { return LocalChunks { at } };
        for d in dirs.flatten() {
            let dir = d.path();
            let Ok(f) = std::fs::File::open(dir.join(LOCAL_MANIFEST)) else { continue };
            let mut bytes = Vec::new();
            if f.take(MAX_MANIFEST_BYTES + 1).read_to_end(&mut bytes).is_err() {
                continue;
            }
            let Ok(m) = serde_json::from_slice::<Manifest>(&bytes) else { continue };
            if m.check(&m.snapshot.id).is_err() {
                continue;
            }
            for f in &m.files {
                let mut off = 0;
                for c in &f.chunks {
                    at.entry(c.hash.clone()).or_insert_with(|| (dir.join(&f.path), off, c.size));
                    off += c.size;
                }
            }
        }
        LocalChunks { at }
    }

    /// A chunk's bytes from a local snapshot, when one has it intact.
    fn read(&self, hash: &str) -> Option<Vec<u8>> {
        let (path, off, size) = self.at.get(hash)?;
        let buf = peer::read_range(path, *off, *size).ok()?;
        (buf.len() as u64 == *size && sha256_hex(&buf) == hash).then_some(buf)
    }
}

/// Writes the files of `manifest` into `dest` (which must not exist), each chunk copied from a
/// local snapshot that has it or fetched from the store, and checked against its hash. On
/// error `dest` is removed. Writes [`LOCAL_MANIFEST`] last.
pub fn materialize(
    remote: &Remote,
    manifest: &Manifest,
    dest: &Path,
    local: &LocalChunks,
    progress: &mut dyn FnMut(Progress),
) -> Result<PullReport> {
    materialize_from(remote, None, manifest, dest, local, progress)
}

/// [`materialize`], asking `peer` for each chunk not found here before the store. The first
/// time the peer fails (unreachable, an error, a chunk of the wrong size or hash) the pull
/// says why in [`PullReport::peer_error`] and takes that chunk and every later one from the
/// store; a peer never makes a pull fail.
pub fn materialize_from(
    remote: &Remote,
    peer: Option<&dyn ChunkSource>,
    manifest: &Manifest,
    dest: &Path,
    local: &LocalChunks,
    progress: &mut dyn FnMut(Progress),
) -> Result<PullReport> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(0o700).create(dest).map_err(|e| io(dest, e))?;
    let r = materialize_inner(remote, peer, manifest, dest, local, progress);
    if r.is_err() {
        let _ = std::fs::remove_dir_all(dest);
    }
    r
}

/// Chunk `c` of `manifest` from the peer while it answers well, else from the store; counted
/// in `report` by where it came from.
fn fetch_chunk(
    remote: &Remote,
    peer: &mut Option<&dyn ChunkSource>,
    manifest: &Manifest,
    c: &ChunkRef,
    report: &mut PullReport,
) -> Result<Vec<u8>> {
    let id = &manifest.snapshot.id;
    if let Some(p) = *peer {
        let why = match p.fetch(id, &c.hash, c.size) {
            Ok(d) if d.len() as u64 == c.size && sha256_hex(&d) == c.hash => {
                report.peer_bytes += c.size;
                report.fetched_bytes += c.size;
                return Ok(d);
            }
            Ok(d) => format!("chunk {} from the peer hashes to {}", c.hash, sha256_hex(&d)),
            Err(e) => e.to_string(),
        };
        report.peer_error = Some(why);
        *peer = None;
    }
    let d = remote
        .get(&chunk_key(&c.hash), c.size)?
        .ok_or_else(|| Error::Missing { hash: c.hash.clone(), snapshot: id.to_string() })?;
    let actual = sha256_hex(&d);
    if actual != c.hash || d.len() as u64 != c.size {
        return Err(Error::Corrupt { hash: c.hash.clone(), snapshot: id.to_string(), actual });
    }
    report.s3_bytes += c.size;
    report.fetched_bytes += c.size;
    Ok(d)
}

fn materialize_inner(
    remote: &Remote,
    mut peer: Option<&dyn ChunkSource>,
    manifest: &Manifest,
    dest: &Path,
    local: &LocalChunks,
    progress: &mut dyn FnMut(Progress),
) -> Result<PullReport> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let started = Instant::now();
    let id = manifest.snapshot.id.to_string();
    let mut lease = Lease::take(remote, LeaseKind::Pull, &id)?;
    let total = manifest.total_bytes();
    let mut report = PullReport {
        snapshot: id.clone(),
        chunks: 0,
        fetched_bytes: 0,
        reused_bytes: 0,
        peer_bytes: 0,
        s3_bytes: 0,
        peer_error: None,
        seconds: 0.0,
    };
    for f in &manifest.files {
        let path = dest.join(manifest::safe_path(&f.path)?);
        if let Some(parent) = path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(|e| io(parent, e))?;
        }
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(f.mode | 0o600)
            .open(&path)
            .map_err(|e| io(&path, e))?;
        for c in &f.chunks {
            debug_assert!(is_hash(&c.hash));
            let data = match local.read(&c.hash) {
                Some(d) => {
                    report.reused_bytes += c.size;
                    d
                }
                None => fetch_chunk(remote, &mut peer, manifest, c, &mut report)?,
            };
            out.write_all(&data).map_err(|e| io(&path, e))?;
            report.chunks += 1;
            lease.renew_if_due()?;
            progress(Progress {
                done_bytes: report.fetched_bytes + report.reused_bytes,
                total_bytes: total,
                chunks: report.chunks,
            });
        }
        out.sync_all().map_err(|e| io(&path, e))?;
        // The snapshot's own modes, without the owner bits added above to write it.
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(f.mode))
            .map_err(|e| io(&path, e))?;
    }
    let bytes = serde_json::to_vec(manifest).map_err(|e| Error::Invalid(e.to_string()))?;
    write_atomic(&dest.join(LOCAL_MANIFEST), &bytes)?;
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Mark and sweep: deletes the chunks no manifest names, and leases that expired. Sweeps
/// nothing while another push, pull or gc holds a live lease (see [`lease`]).
pub fn gc(remote: &Remote, dry_run: bool) -> Result<GcReport> {
    let mut report = GcReport {
        dry_run,
        swept: false,
        live_leases: 0,
        manifests: 0,
        live_chunks: 0,
        deleted_chunks: Vec::new(),
        deleted_bytes: 0,
        expired_leases: 0,
        deleted_signatures: 0,
    };
    let lease = match Lease::take_gc(remote)? {
        Ok(l) => l,
        Err(live) => {
            report.live_leases = live;
            return Ok(report);
        }
    };
    let mut live = BTreeSet::new();
    let listed = remote.list("manifests/")?;
    let mut signatures = Vec::new();
    let mut manifests = BTreeSet::new();
    for m in &listed {
        let Some(name) = m.key.strip_prefix("manifests/") else { continue };
        if let Some(id) = name.strip_suffix(".sig") {
            signatures.push((id, &m.key));
            continue;
        }
        let Some(id) = name.strip_suffix(".json") else { continue };
        manifests.insert(id);
        // A manifest that cannot be read names chunks nobody can know: sweep nothing.
        let id = branchbox_model::SnapshotId::parse(id).map_err(|e| {
            Error::Invalid(format!(
                "gc stopped: object {} is not a manifest of ours ({e}); nothing was deleted",
                m.key
            ))
        })?;
        // Signed or not: a manifest only keeps chunks, so an unsigned one cannot make gc lose any.
        let manifest = match manifest_bytes(remote, &id).and_then(|b| Manifest::parse(&b, &id)) {
            Ok(m) => m,
            // Deleted since the listing.
            Err(Error::NotFound(_)) => continue,
            Err(e) => return Err(Error::Invalid(format!("gc stopped: {e}; nothing was deleted"))),
        };
        report.manifests += 1;
        for f in &manifest.files {
            live.extend(f.chunks.iter().map(|c| c.hash.clone()));
        }
    }
    report.live_chunks = live.len();
    for c in remote.list("chunks/")? {
        let Some(hash) = c.key.strip_prefix("chunks/") else { continue };
        if live.contains(hash) {
            continue;
        }
        if !dry_run {
            remote.delete(&c.key)?;
        }
        report.deleted_chunks.push(hash.to_string());
        report.deleted_bytes += c.size;
    }
    // A signature whose manifest is gone: from a removed manifest, or a push that died between
    // writing the two.
    for (id, key) in signatures {
        if !manifests.contains(id) {
            if !dry_run {
                remote.delete(key)?;
            }
            report.deleted_signatures += 1;
        }
    }
    for l in lease::list(remote)? {
        if !l.live() {
            if !dry_run {
                remote.delete(&l.key)?;
            }
            report.expired_leases += 1;
        }
    }
    report.swept = true;
    drop(lease);
    Ok(report)
}
