//! The console's event stream in the real `branchboxd`: it sends the sandbox list and the
//! lineage when opened, and ends cleanly when the service is asked to stop, instead of holding
//! the shutdown until its drain time runs out. No sandbox is started.

mod common;

use common::{connect, start, Daemon};
use std::io::{Read, Write};
use std::net::TcpStream;

/// Signs in; returns the `Cookie` header's value and the session's CSRF token.
fn sign_in(d: &Daemon) -> (String, String) {
    let body = format!(r#"{{"token":"{}"}}"#, d.token());
    let mut s = connect(&d.addr);
    write!(
        s,
        "POST /ui/api/session HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\nconnection: close\r\n\
         content-length: {}\r\n\r\n{body}",
        d.addr,
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let line = answer.lines().find(|l| l.to_ascii_lowercase().starts_with("set-cookie:")).expect(&answer);
    let cookie = line.split_once(':').unwrap().1.trim().split(';').next().unwrap().to_string();
    let (_, body) = answer.split_once("\r\n\r\n").expect(&answer);
    let session: serde_json::Value = serde_json::from_str(body).expect(body);
    (cookie, session["csrf"].as_str().expect(body).to_string())
}

/// Reads until `needle` has arrived; returns everything read.
fn read_until(s: &mut TcpStream, got: &mut Vec<u8>, needle: &str) {
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(got).contains(needle) {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended before {needle:?}: {}", String::from_utf8_lossy(got));
        got.extend_from_slice(&buf[..n]);
    }
}

#[test]
fn the_event_stream_sends_both_views_and_ends_cleanly_when_the_service_stops() {
    let mut d = start(&[]);
    let (cookie, csrf) = sign_in(&d);
    let mut s = connect(&d.addr);
    write!(s, "GET /ui/api/events?csrf={csrf} HTTP/1.1\r\nhost: {}\r\ncookie: {cookie}\r\n\r\n", d.addr)
        .unwrap();
    let mut got = Vec::new();
    read_until(&mut s, &mut got, "event: lineage");
    let text = String::from_utf8_lossy(&got).to_string();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("text/event-stream") && text.contains("event: sandboxes\ndata: []"), "{text}");
    // SAFETY: kill has no memory effects; the pid is our own child's.
    assert_eq!(unsafe { libc::kill(d.child.id() as i32, libc::SIGTERM) }, 0);
    s.read_to_end(&mut got).unwrap();
    // A stream the service ended itself closes with the last chunk; one cut off when the drain
    // time ran out would not.
    assert!(got.ends_with(b"0\r\n\r\n"), "{}", String::from_utf8_lossy(&got));
    assert!(d.child.wait().unwrap().success());
}
