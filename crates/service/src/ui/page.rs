//! How the console's built-in pages and assets are answered: with their content type, their
//! policy (CSP, framing) and the headers every console answer carries.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

/// A built-in page or asset with its policy (`csp`, `X-Frame-Options: frame`) and the headers
/// every console answer carries.
pub fn served(body: &'static str, kind: &'static str, csp: &'static str, frame: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(csp));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static(frame));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}
