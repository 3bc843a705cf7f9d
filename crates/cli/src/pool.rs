//! `branchbox pool ...`: warm pools, kept by branchboxd (docs/pools.md). Pools live in the
//! service, which refills them in the background, so these commands always go through it.

use crate::remote::{enc, Service};
use anyhow::{anyhow, bail, Context, Result};
use clap::{ArgGroup, Subcommand};
use serde_json::{json, Map, Value};
use std::time::{Duration, Instant};

/// Pool subcommands.
#[derive(Debug, Subcommand)]
pub enum PoolCmd {
    /// Create a pool of ready sandboxes restored from a snapshot (or a template).
    Create {
        /// Pool name.
        name: String,
        /// Snapshot id or name the pool's sandboxes are restored from.
        #[arg(long, conflicts_with = "template", required_unless_present = "template")]
        snapshot: Option<String>,
        /// Template whose final snapshot the pool's sandboxes are restored from.
        #[arg(long)]
        template: Option<String>,
        /// Ready sandboxes to keep.
        #[arg(long)]
        size: u32,
        /// Replace ready sandboxes older than this, seconds (service default: 3600).
        #[arg(long)]
        max_idle: Option<f64>,
        /// Keep ready sandboxes paused instead of running idle (a claim then resumes one).
        #[arg(long)]
        paused: bool,
    },
    /// Change a pool's size or idle age: a smaller size destroys the oldest ready sandboxes
    /// beyond it (claimed ones stay), a larger one starts a refill.
    #[command(group(ArgGroup::new("change").required(true).multiple(true).args(["size", "max_idle"])))]
    Set {
        /// Pool name.
        name: String,
        /// Ready sandboxes to keep.
        #[arg(long)]
        size: Option<u32>,
        /// Replace ready sandboxes older than this, seconds.
        #[arg(long)]
        max_idle: Option<f64>,
    },
    /// List pools with how full they are.
    Ls,
    /// Delete a pool and destroy its ready sandboxes (claimed ones stay).
    Rm {
        /// Pool name.
        name: String,
    },
    /// Claim a ready sandbox (fresh identity, then env, metadata and files); prints its id.
    Claim {
        /// Pool name.
        name: String,
        /// Environment for every command run through the service, KEY=VALUE (repeatable).
        #[arg(long = "env")]
        env: Vec<String>,
        /// Metadata, KEY=VALUE (repeatable).
        #[arg(long = "meta")]
        meta: Vec<String>,
        /// A file to write into the sandbox, LOCAL_PATH:SANDBOX_PATH (repeatable).
        #[arg(long = "file")]
        file: Vec<String>,
        /// Wait this long for a ready sandbox when the pool is empty, seconds (service default: 30).
        #[arg(long)]
        wait: Option<f64>,
        /// When the pool is empty, start a sandbox at once (reported as `source: cold`).
        #[arg(long)]
        allow_cold: bool,
        /// The claimed sandbox's timeout, seconds (service default applies otherwise).
        #[arg(long)]
        timeout: Option<f64>,
    },
    /// Benchmark a pool: refill rate, memory per ready sandbox, and claim-to-agent-answer
    /// latency next to a bare agent round trip through the service (docs/benchmarks.md).
    Bench {
        /// Snapshot id or name to pool.
        #[arg(long)]
        snapshot: String,
        /// Ready sandboxes in the pool.
        #[arg(long, default_value_t = 4)]
        size: u32,
        /// Timed claims (each from a full pool).
        #[arg(long, default_value_t = 20)]
        claims: usize,
    },
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
            let report = crate::pool_bench::run(svc, snapshot, *size, *claims)?;
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

/// Polls a pool until it holds `size` ready sandboxes, or fails after `limit`.
pub fn wait_full(svc: &Service, name: &str, size: u32, limit: Duration) -> Result<Value> {
    let t = Instant::now();
    loop {
        let v = svc.json("GET", &format!("/v1/pools/{}", enc(name)), None)?;
        if v["ready"].as_u64() == Some(u64::from(size)) {
            return Ok(v);
        }
        if t.elapsed() > limit {
            bail!(
                "pool {name} held {} of {size} ready sandboxes after {} s{}",
                v["ready"],
                limit.as_secs(),
                v["last_error"]
                    .as_str()
                    .map(|e| format!("; its last refill failed: {e}"))
                    .unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
