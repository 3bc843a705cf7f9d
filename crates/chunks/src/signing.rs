//! Signed manifests (docs/remote.md, "Signed manifests"). A manifest names every chunk by its
//! SHA-256, so a manifest known to be authentic makes the whole snapshot authentic. With a
//! fleet key configured, a push writes beside the manifest an HMAC-SHA256 of its exact bytes
//! (`manifests/<id>.sig`), and a pull checks it before it parses the manifest or reads any
//! chunk. Without a key nothing is signed or checked: the store is trusted.

use crate::{Error, Result};
use branchbox_model::SnapshotId;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

/// The only algorithm written and accepted.
const ALG: &str = "hmac-sha256";
/// Most bytes of a signature object read from the store (ours take about 130).
pub const MAX_SIGNATURE_BYTES: u64 = 4096;
/// Put before every signed manifest, so that a MAC of this key over a manifest can never be
/// passed off as one over anything else the fleet may sign with it later.
const DOMAIN: &[u8] = b"branchbox manifest signature v1\n";
/// The most characters of a store-supplied field quoted in an error.
const MAX_QUOTED: usize = 64;

/// The object key of a snapshot's manifest signature.
pub fn signature_key(id: &SnapshotId) -> String {
    format!("manifests/{id}.sig")
}

/// The fleet's manifest key: 32 secret bytes from a file only its owner can read.
#[derive(Clone)]
pub struct ManifestKey {
    secret: [u8; 32],
    id: String,
}

impl std::fmt::Debug for ManifestKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret stays out of logs; its id says which key it is.
        write!(f, "ManifestKey({})", self.id)
    }
}

/// What `manifests/<id>.sig` holds.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Signature {
    /// [`ALG`].
    alg: String,
    /// The signing key's id ([`ManifestKey::id`]), so that a wrong key is told from a change.
    key: String,
    /// The MAC, 64 lowercase hex digits.
    mac: String,
}

impl ManifestKey {
    /// The key of 32 secret bytes.
    pub fn new(secret: [u8; 32]) -> ManifestKey {
        let mut h = Sha256::new();
        h.update(b"branchbox manifest key id\n");
        h.update(secret);
        let id = hex::encode(&h.finalize()[..8]);
        ManifestKey { secret, id }
    }

    /// Reads the key from `path`: 32 bytes (`head -c 32 /dev/urandom`), or the same as 64 hex
    /// digits (a newline after them is fine). A file that users other than its owner may read
    /// or write is refused, as is anything that is not a regular file.
    pub fn load(path: &Path) -> Result<ManifestKey> {
        let bad = |why: String| Error::Invalid(format!("manifest key file {}: {why}", path.display()));
        let f = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
        // The opened file's own metadata: what is checked is what is read.
        let meta = f.metadata().map_err(|e| bad(e.to_string()))?;
        if !meta.is_file() {
            return Err(bad("not a regular file".into()));
        }
        let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777;
        if mode & 0o077 != 0 {
            return Err(bad(format!(
                "other users may read or write it (mode {mode:o}); run `chmod 600 {}`",
                path.display()
            )));
        }
        let mut bytes = Vec::new();
        f.take(129).read_to_end(&mut bytes).map_err(|e| bad(e.to_string()))?;
        let text = std::str::from_utf8(&bytes).map(str::trim_end).unwrap_or("");
        let secret: Option<[u8; 32]> = if bytes.len() == 32 {
            bytes.as_slice().try_into().ok()
        } else if text.len() == 64 {
            hex::decode(text).ok().and_then(|v| v.try_into().ok())
        } else {
            None
        };
        let secret = secret.ok_or_else(|| {
            bad(format!(
                "it must hold 32 random bytes (`head -c 32 /dev/urandom`) or 64 hex digits; it holds {} bytes{}",
                bytes.len(),
                if bytes.len() > 128 { " or more" } else { "" }
            ))
        })?;
        Ok(ManifestKey::new(secret))
    }

    /// The key's public name: 16 hex digits of a hash of the secret (not enough to find it).
    pub fn id(&self) -> &str {
        &self.id
    }

