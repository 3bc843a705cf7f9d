//! Bearer tokens: generated at first start into `<data>/service/token` (mode 0600), compared in
//! constant time, identified in the audit log by a short id derived from the token's hash (never
//! the token itself). The service proves it holds a token before a client sends it: see
//! [`proof`]. The console (`/ui`) signs in with a token once and then sends a session cookie
//! instead, with the session's CSRF token on every request: see [`Tokens::authenticate_request`].

pub use crate::caller::Caller;
use crate::error::ApiError;
use crate::ui::session::{self, Sessions};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// The accepted tokens, and the console's sessions signed in with them.
#[derive(Clone)]
pub struct Tokens {
    digests: Vec<[u8; 32]>,
    /// Console sessions (shared by clones).
    pub sessions: Sessions,
}

/// Longest token line accepted from the token file or a header.
const MAX_TOKEN: usize = 512;

fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

/// The answer to a client's challenge: hex HMAC-SHA256, keyed with the SHA-256 of the token,
/// over `branchbox-service-proof\n<listen address>\n<nonce>`. Only a holder of the token (or
/// of its hash, which the service keeps) can compute it; the address binds it to the service's
/// own socket, so a process on a stale port cannot relay another service's answer.
pub fn proof(token_digest: &[u8; 32], listen: &str, nonce: &str) -> String {
    use hmac::{Hmac, Mac};
    // HMAC takes keys of any length; an empty proof (never a match) keeps this total anyway.
    let Ok(mut mac) = <Hmac<Sha256> as Mac>::new_from_slice(token_digest) else { return String::new() };
    mac.update(format!("branchbox-service-proof\n{listen}\n{nonce}").as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

fn sandbox_mac(token_digest: &[u8; 32], sandbox: &str) -> String {
    use hmac::{Hmac, Mac};
    let Ok(mut mac) = <Hmac<Sha256> as Mac>::new_from_slice(token_digest) else { return String::new() };
    mac.update(format!("branchbox-e2b-envd\n{sandbox}").as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// The audit id of a token: `tok-` and the first 12 hex digits of its SHA-256.
pub fn token_id(token: &str) -> String {
    format!("tok-{}", &hex::encode(digest(token.as_bytes()))[..12])
}

/// Compares two digests in time independent of where they differ.
fn equal_ct(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Tokens {
    /// Accepts exactly these tokens.
    pub fn new<'a>(tokens: impl IntoIterator<Item = &'a str>) -> Tokens {
        Tokens {
            digests: tokens.into_iter().map(|t| digest(t.as_bytes())).collect(),
            sessions: Sessions::default(),
        }
    }

    /// Loads the token file (one token per line), creating it with a fresh random token when it
    /// does not exist.
    pub fn load_or_create(path: &Path) -> anyhow::Result<Tokens> {
        if !path.exists() {
            if let Some(dir) = path.parent() {
                std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
                    .create(dir)?;
            }
            let token = format!("bbx_{}", hex::encode(rand::random::<[u8; 24]>()));
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
            f.write_all(format!("{token}\n").as_bytes())?;
            f.sync_all()?;
        }
        let mode = std::fs::metadata(path)?.permissions().mode();
        if mode & 0o077 != 0 {
            anyhow::bail!(
                "{} is readable by other users (mode {:o}); run `chmod 600 {}`",
                path.display(),
                mode & 0o777,
                path.display()
            );
        }
        let text = std::fs::read_to_string(path)?;
        let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        if lines.is_empty() || lines.iter().any(|l| l.len() > MAX_TOKEN || l.len() < 16) {
            anyhow::bail!("{} must hold one token of 16 to {MAX_TOKEN} characters per line", path.display());
        }
        Ok(Tokens::new(lines))
    }

    /// One [`proof`] per accepted token (the service does not know which one the client holds).
    pub fn proofs(&self, listen: &str, nonce: &str) -> Vec<String> {
        self.digests.iter().map(|d| proof(d, listen, nonce)).collect()
    }

    /// The access token for one sandbox's data plane that a holder of `presented` gets (E2B's
    /// `envdAccessToken`): hex HMAC-SHA256 keyed with the SHA-256 of the token, over
    /// `branchbox-e2b-envd\n<sandbox id>`. It opens that sandbox's files and commands only,
    /// and the service can check it without storing it ([`Tokens::check_sandbox_token`]).
    pub fn sandbox_token(presented: &str, sandbox: &str) -> String {
        sandbox_mac(&digest(presented.as_bytes()), sandbox)
    }

    /// Checks a sandbox access token against every accepted token, in constant time per token;
    /// the caller is named by the token it derives from.
    pub fn check_sandbox_token(&self, sandbox: &str, presented: &str) -> Option<Caller> {
        let p = digest(presented.as_bytes());
        let mut found = None;
        for known in &self.digests {
            if equal_ct(&digest(sandbox_mac(known, sandbox).as_bytes()), &p) {
                found = Some(Caller(format!("tok-{}", &hex::encode(known)[..12])));
            }
        }
        found
    }

    /// Checks a presented token against every accepted one; every comparison runs in full so the
    /// time taken says nothing about which bytes matched.
    pub fn check(&self, presented: &str) -> Option<Caller> {
        let d = digest(presented.as_bytes());
        let mut ok = false;
        for known in &self.digests {
            ok |= equal_ct(known, &d);
        }
        ok.then(|| Caller(token_id(presented)))
    }

    /// Authenticates a request from its `Authorization: Bearer` header.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        let unauthorized = |why: &str| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                format!(
                    "{why}; send `Authorization: Bearer <token>` with the token from <data>/service/token"
                ),
            )
        };
        let value = headers.get(header::AUTHORIZATION).ok_or_else(|| unauthorized("no token"))?;
        let value = value.to_str().map_err(|_| unauthorized("the Authorization header is not text"))?;
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty() && t.len() <= MAX_TOKEN)
            .ok_or_else(|| unauthorized("the Authorization header is not `Bearer <token>`"))?;
        self.check(token).ok_or_else(|| unauthorized("the token is not valid"))
    }

    /// Authenticates an API request by its bearer token or, when it has no `Authorization`
    /// header, by a console session ([`Tokens::session_request`]). Every request signed in by
    /// cookie, a read as much as a change, must carry the session's CSRF token: in
    /// `X-CSRF-Token`, or for a GET (a WebSocket handshake, which a browser cannot give
    /// headers) as `?csrf=` in `uri`. The browser attaches the cookie to requests of any page
    /// and to every port of the host; only the console's own page holds the CSRF token.
    pub fn authenticate_request(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
    ) -> Result<Caller, ApiError> {
        if headers.contains_key(header::AUTHORIZATION) || session::cookie(headers).is_none() {
            return self.authenticate(headers);
        }
        let from_query =
            if matches!(*method, Method::GET | Method::HEAD) { session::csrf_param(uri) } else { None };
        let presented = headers.get(session::CSRF_HEADER).and_then(|v| v.to_str().ok()).or(from_query);
        self.session_request(headers, presented).map(|(_, live)| live.caller)
    }

    /// The console session of a request's cookie, when it is live, the request comes from the
    /// console's own origin (`ui::origin`) and `presented` is the session's CSRF token; returns
    /// the session id too. 401 without a live session, 403 `cross_origin` or `csrf` otherwise.
    pub fn session_request(
        &self,
        headers: &HeaderMap,
        presented: Option<&str>,
    ) -> Result<(String, session::Live), ApiError> {
        let id = session::cookie(headers).ok_or_else(|| {
            ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "not signed in; sign in at /ui")
        })?;
        crate::ui::origin::require_same(headers)?;
        let live = self.sessions.get(&id).ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "the console session has expired or was signed out; sign in again at /ui",
            )
        })?;
        if !self.sessions.csrf_ok(&id, presented.unwrap_or("")) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "csrf",
                format!(
                    "a request with a session cookie must carry the session's CSRF token in {} (or ?csrf= \
                     for a WebSocket or event stream); sign in again at /ui",
                    session::CSRF_HEADER
                ),
            ));
        }
        Ok((id, live))
    }

    /// For a GET that acts (the WebSocket handshake of a terminal or a UDP relay, which a
    /// browser cannot give headers): a request signed in by a session cookie must come from the
    /// console's own origin and name the session's CSRF token in `presented`. Bearer requests
    /// pass.
    pub fn check_csrf_param(&self, headers: &HeaderMap, presented: Option<&str>) -> Result<(), ApiError> {
        if headers.contains_key(header::AUTHORIZATION) || session::cookie(headers).is_none() {
            return Ok(());
        }
        self.session_request(headers, presented).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn sandbox_tokens_open_one_sandbox_for_holders_of_a_token() {
        let t = Tokens::new(["secret-token-0123456789", "other-token-0123456789"]);
        let st = Tokens::sandbox_token("secret-token-0123456789", "sbx-0000000000000001");
        let who = t.check_sandbox_token("sbx-0000000000000001", &st).unwrap();
        assert_eq!(who, Caller(token_id("secret-token-0123456789")));
        assert!(t.check_sandbox_token("sbx-0000000000000002", &st).is_none());
        assert!(t.check_sandbox_token("sbx-0000000000000001", "secret-token-0123456789").is_none());
        let stranger = Tokens::sandbox_token("not-a-token-0123456789", "sbx-0000000000000001");
        assert!(t.check_sandbox_token("sbx-0000000000000001", &stranger).is_none());
    }

    #[test]
    fn only_the_exact_token_is_accepted() {
        let t = Tokens::new(["secret-token-0123456789"]);
        assert!(t.check("secret-token-0123456789").is_some());
        for bad in ["", "secret-token-012345678", "secret-token-01234567890", "SECRET-TOKEN-0123456789"] {
            assert!(t.check(bad).is_none(), "{bad:?} accepted");
        }
    }

    #[test]
    fn constant_time_compare_detects_any_differing_byte() {
        let a = digest(b"x");
        for i in 0..32 {
            let mut b = a;
            b[i] ^= 1;
            assert!(!equal_ct(&a, &b));
        }
        assert!(equal_ct(&a, &a));
    }

    #[test]
    fn authorization_header_must_be_bearer_with_a_known_token() {
        let t = Tokens::new(["secret-token-0123456789"]);
        let ok = t.authenticate(&headers("Bearer secret-token-0123456789")).unwrap();
        assert_eq!(ok, Caller(token_id("secret-token-0123456789")));
        for bad in ["secret-token-0123456789", "Basic secret-token-0123456789", "Bearer ", "Bearer wrong"] {
            let e = t.authenticate(&headers(bad)).unwrap_err();
            assert_eq!((e.status.as_u16(), e.code), (401, "unauthorized"), "{bad:?}");
        }
        assert_eq!(t.authenticate(&HeaderMap::new()).unwrap_err().status.as_u16(), 401);
    }

    fn with_cookie(id: &str, csrf: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:7420"));
        h.insert(header::COOKIE, HeaderValue::from_str(&format!("bbx_session_7420={id}")).unwrap());
        if let Some(c) = csrf {
            h.insert(session::CSRF_HEADER, HeaderValue::from_str(c).unwrap());
        }
        h
    }

    #[test]
    fn a_session_cookie_needs_its_csrf_token_for_reads_as_for_changes() {
        let t = Tokens::new(["secret-token-0123456789"]);
        let me = Caller(token_id("secret-token-0123456789"));
        let s = t.sessions.start(me.clone());
        let other = t.sessions.start(me.clone());
        let (get, post, delete) = (Method::GET, Method::POST, Method::DELETE);
        let plain: Uri = "/v1/sandboxes".parse().unwrap();
        for m in [&get, &post, &delete] {
            assert_eq!(t.authenticate_request(m, &plain, &with_cookie(&s.id, Some(&s.csrf))).unwrap(), me);
        }
        for (m, csrf) in
            [(&get, None), (&post, None), (&post, Some(other.csrf.as_str())), (&delete, Some("00"))]
        {
            let e = t.authenticate_request(m, &plain, &with_cookie(&s.id, csrf)).unwrap_err();
            assert_eq!((e.status.as_u16(), e.code), (403, "csrf"), "{m} {csrf:?}");
        }
        // A WebSocket handshake names the token in its query; only a GET may.
        let query: Uri = format!("/v1/sandboxes/x/pty?cols=80&csrf={}", s.csrf).parse().unwrap();
        assert_eq!(t.authenticate_request(&get, &query, &with_cookie(&s.id, None)).unwrap(), me);
        assert_eq!(
            t.authenticate_request(&post, &query, &with_cookie(&s.id, None)).unwrap_err().code,
            "csrf"
        );
        let unknown = "ab".repeat(32);
        let e = t.authenticate_request(&get, &plain, &with_cookie(&unknown, Some(&s.csrf))).unwrap_err();
        assert_eq!(e.status.as_u16(), 401);
        t.sessions.end(&s.id);
        let e = t.authenticate_request(&post, &plain, &with_cookie(&s.id, Some(&s.csrf))).unwrap_err();
        assert_eq!(e.status.as_u16(), 401);
        // A bearer token is checked on its own, whatever cookie comes with it.
        let mut h = with_cookie(&other.id, None);
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer wrong"));
        assert_eq!(t.authenticate_request(&post, &plain, &h).unwrap_err().status.as_u16(), 401);
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer secret-token-0123456789"));
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert_eq!(t.authenticate_request(&post, &plain, &h).unwrap(), me);
        assert_eq!(t.authenticate_request(&get, &plain, &HeaderMap::new()).unwrap_err().status.as_u16(), 401);
    }

    #[test]
    fn a_session_cookie_from_another_origin_is_refused_even_with_its_csrf_token() {
        let t = Tokens::new(["secret-token-0123456789"]);
        let s = t.sessions.start(Caller(token_id("secret-token-0123456789")));
        let plain: Uri = "/v1/sandboxes".parse().unwrap();
        for (name, value) in [
            ("sec-fetch-site", "same-site"),
            ("sec-fetch-site", "cross-site"),
            ("origin", "http://127.0.0.1:8000"),
        ] {
            let mut h = with_cookie(&s.id, Some(&s.csrf));
            h.insert(name, HeaderValue::from_static(value));
            let e = t.authenticate_request(&Method::POST, &plain, &h).unwrap_err();
            assert_eq!((e.status.as_u16(), e.code), (403, "cross_origin"), "{name}: {value}");
            let e = t.check_csrf_param(&h, Some(&s.csrf)).unwrap_err();
            assert_eq!(e.code, "cross_origin", "{name}: {value}");
        }
        assert!(t.check_csrf_param(&with_cookie(&s.id, None), Some(&s.csrf)).is_ok());
        assert_eq!(t.check_csrf_param(&with_cookie(&s.id, None), None).unwrap_err().code, "csrf");
        // The cookie of a service on another port is not this service's session at all.
        let mut h = with_cookie(&s.id, Some(&s.csrf));
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:7421"));
        assert_eq!(t.authenticate_request(&Method::GET, &plain, &h).unwrap_err().status.as_u16(), 401);
    }

    #[test]
    fn token_file_is_created_private_and_reloads_the_same_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("service/token");
        Tokens::load_or_create(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let token = std::fs::read_to_string(&path).unwrap().trim().to_string();
        assert!(Tokens::load_or_create(&path).unwrap().check(&token).is_some());
    }

    #[test]
    fn token_file_readable_by_others_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(Tokens::load_or_create(&path).is_err());
    }

    #[test]
    fn proofs_depend_on_the_token_the_address_and_the_nonce() {
        let t = Tokens::new(["secret-token-0123456789", "second-token-0123456789"]);
        let p = t.proofs("127.0.0.1:7420", "00ff");
        assert_eq!(p.len(), 2);
        // Also pinned by the command line's tests (computed independently with Python's hmac).
        assert_eq!(p[0], "7af8c442632867802dc53a3e0a0fd3b677ffcd76eceee573d08d1a3044cd570a");
        assert_ne!(p[0], p[1]);
        assert_ne!(p[0], t.proofs("127.0.0.1:7421", "00ff")[0]);
        assert_ne!(p[0], t.proofs("127.0.0.1:7420", "00fe")[0]);
    }
}
