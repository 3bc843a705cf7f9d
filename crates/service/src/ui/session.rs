//! Console sessions: a random id in an `HttpOnly; SameSite=Strict` cookie, looked up in a map
//! held in memory (so a restart signs everyone out), each with its own CSRF token and an
//! absolute expiry. The service token never leaves the sign-in request: the cookie holds only
//! the session id, and the map keeps the SHA-256 of each id rather than the id itself.
//!
//! A browser sends the cookies of `127.0.0.1` to every port of it, so another local user's
//! server on another port receives the cookie: the cookie alone authorises nothing. The CSRF
//! token is handed out once, in the sign-in answer; the page keeps it in its origin's
//! `sessionStorage` (which is per port) and sends it with every request. The cookie's name
//! carries the port the console is reached on (`bbx_session_7420`), so services on two ports
//! keep their sessions apart and a cookie named for another port is never read.

use crate::caller::Caller;
use axum::http::uri::Authority;
use axum::http::{header, HeaderMap};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The start of the cookie's name; the port follows (see [`cookie_name`]).
pub const COOKIE_PREFIX: &str = "bbx_session_";
/// The header a state-changing request of the console carries its CSRF token in.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// How long a session lasts from sign-in.
pub const LIFETIME: Duration = Duration::from_secs(8 * 3600);
/// Most sessions held at once; signing in past it drops the one that expires first.
const MAX_SESSIONS: usize = 256;

struct Session {
    caller: Caller,
    csrf: [u8; 32],
    expires: Instant,
}

/// What a valid session gives a request.
#[derive(Debug, Clone)]
pub struct Live {
    /// Who signed in (the audit id of the token used).
    pub caller: Caller,
    /// The session's CSRF token, hex.
    pub csrf: String,
}

/// A new session's cookie value and CSRF token, both hex.
pub struct Issued {
    /// The session id (the cookie's value).
    pub id: String,
    /// The CSRF token.
    pub csrf: String,
}

/// The live sessions; clones share one map.
#[derive(Clone, Default)]
pub struct Sessions(Arc<Mutex<HashMap<[u8; 32], Session>>>);