    fn mac(&self, id: &SnapshotId, manifest: &[u8]) -> Result<Hmac<Sha256>> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.secret)
            .map_err(|e| Error::Invalid(format!("manifest key: {e}")))?;
        mac.update(DOMAIN);
        // The id binds the signature to the object it sits beside.
        mac.update(id.as_str().as_bytes());
        mac.update(b"\n");
        mac.update(manifest);
        Ok(mac)
    }

    /// The signature object for the manifest of snapshot `id` whose exact bytes are `manifest`.
    pub fn sign(&self, id: &SnapshotId, manifest: &[u8]) -> Result<Vec<u8>> {
        let sig = Signature {
            alg: ALG.into(),
            key: self.id.clone(),
            mac: hex::encode(self.mac(id, manifest)?.finalize().into_bytes()),
        };
        serde_json::to_vec(&sig).map_err(|e| Error::Invalid(e.to_string()))
    }

    /// Checks `signature` (the object read beside the manifest, `None` when there is none)
    /// against the manifest bytes of snapshot `id`, before they are parsed. Says why it is
    /// refused: unsigned, unreadable, signed with another key, or changed since signing.
    pub fn verify(&self, id: &SnapshotId, manifest: &[u8], signature: Option<&[u8]>) -> Result<()> {
        let refuse = |why: String| Error::Unauthentic { snapshot: id.to_string(), why };
        let quote = |s: &str| format!("{:?}", s.chars().take(MAX_QUOTED).collect::<String>());
        let Some(bytes) = signature else {
            return Err(refuse(
                "it is not signed (it was pushed without the manifest key, or written by someone else who \
                 can write the store)"
                    .into(),
            ));
        };
        if bytes.len() as u64 > MAX_SIGNATURE_BYTES {
            return Err(refuse(format!("its signature is over {MAX_SIGNATURE_BYTES} bytes")));
        }
        let sig: Signature =
            serde_json::from_slice(bytes).map_err(|e| refuse(format!("its signature is unreadable: {e}")))?;
        if sig.alg != ALG {
            return Err(refuse(format!("its signature is of algorithm {}, not {ALG}", quote(&sig.alg))));
        }
        if sig.key != self.id {
            return Err(refuse(format!(
                "it was signed with another key (key id {}; this host's key is {})",
                quote(&sig.key),
                self.id
            )));
        }
        let mac = hex::decode(&sig.mac)
            .ok()
            .filter(|m| m.len() == 32)
            .ok_or_else(|| refuse("its signature's mac is not 64 hex digits".into()))?;
        // verify_slice compares in constant time.
        self.mac(id, manifest)?.verify_slice(&mac).map_err(|_| {
            refuse("its signature does not match its content: it was changed after it was signed".into())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn key(byte: u8) -> ManifestKey {
        ManifestKey::new([byte; 32])
    }

    fn refusal(r: Result<()>) -> String {
        match r {
            Err(e @ Error::Unauthentic { .. }) => e.to_string(),
            other => panic!("not refused as unauthentic: {other:?}"),
        }
    }

    #[test]
    fn a_signed_manifest_verifies() {
        let id = SnapshotId::generate();
        let sig = key(1).sign(&id, b"{\"manifest\":1}").unwrap();
        key(1).verify(&id, b"{\"manifest\":1}", Some(&sig)).unwrap();
    }

    #[test]
    fn a_tampered_manifest_is_refused() {
        let id = SnapshotId::generate();
        let sig = key(1).sign(&id, b"{\"chunk\":\"aaaa\"}").unwrap();
        let why = refusal(key(1).verify(&id, b"{\"chunk\":\"aaab\"}", Some(&sig)));
        assert!(why.contains("changed after it was signed") && why.contains(id.as_str()), "{why}");
    }

    #[test]
    fn a_manifest_signed_with_another_key_is_refused() {
        let id = SnapshotId::generate();
        let sig = key(1).sign(&id, b"m").unwrap();
        let why = refusal(key(2).verify(&id, b"m", Some(&sig)));
        assert!(
            why.contains("another key") && why.contains(key(1).id()) && why.contains(key(2).id()),
            "{why}"
        );
        // A forger who names the right key id still fails on the mac.
        let mut forged: serde_json::Value = serde_json::from_slice(&sig).unwrap();
        forged["key"] = key(2).id().into();
        let why = refusal(key(2).verify(&id, b"m", Some(&serde_json::to_vec(&forged).unwrap())));
        assert!(why.contains("does not match"), "{why}");
    }

    #[test]
    fn an_unsigned_manifest_is_refused_when_a_key_is_set() {
        let why = refusal(key(1).verify(&SnapshotId::generate(), b"m", None));
        assert!(why.contains("not signed"), "{why}");
    }

    #[test]
    fn a_signature_moved_to_another_snapshot_is_refused() {
        let (a, b) = (SnapshotId::generate(), SnapshotId::generate());
        let sig = key(1).sign(&a, b"m").unwrap();
        refusal(key(1).verify(&b, b"m", Some(&sig)));
    }

    #[test]
    fn hostile_signatures_are_refused_without_panics() {
        let id = SnapshotId::generate();
        let good: serde_json::Value = serde_json::from_slice(&key(1).sign(&id, b"m").unwrap()).unwrap();
        let mut cases: Vec<Vec<u8>> =
            vec![b"".to_vec(), b"\xff{".to_vec(), vec![b' '; MAX_SIGNATURE_BYTES as usize + 1]];
        for (field, value) in [("alg", "hmac-md5"), ("mac", "zz"), ("mac", ""), ("mac", &"ab".repeat(33))] {
            let mut v = good.clone();
            v[field] = value.into();
            cases.push(serde_json::to_vec(&v).unwrap());
        }
        let mut v = good.clone();
        v["extra"] = 1.into();
        cases.push(serde_json::to_vec(&v).unwrap());
        for c in cases {
            refusal(key(1).verify(&id, b"m", Some(&c)));
        }
    }

    #[test]
    fn key_files_are_read_raw_or_hex_and_refused_when_others_may_read_them() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, bytes: &[u8], mode: u32| {
            let p = dir.path().join(name);
            std::fs::write(&p, bytes).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            p
        };
        let raw = ManifestKey::load(&write("raw", &[7; 32], 0o600)).unwrap();
        let hexed =
            ManifestKey::load(&write("hex", format!("{}\n", hex::encode([7u8; 32])).as_bytes(), 0o400))
                .unwrap();
        assert_eq!(raw.id(), hexed.id());
        assert_eq!(raw.id(), key(7).id());
        assert!(!format!("{raw:?}").contains("7, 7"), "the secret is printed: {raw:?}");
        for mode in [0o640, 0o604, 0o620] {
            let err = ManifestKey::load(&write("open", &[7; 32], mode)).unwrap_err().to_string();
            assert!(err.contains("chmod 600") && err.contains(&format!("{mode:o}")), "{err}");
        }
        for bad in [&b"short"[..], &[7; 33][..], &[b'g'; 64][..], &[0; 4096][..]] {
            let err = ManifestKey::load(&write("bad", bad, 0o600)).unwrap_err().to_string();
            assert!(err.contains("32 random bytes"), "{err}");
        }
        assert!(ManifestKey::load(dir.path()).is_err(), "a directory was taken as a key");
        assert!(ManifestKey::load(&dir.path().join("absent")).is_err());
    }
}
