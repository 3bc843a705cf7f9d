//! Chunks between nodes: a pull asks a peer (another node's branchboxd that holds the snapshot)
//! for each chunk before the store. [`ChunkSource`] is what a pull fetches from besides the
//! store; [`Peer`] asks a branchboxd over HTTP (`GET /v1/snapshots/{id}/chunks/{sha256}`);
//! [`HeldChunks`] is the serving side: a chunk of a snapshot this data directory holds, read at
//! the offset its manifest gives and checked against its hash. docs/remote.md, "Pull
//! from a peer", describes both ends.

use crate::manifest::{is_hash, safe_path, Manifest};
use crate::{io, sha256_hex, Error, Result, LOCAL_MANIFEST, MAX_MANIFEST_BYTES};
use branchbox_model::SnapshotId;
use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where a pull may take a chunk from before the store. Whatever it answers is checked by the
/// pull against the chunk's size and hash; any failure sends the pull to the store.
pub trait ChunkSource {
    /// Chunk `hash` (`size` bytes) of snapshot `snapshot`; reads at most `size` bytes.
    fn fetch(&self, snapshot: &SnapshotId, hash: &str, size: u64) -> Result<Vec<u8>>;
}

/// Most bytes of a peer's error answer kept for a message.
const MAX_ERROR_BODY: u64 = 4096;

/// Another node's branchboxd that holds snapshots this node pulls.
pub struct Peer {
    base: String,
    token: Option<String>,
    agent: ureq::Agent,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token stays out of logs.
        f.debug_struct("Peer").field("base", &self.base).finish()
    }
}

impl Peer {
    /// A peer at `url` (`http://HOST:PORT`, no path, no user info) that accepts `token` (none
    /// when it runs without authentication). No request is made.
    pub fn new(url: &str, token: Option<String>) -> Result<Peer> {
        let bad = |why: &str| Error::Invalid(format!("peer {url:?} is not http://HOST:PORT: {why}"));
        if url.len() > 256 {
            return Err(bad("too long"));
        }
        let u = url::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
        if u.scheme() != "http" {
            return Err(bad("only http:// peers are supported"));
        }
        if !matches!(u.path(), "" | "/") || u.query().is_some() || u.fragment().is_some() {
            return Err(bad("it has a path, query or fragment"));
        }
        if !u.username().is_empty() || u.password().is_some() {
            return Err(bad("it carries user information"));
        }
        let (Some(host), Some(port)) = (u.host_str(), u.port_or_known_default()) else {
            return Err(bad("no host"));
        };
        if let Some(t) = &token {
            if t.is_empty() || t.len() > 512 || !t.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(Error::Invalid(
                    "the peer's token must be 1 to 512 visible ASCII characters".into(),
                ));
            }
        }
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(3))
            .timeout_read(Duration::from_secs(30))
            .timeout_write(Duration::from_secs(30))
            .build();
        Ok(Peer { base: format!("http://{host}:{port}"), token, agent })
    }

    /// `http://HOST:PORT`, for messages.
    pub fn url(&self) -> &str {
        &self.base
    }
}

impl ChunkSource for Peer {
    fn fetch(&self, snapshot: &SnapshotId, hash: &str, size: u64) -> Result<Vec<u8>> {
        // Both path segments are checked names: an id and 64 hex digits.
        if !is_hash(hash) {
            return Err(Error::Invalid(format!("{hash:?} is not a chunk name")));
        }
        let path = format!("/v1/snapshots/{snapshot}/chunks/{hash}");
        let mut req = self.agent.get(&format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.set("authorization", &format!("Bearer {t}"));
        }
        let resp = match req.call() {
            Ok(r) => r,
            Err(ureq::Error::Status(code, r)) => {
                let mut body = String::new();
                let _ = r.into_reader().take(MAX_ERROR_BODY).read_to_string(&mut body);
                let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                let why = v["error"]["message"].as_str().unwrap_or("").chars().take(300).collect::<String>();
                return Err(Error::Remote(format!("GET {path} from peer {}: HTTP {code} {why}", self.base)));
            }
            Err(e) => return Err(Error::Remote(format!("GET {path} from peer {}: {e}", self.base))),
        };
        let mut body = Vec::new();
        resp.into_reader()
            .take(size + 1)
            .read_to_end(&mut body)
            .map_err(|e| Error::Remote(format!("GET {path} from peer {}: {e}", self.base)))?;
        if body.len() as u64 != size {
            return Err(Error::Remote(format!(
                "GET {path} from peer {}: {} bytes where the manifest says {size}",
                self.base,
                if body.len() as u64 > size { format!("over {size}") } else { body.len().to_string() }
            )));
        }
        Ok(body)
    }
}

/// Why [`read_held_chunk`] gives no chunk.
#[derive(Debug, thiserror::Error)]
pub enum HeldError {
    /// No pushed or pulled snapshot by that id here (no local manifest).
    #[error("snapshot {0} is not held here as a pushed or pulled snapshot")]
    NoSnapshot(String),
    /// The snapshot's manifest does not name that chunk.
    #[error("snapshot {snapshot} has no chunk {hash}")]
    NotNamed {
        /// The snapshot.
        snapshot: String,
        /// The chunk asked for.
        hash: String,
    },
    /// The local copy is damaged, or reading it failed.
    #[error("{0}")]
    Local(Error),
}

