//! The real `branchboxd` against hostile local clients: its files under a permissive umask,
//! connections that never send their headers, too many connections, browser-style requests
//! (CSRF, DNS rebinding), and the challenge that lets a client check it before sending a token.
//! No sandbox is started: these are properties of the service itself.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running branchboxd over a data directory of its own, killed when dropped.
struct Daemon {
    child: Child,
    _dir: tempfile::TempDir,
    data: PathBuf,
    addr: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts branchboxd with umask 000, as a careless service manager would.
fn start(args: &[&str]) -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_branchboxd"));
    cmd.arg("--data-dir")
        .arg(&data)
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env("RUST_LOG", "warn")
        // No sandbox can start, whatever a request that slipped through asked for.
        .env("BRANCHBOX_RUNSC", "/nonexistent/runsc")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    // SAFETY: umask is async-signal-safe and has no preconditions.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0);
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let url = data.join("service/url");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !url.exists() {
        assert!(child.try_wait().unwrap().is_none(), "branchboxd exited early");
        assert!(Instant::now() < deadline, "branchboxd wrote no url file");
        std::thread::sleep(Duration::from_millis(20));
    }
    let addr = std::fs::read_to_string(&url).unwrap().trim().trim_start_matches("http://").to_string();
    Daemon { child, _dir: dir, data, addr }
}

fn connect(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    // A bound on how long a test waits, never an assertion about how fast the service is.
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s
}

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
    let token = std::fs::read_to_string(d.data.join("service/token")).unwrap().trim().to_string();
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
