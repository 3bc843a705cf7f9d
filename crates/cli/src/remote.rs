//! Running commands through a branchboxd instead of the engine, when one is configured: with
//! `BRANCHBOX_URL` set (explicit; commands the service does not offer are refused rather than
//! run on this host), or with `<data>/service/url` naming a service that answers (same host;
//! anything not offered here, and `--json` output, falls back to the engine, so the output is
//! the same either way). `BRANCHBOX_NO_SERVICE=1` always uses the engine.

use crate::args::{Cli, Cmd, CreateArgs, ExecArgs};
use crate::output::clean;
use anyhow::{anyhow, bail, Context, Result};
use branchbox_core::Config;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::time::Duration;

pub(crate) struct Service {
    url: String,
    token: Option<String>,
    agent: ureq::Agent,
}

fn first_line(p: &std::path::Path) -> Option<String> {
    std::fs::read_to_string(p).ok()?.lines().next().map(|l| l.trim().to_string()).filter(|l| !l.is_empty())
}

/// The service to use and whether it was named explicitly, if any; an error when something
/// answers at the service's address but cannot prove it is the service.
pub(crate) fn locate(cli: &Cli) -> Result<Option<(Service, bool)>> {
    if std::env::var("BRANCHBOX_NO_SERVICE").is_ok_and(|v| v == "1") {
        return Ok(None);
    }
    let dir = Config::from_env(cli.data_dir.as_deref()).data_dir.join("service");
    let explicit = std::env::var("BRANCHBOX_URL").ok().filter(|u| !u.is_empty());
    let url_file = dir.join("url");
    let Some(url) = explicit.clone().or_else(|| first_line(&url_file)) else { return Ok(None) };
    let token = std::env::var("BRANCHBOX_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
        .or_else(|| first_line(&dir.join("token")));
    let agent = ureq::AgentBuilder::new().timeout_connect(Duration::from_secs(5)).build();
    let svc = Service { url: url.trim_end_matches('/').to_string(), token, agent };
    // A URL file left by a service that is gone must not stop the command line from working.
    if explicit.is_none()
        && svc.agent.get(&format!("{}/healthz", svc.url)).timeout(Duration::from_secs(1)).call().is_err()
    {
        return Ok(None);
    }
    if let Some(token) = &svc.token {
        // The URL file is the service's own listen address; an explicit URL may pass a proxy
        // or tunnel, where the service listens on another address than the client dials.
        let expect = if explicit.is_none() { svc.url.strip_prefix("http://") } else { None };
        svc.verify(token, expect).map_err(|why| {
            let fix = if explicit.is_none() {
                format!("if branchboxd is not running, remove {}", url_file.display())
            } else {
                "check BRANCHBOX_URL".to_string()
            };
            anyhow!(
                "the process answering at {} did not prove it is the branchbox service, so the token was not sent to \
                 it: {why}; {fix}",
                svc.url
            )
        })?;
    }
    Ok(Some((svc, explicit.is_some())))
}

impl Service {
    /// Asks the service to prove it holds `token` (an HMAC over a fresh nonce) before the
    /// token is ever sent; with `expect_listen`, the proof must also name that address.
    fn verify(&self, token: &str, expect_listen: Option<&str>) -> std::result::Result<(), String> {
        crate::challenge::verify(&self.agent, &self.url, token, expect_listen)
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<ureq::Response> {
        let mut req = self.agent.request(method, &format!("{}{path}", self.url));
        if let Some(t) = &self.token {
            req = req.set("authorization", &format!("Bearer {t}"));
        }
        let r = match body {
            Some(b) => req.send_json(b),
            None => req.call(),
        };
        match r {
            Ok(r) => Ok(r),
            Err(ureq::Error::Status(status, r)) => {
                let v: Value = r.into_json().unwrap_or(Value::Null);
                let msg = v["error"]["message"].as_str().unwrap_or("the service refused the request");
                bail!("{msg} (HTTP {status} from {})", self.url)
            }
            Err(e) => Err(anyhow!("cannot reach the branchbox service at {}: {e}", self.url)),
        }
    }

    pub(crate) fn json(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value> {
        let r = self.call(method, path, body)?;
        if r.status() == 204 {
            return Ok(Value::Null);
        }
        Ok(r.into_json()?)
    }
}

/// Runs the command through the service when one is configured and offers it; `None` means
/// the engine should run it.
pub fn run(cli: &Cli) -> Result<Option<i32>> {
    let Some((svc, explicit)) = locate(cli)? else { return Ok(None) };
    if cli.json && !explicit {
        return Ok(None);
    }
    let out = |v: &Value, text: String| {
        if cli.json {
            println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
        } else if !text.is_empty() {
            println!("{text}");
        }
    };
    let str_of = |v: &Value, k: &str| v[k].as_str().unwrap_or_default().to_string();
    match &cli.command {
        Cmd::Create { create } => {
            let v = svc.json("POST", "/v1/sandboxes", Some(create_body(create)?))?;
            out(&v, str_of(&v, "id"));
        }
        Cmd::Exec { id, exec } => return exec_remote(&svc, id, exec, cli.json).map(Some),
        Cmd::Ls { all: false } => {
            let v = svc.json("GET", "/v1/sandboxes", None)?;
            let lines: Vec<String> = v
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| {
                    let from = s["parent_snapshot"].as_str().map(|p| format!("from {p}")).unwrap_or_default();
                    format!("{}  {:<8} {:<8} {}", str_of(s, "id"), str_of(s, "backend"), str_of(s, "state"), from)
                })
                .collect();
            out(&v, lines.join("\n"));
        }
        Cmd::Kill { ids } => {
            // Every id is tried, as on the local path; each failure is reported.
            let mut failed = Vec::new();
            let mut killed = Vec::new();
            for id in ids {
                match svc.json("DELETE", &format!("/v1/sandboxes/{}", enc(id)), None) {
                    Ok(_) => killed.push(id),
                    Err(e) => {
                        eprintln!("error: kill {id}: {e:#}");
                        failed.push(json!({ "target": id, "error": { "message": format!("{e:#}") } }));
                    }
                }
            }
            out(&json!({ "killed": killed, "failed": failed }), String::new());
            return Ok(Some(if failed.is_empty() { 0 } else { 1 }));
        }
        Cmd::Pause { id } => {
            svc.json("POST", &format!("/v1/sandboxes/{}/pause", enc(id)), None)?;
            out(&json!({ "paused": id }), String::new());
        }
        Cmd::Resume { id } => {
            svc.json("POST", &format!("/v1/sandboxes/{}/connect", enc(id)), Some(json!({})))?;
            out(&json!({ "resumed": id }), String::new());
        }
        Cmd::Snapshot { id, name, ttl: None } => {
            let v = svc.json("POST", &format!("/v1/sandboxes/{}/snapshots", enc(id)), Some(json!({ "name": name })))?;
            out(&v, str_of(&v, "id"));
        }
        Cmd::Restore { snapshot } => {
            let v = svc.json("POST", "/v1/sandboxes", Some(json!({ "snapshot_id": snapshot, "timeout": CLI_TIMEOUT_S })))?;
            out(&v, str_of(&v, "id"));
        }
        Cmd::Fork { id, count } => {
            let v = svc.json("POST", &format!("/v1/sandboxes/{}/fork", enc(id)), Some(json!({ "count": count })))?;
            let kids = v["children"].as_array().cloned().unwrap_or_default();
            let lines: Vec<String> = kids
                .iter()
                .map(|c| match c["sandbox"]["id"].as_str() {
                    Some(id) => id.to_string(),
                    None => format!("error: {}", clean(c["error"]["message"].as_str().unwrap_or("failed"))),
                })
                .collect();
            out(&v, lines.join("\n"));
            return Ok(Some(if kids.iter().all(|c| c["ok"] == true) { 0 } else { 1 }));
        }
        _ if explicit => bail!(
            "this command is not available through the branchbox service at {} yet; unset BRANCHBOX_URL to run it on this host",
            svc.url
        ),
        _ => return Ok(None),
    }
    Ok(Some(0))
}

/// What a path segment keeps as it is: ASCII letters, digits and `-_.`; every other byte is `%XX`.
const SEGMENT: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.');

pub(crate) fn enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, SEGMENT).to_string()
}

