//! Fleet peers: other branchboxd nodes this one answers for. With `--peers FILE`, a request
//! that names a sandbox this node does not hold (`/v1/sandboxes/{id}/...`, E2B's
//! `/e2b/sandboxes/{id}/...`, or envd's `/e2b/envd/...` with `E2b-Sandbox-Id`) is forwarded to
//! the peer that holds it, so one node's address serves the whole fleet to the unchanged SDKs.
//! The client authenticates to this node; this node authenticates to the peer with the
//! peer's token, which never reaches the client. `docs/fleet.md` describes it.
//!
//! The peers file is JSON, `{"node": "n2", "peers": [{"name": "n3", "url":
//! "http://10.0.0.3:7420", "token": "..."}]}` (`node`, this node's own name, may be left out),
//! mode 0600, re-read when it changes (the fleet's node actor rewrites it as nodes come and go).
//!
//! [`listing`] answers a listing with the whole fleet's sandboxes, [`spill`] passes a create
//! this node has no room for to the peer with the most ([`capacity`] says how much a node has),
//! and [`remote`] serves the chunks of the snapshots this node holds to its peers, and pushes
//! and pulls snapshots through the API, a pull asking a peer before the store.

pub mod capacity;
pub mod dispatch;
pub mod forward;
pub mod listing;
pub mod remote;
pub mod spill;

pub use dispatch::forward;

use serde::Deserialize;
use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// Largest peers file read.
pub const MAX_PEERS_FILE: u64 = 64 << 10;
/// Most peers in one file.
pub const MAX_PEERS: usize = 64;
/// How long an answer to "who holds sandbox X" is kept.
const OWNER_TTL: Duration = Duration::from_secs(10);
/// Most owner answers kept; the cache is emptied when full.
const MAX_CACHED: usize = 4096;

