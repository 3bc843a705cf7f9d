//! The real `branchboxd` against hostile local clients: its files under a permissive umask,
//! connections that never send their headers, too many connections, browser-style requests
//! (CSRF, DNS rebinding), and the challenge that lets a client check it before sending a token.
//! No sandbox is started: these are properties of the service itself.

mod common;

use common::{connect, start};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// Sends one raw request (with `Connection: close`) and returns the whole answer.
fn http(addr: &str, head: &str, body: &str) -> String {
    try_http(addr, head, body).unwrap()
}

/// [`http`], with the transport's error returned: a service at its connection cap closes a
/// request's socket unread, which the client may see as a reset instead of the 503.
fn try_http(addr: &str, head: &str, body: &str) -> std::io::Result<String> {
    let mut s = connect(addr);
    write!(s, "{head}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}", body.len())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

fn status(answer: &str) -> u16 {
    answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// Reads until the service closes the connection: true when it did (EOF or reset).
fn closed_by_service(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).permissions().mode() & 0o777
}

#[test]
fn files_are_private_even_under_umask_000() {
    let d = start(&[]);
    for dir in ["", "service", "sandboxes", "snapshots", "runsc"] {
        assert_eq!(mode(&d.data.join(dir)), 0o700, "{dir}/");
    }
    for file in
        ["service/token", "service/service.db", "service/service.db-wal", "service/service.db-shm", "meta.db"]
    {
        assert_eq!(mode(&d.data.join(file)), 0o600, "{file}");
    }
}

#[test]
fn connections_that_never_finish_their_headers_are_closed() {
    let d = start(&["--header-timeout", "1"]);
    let mut silent = connect(&d.addr);
    let mut partial = connect(&d.addr);
    partial.write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: ").unwrap();
    assert!(closed_by_service(&mut silent), "a connection that sent nothing was kept");
    assert!(closed_by_service(&mut partial), "a connection that never finished its headers was kept");
    assert_eq!(status(&http(&d.addr, "GET /healthz HTTP/1.1\r\nhost: 127.0.0.1", "")), 200);
}

#[test]
fn connections_over_the_cap_are_answered_503_and_closed() {
    let d = start(&["--max-connections", "3", "--header-timeout", "600"]);
    let held: Vec<TcpStream> = (0..3).map(|_| connect(&d.addr)).collect();
    let mut over = connect(&d.addr);
    let mut answer = String::new();
    over.read_to_string(&mut answer).unwrap();
    assert_eq!(status(&answer), 503, "{answer}");
    assert!(answer.contains("too_many_connections"), "{answer}");
    drop(held);
    // Closed connections give their places back.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let a = try_http(&d.addr, "GET /healthz HTTP/1.1\r\nhost: 127.0.0.1", "");
        if a.as_deref().is_ok_and(|a| status(a) == 200) {
            break;
        }
        assert!(Instant::now() < deadline, "no place freed: {a:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn browser_style_posts_are_refused_even_without_authentication() {
    let d = start(&["--insecure-no-auth"]);
    let host = format!("host: {}", d.addr);
    for ct in ["text/plain", "application/x-www-form-urlencoded"] {
        let a = http(&d.addr, &format!("POST /v1/sandboxes HTTP/1.1\r\n{host}\r\ncontent-type: {ct}"), "{}");
        assert_eq!(status(&a), 415, "{ct}: {a}");
        assert!(a.contains("unsupported_media_type"), "{a}");
    }
    let a = http(&d.addr, &format!("GET /v1/sandboxes HTTP/1.1\r\n{host}"), "");
    assert_eq!(status(&a), 200, "{a}");
    assert!(a.ends_with("[]"), "a refused POST created something: {a}");
}

#[test]
fn foreign_hosts_and_origins_are_refused() {
    let d = start(&["--insecure-no-auth", "--allowed-host", "bb.internal"]);
    let port = d.addr.rsplit(':').next().unwrap().to_string();
    let get = |extra: &str| status(&http(&d.addr, &format!("GET /v1/sandboxes HTTP/1.1\r\n{extra}"), ""));
    assert_eq!(get(&format!("host: evil.example:{port}")), 403, "a rebinding name was served");
    assert_eq!(get(&format!("host: 127.0.0.1:{port}\r\norigin: http://evil.example")), 403);
    assert_eq!(get(&format!("host: 127.0.0.1:{port}")), 200);
    assert_eq!(get(&format!("host: localhost:{port}")), 200);
    assert_eq!(get(&format!("host: bb.internal:{port}")), 200);
    assert_eq!(get(&format!("host: 127.0.0.1:{port}\r\norigin: http://127.0.0.1:{port}")), 200);
}

#[test]
fn the_challenge_proves_the_service_holds_the_token() {
    use hmac::{Hmac, Mac};
    use sha2::{Digest, Sha256};
    let d = start(&[]);
    let token = d.token();
    let nonce = "0123456789abcdef0123456789abcdef";
    let a = http(&d.addr, &format!("GET /v1/auth/challenge?nonce={nonce} HTTP/1.1\r\nhost: {}", d.addr), "");
    assert_eq!(status(&a), 200, "{a}");
    let v: serde_json::Value = serde_json::from_str(a.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(v["listen"], d.addr.as_str());
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&Sha256::digest(token.as_bytes())).unwrap();
    mac.update(format!("branchbox-service-proof\n{}\n{nonce}", d.addr).as_bytes());
    let want = hex::encode(mac.finalize().into_bytes());
    assert_eq!(v["proofs"], serde_json::json!([want]));
    assert!(!a.contains(&token), "the answer carries the token");
    for bad in ["short", "not-hex-not-hex-not-hex-not-hex-not-hex"] {
        let a =
            http(&d.addr, &format!("GET /v1/auth/challenge?nonce={bad} HTTP/1.1\r\nhost: {}", d.addr), "");
        assert_eq!(status(&a), 422, "{a}");
    }
}

/// Reads one answer (headers, then a `content-length` body) from a kept-alive connection.
fn read_answer(s: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if got.len() >= end + 4 + len {
                return head;
            }
        }
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the service closed the connection mid-answer: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
}

#[test]
fn an_answer_to_a_request_whose_body_went_unread_says_the_connection_closes() {
    let d = start(&[]);
    let token = d.token();
    let auth = format!("authorization: Bearer {token}\r\n");
    // A body no handler reads: a GET with one, a route that does not exist, a request refused
    // for its missing token. Its bytes arrive after the headers, as httpx sends them.
    for (path, auth) in [
        ("/healthz", ""),
        ("/metrics", auth.as_str()),
        ("/v1/nothing-here", auth.as_str()),
        ("/v1/sandboxes", ""),
    ] {
        let mut s = connect(&d.addr);
        write!(s, "GET {path} HTTP/1.1\r\nhost: {}\r\n{auth}content-type: application/json\r\ncontent-length: 2\r\n\r\n", d.addr)
            .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        s.write_all(b"{}").unwrap();
        let head = read_answer(&mut s);
        if head.lines().any(|l| l.trim() == "connection: close") {
            assert!(closed_by_service(&mut s), "{path}: said close but kept the connection");
            continue;
        }
        // Kept alive: the connection must then serve the next request.
        let next = write!(s, "GET /healthz HTTP/1.1\r\nhost: {}\r\n\r\n", d.addr);
        let mut answer = [0u8; 12];
        let served = next.is_ok() && s.read_exact(&mut answer).is_ok() && &answer == b"HTTP/1.1 200";
        assert!(
            served,
            "{path}: the connection was closed without `connection: close` in the answer:\n{head}"
        );
    }
}

#[test]
fn the_port_proxy_needs_the_token_and_checks_its_path() {
    let d = start(&[]);
    let host = format!("host: {}", d.addr);
    let auth = format!("authorization: Bearer {}", d.token());
    let get = |path: &str, extra: &str| http(&d.addr, &format!("GET {path} HTTP/1.1\r\n{host}{extra}"), "");
    let sandbox = "/v1/sandboxes/sbx-0123456789abcdef/ports";
    for path in [format!("{sandbox}/8080"), format!("{sandbox}/8080/index.html?x=1")] {
        let a = get(&path, "");
        assert_eq!(status(&a), 401, "{path} without a token: {a}");
        let a = get(&path, &format!("\r\n{auth}"));
        assert_eq!(status(&a), 404, "{path} of a sandbox that does not exist: {a}");
    }
    for (path, code) in
        [(format!("{sandbox}/0/"), "invalid_port"), (format!("{sandbox}/http/"), "invalid_port")]
    {
        let a = get(&path, &format!("\r\n{auth}"));
        assert_eq!(status(&a), 400, "{path}: {a}");
        assert!(a.contains(code), "{path}: {a}");
    }
    let a = get("/v1/sandboxes/..%2f/ports/80/", &format!("\r\n{auth}"));
    assert!(a.contains("invalid_id"), "{a}");
}
