//! `branchbox pool ...`: warm pools, kept by branchboxd (docs/pools.md). Pools live in the
//! service, which refills them in the background, so these commands always go through it.

use crate::args::PoolCmd;
use crate::remote::{enc, Service};
use anyhow::{anyhow, Context, Result};
use serde_json::{json, Map, Value};

/// `branchbox pool bench` (in `branchbox-bench`) reaches branchboxd through this client.
impl branchbox_bench::pool::Service for Service {
    fn json(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value> {
        Service::json(self, method, path, body)
    }
}

fn pairs(what: &str, kvs: &[String]) -> Result<Map<String, Value>> {
    kvs.iter()
        .map(|kv| {
            let (k, v) = kv.split_once('=').ok_or_else(|| anyhow!("--{what} {kv:?} is not KEY=VALUE"))?;
            Ok((k.to_string(), Value::String(v.to_string())))
        })
        .collect()
}

fn files(specs: &[String]) -> Result<Vec<Value>> {
    use base64::Engine as _;
    specs
        .iter()
        .map(|s| {
            let (local, remote) =
                s.split_once(':').ok_or_else(|| anyhow!("--file {s:?} is not LOCAL_PATH:SANDBOX_PATH"))?;
            let data = std::fs::read(local).with_context(|| format!("reading {local} for --file"))?;
            let content = base64::engine::general_purpose::STANDARD.encode(data);
            Ok(json!({ "path": remote, "content": content, "encoding": "base64" }))
        })
        .collect()
}

fn line(p: &Value) -> String {
    let from = p["snapshot"]
        .as_str()
        .map(|s| format!("snapshot {s}"))
        .unwrap_or_else(|| format!("template {}", p["template"].as_str().unwrap_or("?")));
    let mem =
        p["memory_bytes"].as_u64().map(|b| format!("{:.1} MiB", b as f64 / 1048576.0)).unwrap_or("-".into());
    let err = p["last_error"].as_str().map(|e| format!("  last refill failed: {e}")).unwrap_or_default();
    format!(
        "{:<20} {}/{} ready  {:<10} {from}{err}",
        p["name"].as_str().unwrap_or_default(),
        p["ready"],
        p["size"],
        mem
    )
}

/// Runs a pool command through the service.
pub fn run(svc: &Service, cmd: &PoolCmd, json_out: bool) -> Result<i32> {
    let out = |v: &Value, text: String| {
        if json_out {
            println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
        } else if !text.is_empty() {
            println!("{text}");
        }
    };
    match cmd {
        PoolCmd::Create { name, snapshot, template, size, max_idle, paused } => {
            let body = json!({ "name": name, "snapshot": snapshot, "template": template, "size": size,
                               "max_idle": max_idle, "paused": paused });
            let v = svc.json("POST", "/v1/pools", Some(strip_nulls(body)))?;
            out(&v, line(&v));
        }
        PoolCmd::Set { name, size, max_idle } => {
            let body = strip_nulls(json!({ "size": size, "max_idle": max_idle }));
            let v = svc.json("PATCH", &format!("/v1/pools/{}", enc(name)), Some(body))?;
            out(&v, line(&v));
        }
        PoolCmd::Ls => {
            let v = svc.json("GET", "/v1/pools", None)?;
            let lines: Vec<String> = v.as_array().into_iter().flatten().map(line).collect();
            out(&v, lines.join("\n"));
        }
        PoolCmd::Rm { name } => {
            svc.json("DELETE", &format!("/v1/pools/{}", enc(name)), None)?;
            out(&json!({ "deleted": name }), String::new());
        }
        PoolCmd::Claim { name, env, meta, file, wait, allow_cold, timeout } => {
            let body = json!({ "envs": pairs("env", env)?, "metadata": pairs("meta", meta)?, "files": files(file)?,
                               "wait": wait, "allow_cold": allow_cold, "timeout": timeout });
            let v = svc.json("POST", &format!("/v1/pools/{}/claim", enc(name)), Some(strip_nulls(body)))?;
            if v["source"] == "cold" && !json_out {
                eprintln!("branchbox: pool {name} was empty; this sandbox was started cold (--allow-cold)");
            }
            out(&v, v["sandbox"]["id"].as_str().unwrap_or_default().to_string());
        }
        PoolCmd::Bench { snapshot, size, claims } => {
            let report = branchbox_bench::pool::run(svc, snapshot, *size, *claims)?;
            if json_out {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!("{}", report["summary"].as_str().unwrap_or_default());
            }
        }
    }
    Ok(0)
}

fn strip_nulls(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(m.into_iter().filter(|(_, v)| !v.is_null()).collect()),
        other => other,
    }
}
