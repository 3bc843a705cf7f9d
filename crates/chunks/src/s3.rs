//! The S3 side: SigV4-signed requests (rusty-s3 signs, ureq sends) to any S3-compatible store
//! with path-style addressing. Every body read from the store is bounded by the caller.

use crate::signing::ManifestKey;
use crate::{Error, Result};
use rusty_s3::{Bucket, Credentials, S3Action, UrlStyle};
use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

/// How long a signed request stays valid.
const SIGN_TTL: Duration = Duration::from_secs(15 * 60);
/// Most bytes of one listing page accepted (1000 keys of ours take about 300 KiB).
const MAX_LIST_PAGE: u64 = 8 << 20;
/// Most bytes of an error body kept for a message.
const MAX_ERROR_BODY: u64 = 4096;

/// A store's settings as flags gave them (`branchbox remote`'s, branchboxd's); each one not
/// given is read from its environment variable by [`RemoteConfig::from_env`]. Credentials are
/// never flags: they come from the environment only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreSettings {
    /// `--remote s3://BUCKET[/PREFIX]`, else `BRANCHBOX_REMOTE`.
    pub remote: Option<String>,
    /// `--s3-endpoint http://HOST:PORT`, else `BRANCHBOX_S3_ENDPOINT`.
    pub s3_endpoint: Option<String>,
    /// `--s3-region`, else `BRANCHBOX_S3_REGION`, else `us-east-1`.
    pub s3_region: Option<String>,
    /// `--manifest-key-file`, else `BRANCHBOX_MANIFEST_KEY_FILE`: the fleet's manifest key
    /// (docs/remote.md, "Signed manifests"); none means manifests are neither signed nor checked.
    pub manifest_key_file: Option<PathBuf>,
}

/// Where the store is and how to sign for it.
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// `s3://BUCKET/PREFIX` (the prefix may be empty).
    pub url: String,
    /// The S3 endpoint, e.g. `http://127.0.0.1:8333`.
    pub endpoint: String,
    /// The signing region.
    pub region: String,
    /// Access key id.
    pub access_key: String,
    /// Secret access key.
    pub secret_key: String,
    /// The key manifests are signed and checked with, if any.
    pub manifest_key: Option<ManifestKey>,
}

impl RemoteConfig {
    /// The store `flags` name, each setting they leave out from its variable
    /// (`BRANCHBOX_REMOTE`, `BRANCHBOX_S3_ENDPOINT`, `BRANCHBOX_S3_REGION` (default
    /// `us-east-1`), `BRANCHBOX_MANIFEST_KEY_FILE`); the credentials from `AWS_ACCESS_KEY_ID`
    /// and `AWS_SECRET_ACCESS_KEY`. Reads the manifest key file when one is named. Says which
    /// setting is missing or wrong.
    pub fn from_env(flags: &StoreSettings) -> Result<RemoteConfig> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let need = |v: Option<String>, what: &str| v.ok_or_else(|| Error::Invalid(what.to_string()));
        let key_file =
            flags.manifest_key_file.clone().or_else(|| env("BRANCHBOX_MANIFEST_KEY_FILE").map(PathBuf::from));
        Ok(RemoteConfig {
            url: need(
                flags.remote.clone().or_else(|| env("BRANCHBOX_REMOTE")),
                "no store named: pass --remote s3://BUCKET/PREFIX or set BRANCHBOX_REMOTE",
            )?,
            endpoint: need(
                flags.s3_endpoint.clone().or_else(|| env("BRANCHBOX_S3_ENDPOINT")),
                "no S3 endpoint: pass --s3-endpoint http://HOST:PORT or set BRANCHBOX_S3_ENDPOINT",
            )?,
            region: flags
                .s3_region
                .clone()
                .or_else(|| env("BRANCHBOX_S3_REGION"))
                .unwrap_or_else(|| "us-east-1".into()),
            access_key: need(env("AWS_ACCESS_KEY_ID"), "AWS_ACCESS_KEY_ID is not set")?,
            secret_key: need(env("AWS_SECRET_ACCESS_KEY"), "AWS_SECRET_ACCESS_KEY is not set")?,
            manifest_key: key_file.map(|p| ManifestKey::load(&p)).transpose()?,
        })
    }
}