/// One peer node: its name (for messages), its base URL and the token it accepts.
#[derive(Clone, PartialEq, Eq)]
pub struct Peer {
    /// The node's name, as the fleet calls it.
    pub name: String,
    /// `host:port` of its branchboxd (plain HTTP).
    pub authority: String,
    /// The bearer token it accepts; sent to it only.
    pub token: String,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token stays out of logs.
        f.debug_struct("Peer").field("name", &self.name).field("authority", &self.authority).finish()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PeersFile {
    #[serde(default)]
    node: Option<String>,
    peers: Vec<PeerEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PeerEntry {
    name: String,
    url: String,
    token: String,
}

/// What a peers file says: this node's own name, when it gives one, and the peers.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PeersList {
    /// This node's name in the fleet (the file's `node`).
    pub node: Option<String>,
    /// The other nodes.
    pub peers: Vec<Peer>,
}

fn name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Parses a peers file's text: at most [`MAX_PEERS_FILE`] bytes and [`MAX_PEERS`] peers, names
/// of letters, digits, `.`, `_` and `-`, URLs `http://host:port` with no path, tokens of 16 to
/// 512 visible ASCII characters.
pub fn parse_peers(text: &[u8]) -> anyhow::Result<PeersList> {
    anyhow::ensure!(text.len() as u64 <= MAX_PEERS_FILE, "the peers file is over {MAX_PEERS_FILE} bytes");
    let file: PeersFile = serde_json::from_slice(text).map_err(|e| {
        anyhow::anyhow!("the peers file is not {{\"node\": name, \"peers\": [{{name, url, token}}]}}: {e}")
    })?;
    anyhow::ensure!(file.peers.len() <= MAX_PEERS, "the peers file lists over {MAX_PEERS} peers");
    if let Some(n) = &file.node {
        anyhow::ensure!(name_ok(n), "node name {n:?} must be 1 to 64 letters, digits, '.', '_' or '-'");
    }
    let mut out: Vec<Peer> = Vec::with_capacity(file.peers.len());
    for p in file.peers {
        anyhow::ensure!(
            name_ok(&p.name),
            "peer name {:?} must be 1 to 64 letters, digits, '.', '_' or '-'",
            p.name
        );
        anyhow::ensure!(file.node.as_ref() != Some(&p.name), "peer {} is this node itself", p.name);
        let authority = authority_of(&p.url)
            .ok_or_else(|| anyhow::anyhow!("peer {}: url {:?} must be http://host:port", p.name, p.url))?;
        let token_ok = (16..=512).contains(&p.token.len()) && p.token.bytes().all(|b| b.is_ascii_graphic());
        anyhow::ensure!(token_ok, "peer {}: the token must be 16 to 512 visible ASCII characters", p.name);
        anyhow::ensure!(out.iter().all(|o| o.name != p.name), "peer {} is listed twice", p.name);
        out.push(Peer { name: p.name, authority, token: p.token });
    }
    Ok(PeersList { node: file.node, peers: out })
}

fn authority_of(url: &str) -> Option<String> {
    if url.len() > 256 {
        return None;
    }
    let uri: axum::http::Uri = url.parse().ok()?;
    let path_ok = matches!(uri.path(), "" | "/") && uri.query().is_none();
    let auth = uri.authority()?;
    (uri.scheme_str() == Some("http") && path_ok && auth.port_u16().is_some() && !auth.as_str().contains('@'))
        .then(|| auth.as_str().to_string())
}

#[derive(Default)]
struct Loaded {
    /// (modification time, length) of the file the peers came from.
    stamp: Option<(SystemTime, u64)>,
    node: Option<String>,
    peers: Arc<Vec<Peer>>,
}

/// This node's view of its peers, and a short cache of which peer holds which sandbox.
#[derive(Clone)]
pub struct Fleet {
    inner: Arc<Inner>,
}

struct Inner {
    st: crate::AppState,
    file: Option<PathBuf>,
    loaded: Mutex<Loaded>,
    owners: Mutex<HashMap<String, (String, Instant)>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Fleet {
    /// The fleet of the service `st`: inert unless its configuration names a peers file.
    pub fn new(st: &crate::AppState) -> Fleet {
        Fleet {
            inner: Arc::new(Inner {
                st: st.clone(),
                file: st.cfg.peers.clone(),
                loaded: Mutex::default(),
                owners: Mutex::default(),
            }),
        }
    }

    /// Whether a peers file is configured at all.
    pub fn enabled(&self) -> bool {
        self.inner.file.is_some()
    }

    pub(crate) fn state(&self) -> &crate::AppState {
        &self.inner.st
    }

    /// The peers, re-read when the file's modification time or length changed. A file that is
    /// missing means no peers; one that does not parse, or that other users can read, keeps
    /// the peers read before (and says why in the log).
    pub fn peers(&self) -> Arc<Vec<Peer>> {
        self.reload(|l| l.peers.clone())
    }

    /// This node's own name, as the peers file gives it (`node`).
    pub fn node_name(&self) -> Option<String> {
        self.reload(|l| l.node.clone())
    }

    fn reload<T>(&self, f: impl FnOnce(&Loaded) -> T) -> T {
        let Some(path) = &self.inner.file else { return f(&Loaded::default()) };
        let mut loaded = lock(&self.inner.loaded);
        let stamp =
            std::fs::metadata(path).ok().map(|m| (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()));
        if stamp != loaded.stamp {
            loaded.stamp = stamp;
            match stamp {
                None => (loaded.node, loaded.peers) = (None, Arc::default()),
                Some(_) => match read_peers(path) {
                    Ok(p) => (loaded.node, loaded.peers) = (p.node, Arc::new(p.peers)),
                    Err(e) => {
                        tracing::warn!("peers file {}: {e:#}; keeping the peers read before", path.display())
                    }
                },
            }
        }
        f(&loaded)
    }

    pub(crate) fn cached_owner(&self, id: &str) -> Option<String> {
        let owners = lock(&self.inner.owners);
        owners.get(id).filter(|(_, at)| at.elapsed() < OWNER_TTL).map(|(p, _)| p.clone())
    }

    pub(crate) fn remember_owner(&self, id: &str, peer: &str) {
        let mut owners = lock(&self.inner.owners);
        if owners.len() >= MAX_CACHED {
            owners.clear();
        }
        owners.insert(id.to_string(), (peer.to_string(), Instant::now()));
    }

    pub(crate) fn forget_owner(&self, id: &str) {
        lock(&self.inner.owners).remove(id);
    }
}

fn read_peers(path: &Path) -> anyhow::Result<PeersList> {
    use std::io::Read;
    let f = std::fs::File::open(path)?;
    let mode = f.metadata()?.permissions().mode();
    anyhow::ensure!(
        mode & 0o077 == 0,
        "it holds tokens but other users may read it (mode {:o}); run `chmod 600` on it",
        mode & 0o777
    );
    let mut text = Vec::new();
    f.take(MAX_PEERS_FILE + 1).read_to_end(&mut text)?;
    parse_peers(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "bbx_0123456789abcdef0123";

    fn one(url: &str, token: &str, name: &str) -> String {
        serde_json::json!({"peers": [{"name": name, "url": url, "token": token}]}).to_string()
    }

    #[test]
    fn a_well_formed_file_parses_and_the_token_stays_out_of_debug_output() {
        let p = parse_peers(one("http://127.0.0.3:7420", TOKEN, "n3").as_bytes()).unwrap().peers;
        assert_eq!(p.len(), 1);
        assert_eq!((p[0].name.as_str(), p[0].authority.as_str()), ("n3", "127.0.0.3:7420"));
        assert!(!format!("{p:?}").contains(TOKEN));
        assert_eq!(parse_peers(br#"{"peers": []}"#).unwrap(), PeersList::default());
        let named = parse_peers(br#"{"node": "n2", "peers": []}"#).unwrap();
        assert_eq!(named.node.as_deref(), Some("n2"));
    }

    #[test]
    fn hostile_files_are_refused_without_a_panic() {
        let long = format!("{{\"peers\": [], \"x\": \"{}\"}}", "a".repeat(MAX_PEERS_FILE as usize));
        let many = serde_json::json!({"peers": (0..=MAX_PEERS).map(|i| serde_json::json!(
            {"name": format!("n{i}"), "url": "http://127.0.0.3:1", "token": TOKEN})).collect::<Vec<_>>()})
        .to_string();
        let dup = serde_json::json!({"peers": [
            {"name": "n3", "url": "http://127.0.0.3:1", "token": TOKEN},
            {"name": "n3", "url": "http://127.0.0.4:1", "token": TOKEN}]})
        .to_string();
        let bad: Vec<String> = vec![
            long,
            many,
            dup,
            "".into(),
            "{".into(),
            "[]".into(),
            "\u{0}\u{ff}".into(),
            r#"{"peers": [{"name": "n3", "url": "http://127.0.0.3:1"}]}"#.into(),
            r#"{"peers": [], "extra": 1}"#.into(),
            r#"{"node": "n2/..", "peers": []}"#.into(),
            r#"{"node": 2, "peers": []}"#.into(),
            serde_json::json!({"node": "n3", "peers": [{"name": "n3", "url": "http://127.0.0.3:1", "token": TOKEN}]})
                .to_string(),
            one("https://127.0.0.3:7420", TOKEN, "n3"),
            one("http://127.0.0.3", TOKEN, "n3"),
            one("http://127.0.0.3:7420/v1", TOKEN, "n3"),
            one("http://u:p@127.0.0.3:7420", TOKEN, "n3"),
            one("http://127.0.0.3:7420?x=1", TOKEN, "n3"),
            one("not a url", TOKEN, "n3"),
            one("http://127.0.0.3:7420", "short", "n3"),
            one("http://127.0.0.3:7420", "bbx_0123456789abcdef\r\nx: y", "n3"),
            one("http://127.0.0.3:7420", TOKEN, ""),
            one("http://127.0.0.3:7420", TOKEN, "n3/../x"),
            one("http://127.0.0.3:7420", TOKEN, &"n".repeat(65)),
        ];
        for text in &bad {
            assert!(parse_peers(text.as_bytes()).is_err(), "accepted: {:.120}", text);
        }
    }

    #[test]
    fn a_file_other_users_can_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("peers.json");
        std::fs::write(&path, one("http://127.0.0.3:7420", TOKEN, "n3")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(read_peers(&path).unwrap_err().to_string().contains("other users"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_peers(&path).unwrap().peers.len(), 1);
    }
}

#[cfg(test)]
mod forwarding_tests;
