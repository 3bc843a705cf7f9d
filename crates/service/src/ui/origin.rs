//! Binds a console session to the console's own origin. A browser sends the `127.0.0.1`
//! cookies to every port of that address and counts every port as the same site, so neither
//! the cookie nor `SameSite=Strict` tells the console's page from another local user's page on
//! another port. A request signed in by cookie must come from the console's own origin as far as
//! the browser says: `Sec-Fetch-Site`, when sent, is `same-origin`, and `Origin`, when sent, is
//! `http://` and the request's own `Host`. A program can forge both headers, so this only keeps
//! browsers' cross-origin requests out; what a program that stole the cookie lacks is the CSRF
//! token, which the service hands out only in the sign-in answer (see `ui/session.rs`).

use crate::error::ApiError;
use axum::http::{header, HeaderMap, StatusCode};

/// The header a browser names the relation of the requesting page to the target in.
pub const FETCH_SITE: &str = "sec-fetch-site";

/// Why a cookie request was refused as cross-origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Foreign {
    /// `Sec-Fetch-Site` other than `same-origin` (`same-site` is another port, `none` a typed URL).
    FetchSite,
    /// An `Origin` other than the console's own.
    Origin,
}

/// Ok when nothing in the request says it came from a page of another origin.
pub fn check(headers: &HeaderMap) -> Result<(), Foreign> {
    if let Some(site) = headers.get(FETCH_SITE) {
        if !site.as_bytes().eq_ignore_ascii_case(b"same-origin") {
            return Err(Foreign::FetchSite);
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).ok_or(Foreign::Origin)?;
        let own = origin
            .to_str()
            .ok()
            .and_then(|o| o.strip_prefix("http://"))
            .is_some_and(|o| o.eq_ignore_ascii_case(host));
        if !own {
            return Err(Foreign::Origin);
        }
    }
    Ok(())
}

/// [`check`] as the API's error: 403 `cross_origin`.
pub fn require_same(headers: &HeaderMap) -> Result<(), ApiError> {
    check(headers).map_err(|why| {
        let what = match why {
            Foreign::FetchSite => {
                "the browser says this request came from another site or port (Sec-Fetch-Site)"
            }
            Foreign::Origin => "the request's Origin is not the console's own",
        };
        ApiError::new(
            StatusCode::FORBIDDEN,
            "cross_origin",
            format!("{what}; a console session is good only for the console's own page"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:7420"));
        for (k, v) in pairs {
            h.insert(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn the_consoles_own_page_and_programs_without_browser_headers_pass() {
        assert_eq!(check(&headers(&[])), Ok(()));
        assert_eq!(check(&headers(&[(FETCH_SITE, "same-origin")])), Ok(()));
        assert_eq!(
            check(&headers(&[(FETCH_SITE, "Same-Origin"), ("origin", "http://127.0.0.1:7420")])),
            Ok(())
        );
    }

    #[test]
    fn another_port_site_or_typed_url_is_refused() {
        for site in ["same-site", "cross-site", "none", ""] {
            assert_eq!(check(&headers(&[(FETCH_SITE, site)])), Err(Foreign::FetchSite), "{site:?}");
        }
        for origin in [
            "http://127.0.0.1:7421",
            "http://127.0.0.1",
            "https://127.0.0.1:7420",
            "http://localhost:7420",
            "null",
            "http://127.0.0.1:7420.evil.example",
            "HTTP://127.0.0.1:7420",
        ] {
            let h = headers(&[(FETCH_SITE, "same-origin"), ("origin", origin)]);
            assert_eq!(check(&h), Err(Foreign::Origin), "{origin}");
        }
        let e = require_same(&headers(&[(FETCH_SITE, "same-site")])).unwrap_err();
        assert_eq!((e.status.as_u16(), e.code), (403, "cross_origin"));
    }

    #[test]
    fn an_origin_without_a_host_is_refused() {
        let mut h = HeaderMap::new();
        h.insert(header::ORIGIN, HeaderValue::from_static("http://127.0.0.1:7420"));
        assert_eq!(check(&h), Err(Foreign::Origin));
    }
}