/// One object from a listing.
#[derive(Debug, Clone)]
pub struct Listed {
    /// Its key, relative to the remote's prefix.
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
}

/// A bucket and a key prefix in an S3-compatible store.
pub struct Remote {
    bucket: Bucket,
    creds: Credentials,
    prefix: String,
    agent: ureq::Agent,
    url: String,
    endpoint: String,
    manifest_key: Option<ManifestKey>,
}

/// Splits `s3://BUCKET/PREFIX` into the bucket and the prefix (empty, or ending in `/`).
pub fn parse_url(url: &str) -> Result<(String, String)> {
    let bad = |why: &str| Error::Invalid(format!("remote {url:?} is not s3://BUCKET[/PREFIX]: {why}"));
    let rest = url.strip_prefix("s3://").ok_or_else(|| bad("it must start with s3://"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let bucket_ok = (3..=63).contains(&bucket.len())
        && bucket.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    if !bucket_ok {
        return Err(bad("a bucket name is 3-63 lowercase letters, digits, '-' or '.'"));
    }
    let prefix = prefix.trim_matches('/');
    let prefix_ok = prefix.len() <= 256
        && prefix.split('/').all(|c| {
            prefix.is_empty()
                || (!c.is_empty()
                    && c != "."
                    && c != ".."
                    && c.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)))
        });
    if !prefix_ok {
        return Err(bad("a prefix is up to 256 characters of letters, digits, '-', '_', '.' and '/'"));
    }
    let prefix = if prefix.is_empty() { String::new() } else { format!("{prefix}/") };
    Ok((bucket.to_string(), prefix))
}

