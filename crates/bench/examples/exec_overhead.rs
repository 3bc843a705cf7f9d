//! What the service adds to a command: `true` run through branchboxd (HTTP on one keep-alive
//! connection) against the library path the service itself takes (`Engine::connect` + `exec`),
//! on the same sandbox, interleaved so both see the same host.
//!
//! Usage: `cargo run --release -p branchbox-bench --example exec_overhead -- <data dir> [runs]`
//! with a branchboxd serving that data directory (its URL and token are read from
//! `<data>/service/`).

use branchbox_bench::report::Stats;
use branchbox_core::{BackendChoice, Config, Engine};
use branchbox_model::BackendKind;
use branchbox_protocol::{Command, ExecSpec};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Instant;

/// Sends one request on a kept-alive connection and returns the status and body.
fn post(
    conn: &mut BufReader<TcpStream>,
    host: &str,
    token: &str,
    path: &str,
    body: &str,
) -> anyhow::Result<(u16, String)> {
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.get_mut().write_all(req.as_bytes())?;
    let mut status_line = String::new();
    conn.read_line(&mut status_line)?;
    let status: u16 = status_line.split_whitespace().nth(1).unwrap_or("0").parse()?;
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        conn.read_line(&mut line)?;
        if line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse()?;
            }
        }
    }
    let mut buf = vec![0u8; len];
    conn.read_exact(&mut buf)?;
    Ok((status, String::from_utf8_lossy(&buf).into_owned()))
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let data =
        PathBuf::from(args.next().ok_or_else(|| anyhow::anyhow!("usage: exec_overhead <data dir> [runs]"))?);
    let runs: usize = args.next().map(|r| r.parse()).transpose()?.unwrap_or(100).max(1);
    let url = std::fs::read_to_string(data.join("service/url"))?;
    let host = url.trim().trim_start_matches("http://").to_string();
    let token = std::fs::read_to_string(data.join("service/token"))?.lines().next().unwrap_or("").to_string();

    let engine = Engine::open(Config::from_env(Some(&data)))?;
    let sandbox = engine.create(BackendChoice::Exactly(BackendKind::Gvisor), None, &mut |_| {})?;
    let id = sandbox.id.clone();
    let spec = ExecSpec::new(Command::Argv(vec!["true".into()]));
    let path = format!("/v1/sandboxes/{id}/commands");
    let body = r#"{"argv":["true"]}"#;
    let mut http = BufReader::new(TcpStream::connect(&host)?);
    http.get_mut().set_nodelay(true)?;
    let result = (|| -> anyhow::Result<(Vec<std::time::Duration>, Vec<std::time::Duration>)> {
        for _ in 0..5 {
            engine.connect(&id)?.exec(spec.clone(), None)?;
            post(&mut http, &host, &token, &path, body)?;
        }
        let (mut lib, mut svc) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            let t = Instant::now();
            let out = engine.connect(&id)?.exec(spec.clone(), None)?;
            lib.push(t.elapsed());
            anyhow::ensure!(out.status.code == Some(0), "`true` failed: {:?}", out.status);
            let t = Instant::now();
            let (status, text) = post(&mut http, &host, &token, &path, body)?;
            svc.push(t.elapsed());
            anyhow::ensure!(
                status == 200 && text.contains(r#""exit_code":0"#),
                "service answered {status}: {text}"
            );
        }
        Ok((lib, svc))
    })();
    engine.kill(&id)?;
    let (lib, svc) = result?;
    let l = Stats::from_durations(&lib).ok_or_else(|| anyhow::anyhow!("no runs"))?;
    let s = Stats::from_durations(&svc).ok_or_else(|| anyhow::anyhow!("no runs"))?;
    let report = serde_json::json!({
        "bench": "service_exec_overhead",
        "method": "exec `true` on one gVisor sandbox: library = Engine::connect + exec (what a service request does \
                   inside); service = POST /v1/sandboxes/{id}/commands on a kept-alive HTTP/1.1 connection, \
                   clock from writing the request to reading the whole answer; interleaved runs",
        "runs": runs,
        "library_ms": l,
        "service_ms": s,
        "overhead_p50_ms": s.p50 - l.p50,
        "overhead_p90_ms": s.p90 - l.p90,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
