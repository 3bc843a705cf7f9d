//! The console's terminal page (`/ui/terminal.html?id=...`) and its assets: xterm.js and its
//! fit addon from npm (copied into the build by `build.rs`), and our own script. The page is a
//! document of its own because xterm.js writes `<style>` elements: only this page's policy
//! allows inline style, and it may be framed by the console (same origin) and by nothing else.

use axum::response::Response;
use axum::routing::get;
use axum::Router;

const PAGE: &str = include_str!("../../ui/terminal.html");
const SCRIPT: &str = include_str!("../../ui/terminal.js");
const STYLE: &str = include_str!("../../ui/terminal.css");
const XTERM: &str = include_str!(concat!(env!("OUT_DIR"), "/xterm.js"));
const XTERM_STYLE: &str = include_str!(concat!(env!("OUT_DIR"), "/xterm.css"));
const FIT: &str = include_str!(concat!(env!("OUT_DIR"), "/addon-fit.js"));

/// The terminal page's policy: the console's, but with inline style (xterm.js's own `<style>`
/// elements; no script is inline) and framing by the console itself.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
                       img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; \
                       form-action 'self'; frame-ancestors 'self'";

/// The terminal's routes.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    let js = "text/javascript; charset=utf-8";
    let css = "text/css; charset=utf-8";
    Router::new()
        .route("/ui/terminal.html", get(|| asset(PAGE, "text/html; charset=utf-8")))
        .route("/ui/terminal.js", get(move || asset(SCRIPT, js)))
        .route("/ui/terminal.css", get(move || asset(STYLE, css)))
        .route("/ui/vendor/xterm.js", get(move || asset(XTERM, js)))
        .route("/ui/vendor/xterm.css", get(move || asset(XTERM_STYLE, css)))
        .route("/ui/vendor/addon-fit.js", get(move || asset(FIT, js)))
}

async fn asset(body: &'static str, kind: &'static str) -> Response {
    super::page::served(body, kind, CSP, "SAMEORIGIN")
}
