//! Checks every request passes before it is routed: a `Host` the service answers to, no
//! foreign `Origin`, and JSON (or no) bodies on `POST`. A web page open in a browser on this
//! host can send requests to loopback; these checks keep it from driving the service, by a
//! cross-site form (CSRF: a `text/plain` POST needs no preflight) or by DNS rebinding (a name
//! of the attacker's that resolves to 127.0.0.1). They hold with and without authentication.

use crate::config::ServiceConfig;
use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::{Request, State};
use axum::http::uri::Authority;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::IpAddr;

/// The guard's state: the service's settings, and the path prefix whose requests are exempt
/// from the rule on POST bodies (a surface that takes other bodies and authenticates only by
/// headers a cross-site form cannot send, never by cookie; the router assembly names it).
#[derive(Clone)]
pub struct Guard {
    /// The shared state (its settings: allowed hosts).
    pub st: AppState,
    /// Requests under this prefix may POST bodies other than JSON.
    pub other_bodies_under: &'static str,
}

/// The middleware: refuses a request that fails [`check`].
pub async fn guard(State(g): State<Guard>, req: Request, next: Next) -> Response {
    let json_posts = !req.uri().path().starts_with(g.other_bodies_under);
    match check_posts(&g.st.cfg, req.method(), req.headers(), json_posts) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

/// True when `host` (a `Host` header) names an IP address, `localhost`, or a configured name.
/// A rebinding page reaches the service under a DNS name of its own, never an address.
fn allowed_host(cfg: &ServiceConfig, host: &str) -> bool {
    let Ok(authority) = host.parse::<Authority>() else { return false };
    let name = authority.host();
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<IpAddr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || cfg.allowed_hosts.iter().any(|h| h.eq_ignore_ascii_case(name))
}

fn is_json(value: &header::HeaderValue) -> bool {
    value
        .to_str()
        .ok()
        .and_then(|v| v.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
}

fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers.get(header::CONTENT_LENGTH).is_some_and(|v| v.as_bytes() != b"0")
}

/// The checks, on a request's method and headers.
pub fn check(cfg: &ServiceConfig, method: &Method, headers: &HeaderMap) -> Result<(), ApiError> {
    check_posts(cfg, method, headers, true)
}

/// The checks; `json_posts` false leaves out the one on POST bodies.
pub fn check_posts(
    cfg: &ServiceConfig,
    method: &Method,
    headers: &HeaderMap,
    json_posts: bool,
) -> Result<(), ApiError> {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).ok_or_else(|| {
        ApiError::bad_request("bad_host", "the request has no Host header (HTTP/1.1 requires one)")
    })?;
    if !allowed_host(cfg, host) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "host_not_allowed",
            format!(
                "Host {:?} is not a name this service answers to: use an IP address or localhost, or start \
                 branchboxd with --allowed-host NAME",
                host.chars().take(256).collect::<String>()
            ),
        ));
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let same = origin.to_str().is_ok_and(|o| o.eq_ignore_ascii_case(&format!("http://{host}")));
        if !same {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "origin_not_allowed",
                "requests from web pages of other origins are refused; call the API from a program (without an Origin header)",
            ));
        }
    }
    if json_posts && method == Method::POST {
        let json = match headers.get(header::CONTENT_TYPE) {
            Some(v) => is_json(v),
            None => !has_body(headers),
        };
        if !json {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "POST bodies must be JSON sent with `Content-Type: application/json` (or empty)",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn cfg() -> ServiceConfig {
        let mut c =
            ServiceConfig::new(branchbox_core::Config::from_env(Some(std::path::Path::new("/nonexistent"))));
        c.allowed_hosts = vec!["bb.internal".into()];
        c
    }

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(k.clone(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn code(method: Method, pairs: &[(header::HeaderName, &str)]) -> Option<&'static str> {
        check(&cfg(), &method, &headers(pairs)).err().map(|e| e.code)
    }

    #[test]
    fn hosts_are_addresses_localhost_or_configured_names() {
        for ok in
            ["127.0.0.1:7420", "localhost:7420", "LOCALHOST", "[::1]:7420", "10.1.2.3", "bb.internal:80"]
        {
            assert_eq!(code(Method::GET, &[(header::HOST, ok)]), None, "{ok}");
        }
        for bad in ["evil.example:7420", "127.0.0.1.evil.example", "localhost.evil.example:7420", "a b"] {
            assert_eq!(code(Method::GET, &[(header::HOST, bad)]), Some("host_not_allowed"), "{bad}");
        }
        assert_eq!(code(Method::GET, &[]), Some("bad_host"));
    }

    #[test]
    fn foreign_origins_are_refused() {
        let host = (header::HOST, "127.0.0.1:7420");
        assert_eq!(code(Method::GET, &[host.clone(), (header::ORIGIN, "http://127.0.0.1:7420")]), None);
        for bad in ["http://evil.example", "null", "http://127.0.0.1:7421"] {
            assert_eq!(
                code(Method::GET, &[host.clone(), (header::ORIGIN, bad)]),
                Some("origin_not_allowed"),
                "{bad}"
            );
        }
    }

    #[test]
    fn posts_carry_json_or_nothing() {
        let host = (header::HOST, "127.0.0.1:7420");
        let ct = |v| (header::CONTENT_TYPE, v);
        let len = |v| (header::CONTENT_LENGTH, v);
        assert_eq!(code(Method::POST, &[host.clone(), ct("application/json"), len("2")]), None);
        assert_eq!(code(Method::POST, &[host.clone(), ct("application/json; charset=utf-8")]), None);
        assert_eq!(code(Method::POST, std::slice::from_ref(&host)), None);
        assert_eq!(code(Method::POST, &[host.clone(), len("0")]), None);
        for bad in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"] {
            assert_eq!(
                code(Method::POST, &[host.clone(), ct(bad), len("2")]),
                Some("unsupported_media_type")
            );
        }
        assert_eq!(code(Method::POST, &[host.clone(), len("2")]), Some("unsupported_media_type"));
        assert_eq!(code(Method::PUT, &[host, ct("application/octet-stream")]), None);
    }
}