fn key(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

/// Equal in time independent of where two byte strings differ (lengths are not secret).
pub fn equal_ct(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Sessions {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Session>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a session for `caller`.
    pub fn start(&self, caller: Caller) -> Issued {
        let id: [u8; 32] = rand::random();
        let csrf: [u8; 32] = rand::random();
        let id = hex::encode(id);
        let now = Instant::now();
        let mut map = self.map();
        map.retain(|_, s| s.expires > now);
        if map.len() >= MAX_SESSIONS {
            if let Some(k) = map.iter().min_by_key(|(_, s)| s.expires).map(|(k, _)| *k) {
                map.remove(&k);
            }
        }
        map.insert(key(&id), Session { caller, csrf, expires: now + LIFETIME });
        Issued { id, csrf: hex::encode(csrf) }
    }

    /// The session of a cookie value, when it is live.
    pub fn get(&self, id: &str) -> Option<Live> {
        let mut map = self.map();
        let k = key(id);
        match map.get(&k) {
            Some(s) if s.expires > Instant::now() => {
                Some(Live { caller: s.caller.clone(), csrf: hex::encode(s.csrf) })
            }
            Some(_) => {
                map.remove(&k);
                None
            }
            None => None,
        }
    }

    /// True when `presented` is the session's CSRF token.
    pub fn csrf_ok(&self, id: &str, presented: &str) -> bool {
        let Ok(presented) = hex::decode(presented) else { return false };
        let map = self.map();
        map.get(&key(id)).is_some_and(|s| s.expires > Instant::now() && equal_ct(&s.csrf, &presented))
    }

    /// Ends a session.
    pub fn end(&self, id: &str) {
        self.map().remove(&key(id));
    }
}

/// The session cookie's name for a request: [`COOKIE_PREFIX`] and the port of its `Host`
/// (80 when it names none); `None` without a `Host` that parses.
pub fn cookie_name(headers: &HeaderMap) -> Option<String> {
    let host = headers.get(header::HOST)?.to_str().ok()?;
    let authority = host.parse::<Authority>().ok()?;
    Some(format!("{COOKIE_PREFIX}{}", authority.port_u16().unwrap_or(80)))
}

/// The session cookie's value in a request's `Cookie` headers, when there is one named for the
/// request's port.
pub fn cookie(headers: &HeaderMap) -> Option<String> {
    let name = cookie_name(headers)?;
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, value)| value.trim().to_string())
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The `csrf` parameter of a URI's query, for the requests a browser cannot give headers (an
/// event stream, a WebSocket handshake); a hex token needs no percent-decoding.
pub fn csrf_param(uri: &axum::http::Uri) -> Option<&str> {
    uri.query()?.split('&').find_map(|pair| pair.strip_prefix("csrf="))
}

/// The `Set-Cookie` value that stores a session id under `name` (from [`cookie_name`]).
pub fn set_cookie(name: &str, id: &str) -> String {
    format!("{name}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}", LIFETIME.as_secs())
}

/// The `Set-Cookie` value that clears the cookie `name`.
pub fn clear_cookie(name: &str) -> String {
    format!("{name}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn a_session_carries_its_caller_and_only_its_own_csrf_token() {
        let s = Sessions::default();
        let a = s.start(Caller("tok-a".into()));
        let b = s.start(Caller("tok-b".into()));
        assert_eq!(s.get(&a.id).unwrap().caller, Caller("tok-a".into()));
        assert_eq!(s.get(&a.id).unwrap().csrf, a.csrf);
        assert!(s.csrf_ok(&a.id, &a.csrf));
        assert!(!s.csrf_ok(&a.id, &b.csrf));
        assert!(!s.csrf_ok(&a.id, ""));
        assert!(!s.csrf_ok(&a.id, "zz"));
        assert!(!s.csrf_ok(&a.id, &a.csrf[..62]));
        assert!(s.get(&"0".repeat(64)).is_none());
        s.end(&a.id);
        assert!(s.get(&a.id).is_none());
        assert!(!s.csrf_ok(&a.id, &a.csrf));
        assert!(s.get(&b.id).is_some());
    }

    #[test]
    fn the_map_is_bounded() {
        let s = Sessions::default();
        let first = s.start(Caller("x".into()));
        for _ in 0..MAX_SESSIONS {
            s.start(Caller("x".into()));
        }
        assert_eq!(s.map().len(), MAX_SESSIONS);
        assert!(s.get(&first.id).is_none(), "the oldest session was not the one dropped");
    }

    #[test]
    fn the_cookie_is_found_among_others_and_must_look_like_an_id() {
        let id = "ab".repeat(32);
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:7420"));
        h.append(header::COOKIE, HeaderValue::from_str("other=1; bbx_session_7420x=2").unwrap());
        h.append(header::COOKIE, HeaderValue::from_str(&format!("a=b; bbx_session_7420={id}")).unwrap());
        assert_eq!(cookie(&h).as_deref(), Some(id.as_str()));
        for bad in ["bbx_session_7420=short".to_string(), format!("bbx_session_7420={}", "g".repeat(64))] {
            let mut h = HeaderMap::new();
            h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:7420"));
            h.insert(header::COOKIE, HeaderValue::from_str(&bad).unwrap());
            assert_eq!(cookie(&h), None, "{bad}");
        }
        assert!(set_cookie("bbx_session_7420", &id).contains("HttpOnly; SameSite=Strict"));
    }

    #[test]
    fn the_cookie_is_named_for_the_port_and_another_ports_cookie_is_not_read() {
        let id = "cd".repeat(32);
        let with = |host: &'static str, cookie: String| {
            let mut h = HeaderMap::new();
            h.insert(header::HOST, HeaderValue::from_static(host));
            h.insert(header::COOKIE, HeaderValue::from_str(&cookie).unwrap());
            h
        };
        let h = with("127.0.0.1:7420", String::new());
        assert_eq!(cookie_name(&h).as_deref(), Some("bbx_session_7420"));
        assert_eq!(cookie_name(&with("localhost", String::new())).as_deref(), Some("bbx_session_80"));
        assert_eq!(cookie(&with("127.0.0.1:7420", format!("bbx_session_7421={id}"))), None);
        assert_eq!(cookie(&with("127.0.0.1:7420", format!("bbx_session={id}"))), None);
        assert_eq!(
            cookie(&with("127.0.0.1:7421", format!("bbx_session_7421={id}"))).as_deref(),
            Some(id.as_str())
        );
        let mut no_host = HeaderMap::new();
        no_host.insert(header::COOKIE, HeaderValue::from_str(&format!("bbx_session_80={id}")).unwrap());
        assert_eq!(cookie(&no_host), None);
    }
}