/// Sandboxes made from the command line are meant to stay until killed; the service's longest
/// timeout (a day) is the closest it offers.
const CLI_TIMEOUT_S: u64 = 24 * 3600;

fn create_body(c: &CreateArgs) -> Result<Value> {
    let backend = format!("{:?}", c.backend).to_lowercase();
    let mut body = json!({ "backend": backend, "memory_mib": c.memory, "cpus": c.cpus, "pids": c.pids, "timeout": CLI_TIMEOUT_S });
    match &c.template {
        Some(t) => body["template"] = json!(t),
        None => body["image"] = json!(c.image),
    }
    // The policy's wire form is the service's `network` object ({"mode": ...}).
    if let Some(egress) = crate::network::egress(c)? {
        body["network"] = serde_json::to_value(egress)?;
    }
    if c.open_ports {
        body["open_ports"] = json!(true);
    }
    Ok(body)
}

fn exec_remote(svc: &Service, id: &str, a: &ExecArgs, json_out: bool) -> Result<i32> {
    let mut body = if a.shell { json!({ "cmd": a.command.join(" ") }) } else { json!({ "argv": a.command }) };
    let mut envs = serde_json::Map::new();
    for kv in &a.env {
        let (k, v) = kv.split_once('=').ok_or_else(|| anyhow!("--env {kv:?} is not KEY=VALUE"))?;
        envs.insert(k.to_string(), Value::String(v.to_string()));
    }
    body["envs"] = Value::Object(envs);
    if let Some(cwd) = &a.cwd {
        body["cwd"] = json!(cwd);
    }
    if let Some(t) = a.timeout {
        body["timeout"] = json!(t);
    }
    if a.stdin {
        let mut input = String::new();
        std::io::stdin()
            .read_to_string(&mut input)
            .context("reading standard input (the service takes text)")?;
        body["stdin"] = json!(input);
    }
    let r = svc.call("POST", &format!("/v1/sandboxes/{}/commands/stream", enc(id)), Some(body))?;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (mut event, mut status) = (String::new(), None);
    for line in BufReader::new(r.into_reader()).lines() {
        let line = line.context("reading the command's output from the service")?;
        if let Some(e) = line.strip_prefix("event:") {
            event = e.trim().to_string();
        } else if let Some(d) = line.strip_prefix("data:") {
            let v: Value = serde_json::from_str(d.trim())?;
            match event.as_str() {
                "stdout" | "stderr" => {
                    let bytes = b64(v["data"].as_str().unwrap_or_default())?;
                    let (buf, is_out) = if event == "stdout" { (&mut out, true) } else { (&mut err, false) };
                    if json_out {
                        buf.extend_from_slice(&bytes);
                    } else if is_out {
                        let _ = std::io::stdout().write_all(&bytes);
                    } else {
                        let _ = std::io::stderr().write_all(&bytes);
                    }
                }
                "exit" => status = Some(v),
                "error" => bail!("{}", v["error"]["message"].as_str().unwrap_or("the command failed")),
                _ => {}
            }
        }
    }
    let s = status.ok_or_else(|| anyhow!("the service's stream ended before the command's exit status"))?;
    let status = json!({ "code": s["exit_code"], "signal": s["signal"], "timed_out": s["timed_out"],
                         "truncated": s["truncated"], "duration_ms": s["duration_ms"] });
    if json_out {
        let v = json!({ "stdout": String::from_utf8_lossy(&out), "stderr": String::from_utf8_lossy(&err),
                        "status": status, "checkpoint": null });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let _ = std::io::stdout().flush();
        if status["timed_out"] == true {
            eprintln!("branchbox: the command timed out and its process group was killed");
        }
        if status["truncated"] == true {
            eprintln!("branchbox: output was cut at the output cap");
        }
    }
    // Shell-style, as the local path: the code, 128 + signal, or 124 on timeout.
    Ok(if status["timed_out"] == true {
        124
    } else {
        status["code"].as_i64().or(status["signal"].as_i64().map(|s| 128 + s)).unwrap_or(1) as i32
    })
}

fn b64(s: &str) -> Result<Vec<u8>> {
    let val = |c: u8| -> Result<u32> {
        Ok(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => bail!("the service sent output that is not base64"),
        } as u32)
    };
    let bytes: Vec<u8> = s.bytes().filter(|&c| c != b'=').collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= val(c)? << (18 - 6 * i);
        }
        let take = chunk.len().saturating_sub(1);
        out.extend_from_slice(&n.to_be_bytes()[1..1 + take]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes_every_padding_length() {
        assert_eq!(b64("aGk=").unwrap(), b"hi");
        assert_eq!(b64("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(b64("YWJj").unwrap(), b"abc");
        assert_eq!(b64("YQ==").unwrap(), b"a");
        assert!(b64("a*b=").is_err());
    }

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(enc("sbx-0123"), "sbx-0123");
        assert_eq!(enc("../x y"), "..%2Fx%20y");
    }
}