/// Where the chunks of a snapshot this data directory holds lie, from its [`LOCAL_MANIFEST`]
/// (written by the push that sent it or the pull that brought it): for each chunk the manifest
/// names, the file and offset of its first use. A server keeps one between requests for the
/// same manifest file rather than parse the manifest for every chunk.
#[derive(Debug)]
pub struct HeldChunks {
    id: SnapshotId,
    /// Each file's path here and as the manifest names it.
    files: Vec<(PathBuf, String)>,
    /// Chunk hash: its file (an index into `files`), offset and size.
    at: HashMap<String, (usize, u64, u64)>,
}

impl HeldChunks {
    /// Reads and checks the manifest of snapshot `id`, whose directory here is `snapshot_dir`.
    pub fn load(snapshot_dir: &Path, id: &SnapshotId) -> std::result::Result<HeldChunks, HeldError> {
        let mpath = snapshot_dir.join(LOCAL_MANIFEST);
        let f = match std::fs::File::open(&mpath) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(HeldError::NoSnapshot(id.to_string()))
            }
            Err(e) => return Err(HeldError::Local(io(&mpath, e))),
        };
        let mut bytes = Vec::new();
        f.take(MAX_MANIFEST_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| HeldError::Local(io(&mpath, e)))?;
        let m = Manifest::parse(&bytes, id).map_err(HeldError::Local)?;
        let mut held = HeldChunks { id: id.clone(), files: Vec::new(), at: HashMap::new() };
        for file in m.files {
            let path = snapshot_dir.join(safe_path(&file.path).map_err(HeldError::Local)?);
            let index = held.files.len();
            let mut off = 0;
            for c in file.chunks {
                held.at.entry(c.hash).or_insert((index, off, c.size));
                off += c.size;
            }
            held.files.push((path, file.path));
        }
        Ok(held)
    }

    /// Chunk `hash`, read at the offset the manifest gives and checked against its hash before
    /// it is handed out.
    pub fn read(&self, hash: &str) -> std::result::Result<Vec<u8>, HeldError> {
        let not_named =
            || HeldError::NotNamed { snapshot: self.id.to_string(), hash: hash.chars().take(80).collect() };
        if !is_hash(hash) {
            return Err(not_named());
        }
        let &(index, off, size) = self.at.get(hash).ok_or_else(not_named)?;
        let (path, named) = self.files.get(index).ok_or_else(not_named)?;
        let data = read_range(path, off, size).map_err(|e| HeldError::Local(io(path, e)))?;
        let actual = sha256_hex(&data);
        if data.len() as u64 != size || actual != hash {
            return Err(HeldError::Local(Error::Invalid(format!(
                "chunk {hash} of snapshot {} is damaged here ({named} hashes to {actual}); it is not served",
                self.id
            ))));
        }
        Ok(data)
    }
}

/// Chunk `hash` of snapshot `id`, whose directory here is `snapshot_dir`: only a chunk its
/// [`LOCAL_MANIFEST`] names ([`HeldChunks`], read for this one chunk).
pub fn read_held_chunk(
    snapshot_dir: &Path,
    id: &SnapshotId,
    hash: &str,
) -> std::result::Result<Vec<u8>, HeldError> {
    if !is_hash(hash) {
        return Err(HeldError::NotNamed { snapshot: id.to_string(), hash: hash.chars().take(80).collect() });
    }
    HeldChunks::load(snapshot_dir, id)?.read(hash)
}

/// At most `size` bytes of `path` from `off` (fewer at its end).
pub(crate) fn read_range(path: &Path, off: u64, size: u64) -> std::io::Result<Vec<u8>> {
    let mut f = std::fs::File::open(path)?;
    f.seek(SeekFrom::Start(off))?;
    let mut buf = Vec::with_capacity(size as usize);
    f.take(size).read_to_end(&mut buf)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::Peer;

    #[test]
    fn peer_addresses_are_checked_and_the_token_stays_out_of_debug_output() {
        let p = Peer::new("http://127.0.0.3:7420", Some("bbx_secret_token_0123".into())).unwrap();
        assert_eq!(p.url(), "http://127.0.0.3:7420");
        assert!(!format!("{p:?}").contains("secret"));
        assert_eq!(Peer::new("http://127.0.0.3:7420/", None).unwrap().url(), "http://127.0.0.3:7420");
        for bad in [
            "https://127.0.0.3:7420",
            "http://127.0.0.3:7420/v1",
            "http://u:p@127.0.0.3:7420",
            "http://127.0.0.3:7420?x=1",
            "127.0.0.3:7420",
            "not a url",
        ] {
            assert!(Peer::new(bad, None).is_err(), "{bad} accepted");
        }
        assert!(Peer::new("http://127.0.0.3:7420", Some("a b".into())).is_err());
        assert!(Peer::new("http://127.0.0.3:7420", Some(String::new())).is_err());
    }
}
