//! The console's routes in process: assets and their headers, sign-in, the cookie session on
//! the `/v1` API with and without its CSRF token and from other origins, sign-out. No sandbox
//! is started.

use crate::config::ServiceConfig;
use crate::state::AppState;
use axum::body::Body;
use axum::http::{header, Request, Response};
use axum::Router;
use http_body_util::BodyExt;
use tower::ServiceExt;

const TOKEN: &str = "test-token-0123456789";
const NO_SUCH: &str = "/v1/sandboxes/sbx-0000000000000000/timeout";

fn app() -> (tempfile::TempDir, Router) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ServiceConfig::new(branchbox_core::Config::from_env(Some(dir.path())));
    let st = AppState::open(cfg, Some(crate::auth::Tokens::new([TOKEN]))).unwrap();
    (dir, crate::serve::router(st, Default::default()).0)
}

async fn call(
    r: &Router,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Response<Body> {
    let mut req = Request::builder().method(method).uri(uri).header("host", "127.0.0.1:7420");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = match body {
        Some(b) => req.header("content-type", "application/json").body(Body::from(b.to_string())),
        None => req.body(Body::empty()),
    };
    r.clone().oneshot(req.unwrap()).await.unwrap()
}

async fn json(r: Response<Body>) -> serde_json::Value {
    serde_json::from_slice(&r.into_body().collect().await.unwrap().to_bytes()).unwrap()
}

/// Signs in; returns the `Cookie` header value and the CSRF token.
async fn sign_in(r: &Router) -> (String, String) {
    let resp = call(r, "POST", "/ui/api/session", &[], Some(&format!(r#"{{"token":"{TOKEN}"}}"#))).await;
    assert_eq!(resp.status().as_u16(), 200);
    let set = resp.headers()[header::SET_COOKIE].to_str().unwrap().to_string();
    let cookie = set.split(';').next().unwrap().to_string();
    (cookie, json(resp).await["csrf"].as_str().unwrap().to_string())
}

#[tokio::test]
async fn pages_are_served_from_the_binary_under_a_strict_policy() {
    let (_d, r) = app();
    for (path, kind, needle) in [
        ("/ui", "text/html", "/ui/app.js"),
        ("/ui/", "text/html", "/ui/app.css"),
        ("/ui/app.js", "text/javascript", "EventSource"),
        ("/ui/app.css", "text/css", ".tree"),
    ] {
        let resp = call(&r, "GET", path, &[], None).await;
        assert_eq!(resp.status().as_u16(), 200, "{path}");
        let h = resp.headers().clone();
        assert!(h[header::CONTENT_TYPE].to_str().unwrap().starts_with(kind), "{path}");
        let csp = h[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert!(csp.starts_with("default-src 'self'") && csp.contains("script-src 'self';"), "{csp}");
        assert!(!csp.contains("unsafe"), "{csp}");
        assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert!(String::from_utf8_lossy(&body).contains(needle), "{path}");
    }
}

#[tokio::test]
async fn sign_in_takes_only_the_token_and_the_cookie_holds_a_session_id() {
    let (_d, r) = app();
    for bad in [r#"{"token":"wrong-token-0123456789"}"#, r#"{"token":""}"#, r#"{}"#] {
        let resp = call(&r, "POST", "/ui/api/session", &[], Some(bad)).await;
        assert!(matches!(resp.status().as_u16(), 401 | 422), "{bad}: {}", resp.status());
        assert!(resp.headers().get(header::SET_COOKIE).is_none(), "{bad}");
    }
    let resp = call(&r, "POST", "/ui/api/session", &[], Some(&format!(r#"{{"token":"{TOKEN}"}}"#))).await;
    let set = resp.headers()[header::SET_COOKIE].to_str().unwrap().to_string();
    assert!(set.starts_with("bbx_session_7420="), "{set}");
    assert!(
        set.contains("; HttpOnly") && set.contains("; SameSite=Strict") && set.contains("; Path=/"),
        "{set}"
    );
    assert!(!set.contains(TOKEN), "the cookie carries the token: {set}");
    let (cookie, csrf) = sign_in(&r).await;
    assert_ne!(cookie, set.split(';').next().unwrap(), "two sign-ins share a session id");
    let who =
        json(call(&r, "GET", "/ui/api/session", &[("cookie", &cookie), ("x-csrf-token", &csrf)], None).await)
            .await;
    assert_eq!(who["csrf"], csrf.as_str());
    assert_eq!(who["who"], crate::auth::token_id(TOKEN).as_str());
    assert_eq!(call(&r, "GET", "/ui/api/session", &[], None).await.status().as_u16(), 401);
    assert_eq!(call(&r, "GET", "/ui/api/events", &[], None).await.status().as_u16(), 401);
}

#[tokio::test]
async fn the_api_takes_the_cookie_and_needs_the_csrf_token_to_change_state() {
    let (_d, r) = app();
    let (cookie, csrf) = sign_in(&r).await;
    let list = call(&r, "GET", "/v1/sandboxes", &[("cookie", &cookie), ("x-csrf-token", &csrf)], None).await;
    assert_eq!(list.status().as_u16(), 200);
    assert_eq!(call(&r, "GET", "/v1/sandboxes", &[("cookie", &cookie)], None).await.status().as_u16(), 403);
    assert_eq!(call(&r, "GET", "/v1/sandboxes", &[], None).await.status().as_u16(), 401);
    let body = Some(r#"{"timeout":5}"#);
    let refused = [
        (vec![("cookie", cookie.as_str())], 403),
        (vec![("cookie", cookie.as_str()), ("x-csrf-token", "00")], 403),
        (vec![("cookie", cookie.as_str()), ("x-csrf-token", &csrf[..63])], 403),
        (vec![("x-csrf-token", csrf.as_str())], 401),
        (
            vec![
                (
                    "cookie",
                    "bbx_session_7420=0000000000000000000000000000000000000000000000000000000000000000",
                ),
                ("x-csrf-token", csrf.as_str()),
            ],
            401,
        ),
    ];
    for (headers, want) in refused {
        let resp = call(&r, "POST", NO_SUCH, &headers, body).await;
        assert_eq!(resp.status().as_u16(), want, "{headers:?}");
    }
    // Past authentication, the request reaches the handler, which finds no such sandbox.
    let ok = call(&r, "POST", NO_SUCH, &[("cookie", &cookie), ("x-csrf-token", &csrf)], body).await;
    assert_eq!(ok.status().as_u16(), 404);
    let bearer = format!("Bearer {TOKEN}");
    assert_eq!(call(&r, "POST", NO_SUCH, &[("authorization", &bearer)], body).await.status().as_u16(), 404);
}

#[tokio::test]
async fn sign_out_needs_the_csrf_token_and_ends_the_session() {
    let (_d, r) = app();
    let (cookie, csrf) = sign_in(&r).await;
    let refused = call(&r, "DELETE", "/ui/api/session", &[("cookie", &cookie)], None).await;
    assert_eq!(refused.status().as_u16(), 403);
    let both = [("cookie", cookie.as_str()), ("x-csrf-token", csrf.as_str())];
    assert_eq!(call(&r, "GET", "/v1/sandboxes", &both, None).await.status().as_u16(), 200);
    let out = call(&r, "DELETE", "/ui/api/session", &both, None).await;
    assert_eq!(out.status().as_u16(), 204);
    let cleared = out.headers()[header::SET_COOKIE].to_str().unwrap();
    assert!(cleared.starts_with("bbx_session_7420=;") && cleared.contains("Max-Age=0"), "{cleared}");
    assert_eq!(call(&r, "GET", "/v1/sandboxes", &both, None).await.status().as_u16(), 401);
    assert_eq!(call(&r, "GET", "/ui/api/session", &both, None).await.status().as_u16(), 401);
}

#[tokio::test]
async fn the_diff_route_checks_its_references_before_touching_a_snapshot() {
    let (_d, r) = app();
    let bearer = format!("Bearer {TOKEN}");
    let h = [("authorization", bearer.as_str())];
    let bad = call(&r, "GET", "/v1/snapshots/snap-0000000000000001/diff?against=a%20b", &h, None).await;
    assert_eq!((bad.status().as_u16(), json(bad).await["error"]["code"].clone()), (400, "invalid_id".into()));
    let missing = call(&r, "GET", "/v1/snapshots/snap-0000000000000001/diff", &h, None).await;
    assert_eq!(missing.status().as_u16(), 404);
    let (cookie, csrf) = sign_in(&r).await;
    let both = [("cookie", cookie.as_str()), ("x-csrf-token", csrf.as_str())];
    let read = call(&r, "GET", "/v1/snapshots/snap-0000000000000001/diff", &both, None).await;
    assert_eq!(read.status().as_u16(), 404, "a read with the session cookie and its CSRF token");
}

#[tokio::test]
async fn the_session_route_hands_the_csrf_token_to_no_holder_of_the_cookie_alone() {
    let (_d, r) = app();
    let (cookie, csrf) = sign_in(&r).await;
    // What another local user's server, given the cookie by the browser, can send: no token, a
    // wrong one, and headers dressed as the console's own page.
    let dressed =
        [("cookie", cookie.as_str()), ("origin", "http://127.0.0.1:7420"), ("sec-fetch-site", "same-origin")];
    for extra in [None, Some("00".repeat(32))] {
        let mut h = dressed.to_vec();
        if let Some(x) = &extra {
            h.push(("x-csrf-token", x));
        }
        let resp = call(&r, "GET", "/ui/api/session", &h, None).await;
        assert_eq!(resp.status().as_u16(), 403, "{extra:?}");
        let body = json(resp).await;
        assert!(!body.to_string().contains(&csrf), "the CSRF token was handed out: {body}");
        assert_eq!(body["error"]["code"], "csrf");
    }
    let events = call(&r, "GET", "/ui/api/events", &dressed, None).await;
    assert_eq!(events.status().as_u16(), 403);
    let q = format!("/ui/api/events?csrf={}", "00".repeat(32));
    assert_eq!(call(&r, "GET", &q, &dressed, None).await.status().as_u16(), 403);
}

#[tokio::test]
async fn requests_from_another_port_are_refused_with_the_cookie_and_its_token() {
    let (_d, r) = app();
    let (cookie, csrf) = sign_in(&r).await;
    let both = [("cookie", cookie.as_str()), ("x-csrf-token", csrf.as_str())];
    let events = format!("/ui/api/events?csrf={csrf}");
    for (name, value) in [("sec-fetch-site", "same-site"), ("sec-fetch-site", "cross-site")] {
        let mut h = both.to_vec();
        h.push((name, value));
        for (method, path) in [
            ("GET", "/ui/api/session"),
            ("GET", "/v1/sandboxes"),
            ("GET", events.as_str()),
            ("DELETE", "/ui/api/session"),
        ] {
            let resp = call(&r, method, path, &h, None).await;
            assert_eq!(resp.status().as_u16(), 403, "{method} {path} {value}");
            assert_eq!(json(resp).await["error"]["code"], "cross_origin", "{method} {path} {value}");
        }
        let resp = call(&r, "POST", NO_SUCH, &h, Some(r#"{"timeout":5}"#)).await;
        assert_eq!(resp.status().as_u16(), 403, "{value}");
        // Nor can such a page sign the browser in to a session of its choosing.
        let body = format!(r#"{{"token":"{TOKEN}"}}"#);
        let resp = call(&r, "POST", "/ui/api/session", &[(name, value)], Some(&body)).await;
        assert_eq!(resp.status().as_u16(), 403, "{value}");
        assert!(resp.headers().get(header::SET_COOKIE).is_none());
    }
    // The console's own page passes, its event stream naming the token in the query.
    let mut own = both.to_vec();
    own.push(("sec-fetch-site", "same-origin"));
    assert_eq!(call(&r, "GET", "/ui/api/session", &own, None).await.status().as_u16(), 200);
    assert_eq!(call(&r, "GET", &events, &own[..1], None).await.status().as_u16(), 200);
    // A bearer client is judged by its token alone, as before.
    let bearer = format!("Bearer {TOKEN}");
    let h = [("authorization", bearer.as_str()), ("sec-fetch-site", "cross-site")];
    assert_eq!(call(&r, "GET", "/v1/sandboxes", &h, None).await.status().as_u16(), 200);
}