impl Remote {
    /// A remote from its configuration (no request is made).
    pub fn new(cfg: &RemoteConfig) -> Result<Remote> {
        let (name, prefix) = parse_url(&cfg.url)?;
        let endpoint = url::Url::parse(&cfg.endpoint)
            .map_err(|e| Error::Invalid(format!("S3 endpoint {:?} is not a URL: {e}", cfg.endpoint)))?;
        if endpoint.scheme() != "http" {
            return Err(Error::Invalid(format!(
                "S3 endpoint {:?}: only http:// endpoints are supported (a store on this host or a private network)",
                cfg.endpoint
            )));
        }
        let bucket = Bucket::new(endpoint, UrlStyle::Path, name, cfg.region.clone())
            .map_err(|e| Error::Invalid(format!("S3 endpoint {:?}: {e}", cfg.endpoint)))?;
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(10))
            .timeout_read(Duration::from_secs(120))
            .timeout_write(Duration::from_secs(120))
            .build();
        Ok(Remote {
            bucket,
            creds: Credentials::new(cfg.access_key.clone(), cfg.secret_key.clone()),
            prefix,
            agent,
            url: cfg.url.clone(),
            endpoint: cfg.endpoint.clone(),
            manifest_key: cfg.manifest_key.clone(),
        })
    }

    /// The `s3://` address, for messages.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The key this remote's manifests are signed and checked with, if any.
    pub fn manifest_key(&self) -> Option<&ManifestKey> {
        self.manifest_key.as_ref()
    }

    fn key(&self, rel: &str) -> String {
        format!("{}{rel}", self.prefix)
    }

    fn fail(&self, what: &str, key: &str, e: ureq::Error) -> Error {
        match e {
            ureq::Error::Status(code, resp) => {
                let mut body = String::new();
                let _ = resp.into_reader().take(MAX_ERROR_BODY).read_to_string(&mut body);
                let code_word = body
                    .split("<Code>")
                    .nth(1)
                    .and_then(|s| s.split("</Code>").next())
                    .unwrap_or("")
                    .chars()
                    .filter(|c| c.is_ascii_alphanumeric())
                    .take(64)
                    .collect::<String>();
                Error::Remote(format!("{what} {key} in {}: HTTP {code} {code_word}", self.url))
            }
            // Not the transport error's own text: it carries the presigned URL, a credential
            // for this request until it expires.
            ureq::Error::Transport(t) => Error::Remote(format!(
                "{what} {key} in {} ({}): {}{}",
                self.url,
                self.endpoint,
                t.kind(),
                t.message().map(|m| format!(": {m}")).unwrap_or_default()
            )),
        }
    }

    /// The size of an object, or `None` when there is none.
    pub fn head(&self, rel: &str) -> Result<Option<u64>> {
        let key = self.key(rel);
        let url = self.bucket.head_object(Some(&self.creds), &key).sign(SIGN_TTL);
        match self.agent.request_url("HEAD", &url).call() {
            Ok(resp) => Ok(Some(resp.header("Content-Length").and_then(|v| v.parse().ok()).unwrap_or(0))),
            Err(ureq::Error::Status(404, _)) => Ok(None),
            Err(e) => Err(self.fail("HEAD", &key, e)),
        }
    }

    /// Writes an object.
    pub fn put(&self, rel: &str, body: &[u8]) -> Result<()> {
        let key = self.key(rel);
        let url = self.bucket.put_object(Some(&self.creds), &key).sign(SIGN_TTL);
        self.agent.request_url("PUT", &url).send_bytes(body).map_err(|e| self.fail("PUT", &key, e))?;
        Ok(())
    }

    /// Reads an object of at most `limit` bytes; `None` when there is none. A larger object
    /// is refused without reading past the limit.
    pub fn get(&self, rel: &str, limit: u64) -> Result<Option<Vec<u8>>> {
        let key = self.key(rel);
        let url = self.bucket.get_object(Some(&self.creds), &key).sign(SIGN_TTL);
        let resp = match self.agent.request_url("GET", &url).call() {
            Ok(r) => r,
            Err(ureq::Error::Status(404, _)) => return Ok(None),
            Err(e) => return Err(self.fail("GET", &key, e)),
        };
        let mut body = Vec::new();
        resp.into_reader()
            .take(limit + 1)
            .read_to_end(&mut body)
            .map_err(|e| Error::Remote(format!("GET {key} in {}: {e}", self.url)))?;
        if body.len() as u64 > limit {
            return Err(Error::Invalid(format!(
                "object {key} in {} is larger than the {limit} bytes allowed; refused",
                self.url
            )));
        }
        Ok(Some(body))
    }

    /// Deletes an object (absent is fine).
    pub fn delete(&self, rel: &str) -> Result<()> {
        let key = self.key(rel);
        let url = self.bucket.delete_object(Some(&self.creds), &key).sign(SIGN_TTL);
        match self.agent.request_url("DELETE", &url).call() {
            Ok(_) | Err(ureq::Error::Status(404, _)) => Ok(()),
            Err(e) => Err(self.fail("DELETE", &key, e)),
        }
    }

    /// Creates the bucket when it does not exist.
    pub fn ensure_bucket(&self) -> Result<()> {
        let url = self.bucket.head_bucket(Some(&self.creds)).sign(SIGN_TTL);
        match self.agent.request_url("HEAD", &url).call() {
            Ok(_) => Ok(()),
            Err(ureq::Error::Status(404, _)) => {
                let url = self.bucket.create_bucket(&self.creds).sign(SIGN_TTL);
                match self.agent.request_url("PUT", &url).call() {
                    // Created meanwhile by another push: fine.
                    Ok(_) | Err(ureq::Error::Status(409, _)) => Ok(()),
                    Err(e) => Err(self.fail("create bucket", self.bucket.name(), e)),
                }
            }
            Err(e) => Err(self.fail("HEAD bucket", self.bucket.name(), e)),
        }
    }

    /// Every object under `rel_prefix` (relative to the remote's prefix), page by page.
    pub fn list(&self, rel_prefix: &str) -> Result<Vec<Listed>> {
        let full = self.key(rel_prefix);
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut action = self.bucket.list_objects_v2(Some(&self.creds));
            action.with_prefix(full.as_str());
            if let Some(t) = &token {
                action.with_continuation_token(t.as_str());
            }
            let url = action.sign(SIGN_TTL);
            let resp = match self.agent.request_url("GET", &url).call() {
                Ok(r) => r,
                // No bucket yet: nothing in it.
                Err(ureq::Error::Status(404, _)) => return Ok(out),
                Err(e) => return Err(self.fail("LIST", &full, e)),
            };
            let mut body = String::new();
            resp.into_reader()
                .take(MAX_LIST_PAGE)
                .read_to_string(&mut body)
                .map_err(|e| Error::Remote(format!("LIST {full} in {}: {e}", self.url)))?;
            let page = rusty_s3::actions::ListObjectsV2::parse_response(&body)
                .map_err(|e| Error::Remote(format!("LIST {full} in {}: unreadable answer: {e}", self.url)))?;
            for c in page.contents {
                if let Some(rel) = c.key.strip_prefix(&self.prefix) {
                    out.push(Listed { key: rel.to_string(), size: c.size });
                }
            }
            match page.next_continuation_token {
                Some(t) if !t.is_empty() => token = Some(t),
                _ => return Ok(out),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_url, Remote, RemoteConfig};

    #[test]
    fn errors_do_not_print_the_signed_url() {
        let cfg = RemoteConfig {
            url: "s3://snaps".into(),
            // Nothing listens on port 1: the connection is refused.
            endpoint: "http://127.0.0.1:1".into(),
            region: "us-east-1".into(),
            access_key: "key-id".into(),
            secret_key: "secret".into(),
            manifest_key: None,
        };
        let err = Remote::new(&cfg).unwrap().head("chunks/x").unwrap_err().to_string();
        assert!(err.contains("chunks/x") && err.contains("127.0.0.1:1"), "{err}");
        assert!(!err.contains("X-Amz") && !err.contains("key-id"), "{err}");
    }

    #[test]
    fn flags_win_over_the_environment_which_fills_what_they_leave_out() {
        use super::StoreSettings;
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (flag_key, env_key) = (dir.path().join("flag.key"), dir.path().join("env.key"));
        for (p, byte) in [(&flag_key, 1u8), (&env_key, 2u8)] {
            std::fs::write(p, [byte; 32]).unwrap();
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        // Only this test sets these variables in this test binary.
        std::env::set_var("BRANCHBOX_REMOTE", "s3://from-env");
        std::env::set_var("BRANCHBOX_S3_ENDPOINT", "http://127.0.0.1:9");
        std::env::set_var("BRANCHBOX_S3_REGION", "env-region");
        std::env::set_var("BRANCHBOX_MANIFEST_KEY_FILE", &env_key);
        std::env::set_var("AWS_ACCESS_KEY_ID", "id");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "secret");
        let flags = StoreSettings {
            remote: Some("s3://from-flag".into()),
            s3_endpoint: Some("http://127.0.0.1:8".into()),
            s3_region: Some("flag-region".into()),
            manifest_key_file: Some(flag_key),
        };
        let c = RemoteConfig::from_env(&flags).unwrap();
        assert_eq!(
            (c.url.as_str(), c.endpoint.as_str(), c.region.as_str()),
            ("s3://from-flag", "http://127.0.0.1:8", "flag-region")
        );
        assert_eq!(c.manifest_key.unwrap().id(), crate::signing::ManifestKey::new([1; 32]).id());
        let c = RemoteConfig::from_env(&StoreSettings::default()).unwrap();
        assert_eq!(
            (c.url.as_str(), c.endpoint.as_str(), c.region.as_str()),
            ("s3://from-env", "http://127.0.0.1:9", "env-region")
        );
        assert_eq!(c.manifest_key.unwrap().id(), crate::signing::ManifestKey::new([2; 32]).id());
        // A key file others may read stops the configuration, whichever way it was named.
        std::fs::set_permissions(&env_key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = RemoteConfig::from_env(&StoreSettings::default()).unwrap_err().to_string();
        assert!(err.contains("chmod 600"), "{err}");
        for k in [
            "BRANCHBOX_REMOTE",
            "BRANCHBOX_S3_ENDPOINT",
            "BRANCHBOX_S3_REGION",
            "BRANCHBOX_MANIFEST_KEY_FILE",
        ] {
            std::env::remove_var(k);
        }
        let c = RemoteConfig::from_env(&StoreSettings {
            remote: Some("s3://x-y".into()),
            s3_endpoint: Some("http://h:1".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.region, "us-east-1");
        assert!(c.manifest_key.is_none());
    }

    #[test]
    fn remote_urls_are_checked() {
        assert_eq!(parse_url("s3://snaps").unwrap(), ("snaps".into(), String::new()));
        assert_eq!(parse_url("s3://snaps/a/b/").unwrap(), ("snaps".into(), "a/b/".into()));
        for bad in ["snaps", "s3://", "s3://UP", "s3://ok/../x", "s3://ok/a//b", "s3://ok/a?b", "http://x/y"]
        {
            assert!(parse_url(bad).is_err(), "{bad} accepted");
        }
    }
}
