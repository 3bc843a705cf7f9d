//! `branchbox pool bench`: a warm pool measured through the service, each figure next to its
//! floor from the same run.
//!
//! - refill: from the pool's creation until it holds `size` ready sandboxes (the rate is
//!   sandboxes per second of that span);
//! - memory: host memory of the ready sandboxes (their cgroups), per sandbox;
//! - claim: one `POST /v1/pools/{name}/claim` from a full pool (it returns after the agent
//!   applied the after-fork hook), then one agent round trip (`files/stat /`) on the claimed
//!   sandbox: "claim to agent answering";
//! - floor: the same agent round trip on an already-running sandbox, through the same service.

use anyhow::{bail, Result};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// What the benchmark needs of branchboxd: one authenticated JSON request (`path` already
/// percent-encoded; a 204 answers `Value::Null`). The CLI's HTTP client implements it.
pub trait Service {
    /// Sends `method path` with `body` and returns the parsed answer, or the service's error.
    fn json(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value>;
}

/// What a path segment keeps as it is: ASCII letters, digits and `-_.`; every other byte is `%XX`.
const SEGMENT: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.');

/// One path segment percent-encoded, as the CLI's client encodes the names it puts in a path.
fn enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, SEGMENT).to_string()
}

fn quantiles(samples: &[f64]) -> Value {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    // Nearest rank, as in crate::report::Stats.
    let rank = |q: f64| s[((q * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1];
    json!({ "unit": "ms", "runs": s.len(), "min": s[0], "p50": rank(0.5), "p99": rank(0.99), "max": s[s.len() - 1] })
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn stat_root(svc: &dyn Service, id: &str) -> Result<()> {
    svc.json("GET", &format!("/v1/sandboxes/{}/files/stat?path=%2F", enc(id)), None).map(drop)
}

/// Runs the benchmark; the pool it makes is deleted whatever happens.
pub fn run(svc: &dyn Service, snapshot: &str, size: u32, claims: usize) -> Result<Value> {
    if claims == 0 || size == 0 {
        bail!("--size and --claims must be at least 1");
    }
    let name = format!("bench-{:08x}", rand::random::<u32>());
    let t = Instant::now();
    svc.json("POST", "/v1/pools", Some(json!({ "name": name, "snapshot": snapshot, "size": size })))?;
    let r = measure(svc, &name, size, claims, t);
    let _ = svc.json("DELETE", &format!("/v1/pools/{}", enc(&name)), None);
    r
}

fn measure(svc: &dyn Service, name: &str, size: u32, claims: usize, created: Instant) -> Result<Value> {
    let limit = Duration::from_secs(600);
    let full = wait_full(svc, name, size, limit)?;
    let refill_s = created.elapsed().as_secs_f64();
    let memory = full["memory_bytes"].as_u64().map(|b| b as f64 / f64::from(size) / 1048576.0);
    let (mut claim, mut to_answer, mut floor) = (Vec::new(), Vec::new(), Vec::new());
    let mut cold = 0;
    for _ in 0..claims {
        wait_full(svc, name, size, limit)?;
        let t = Instant::now();
        let v = svc.json("POST", &format!("/v1/pools/{}/claim", enc(name)), Some(json!({ "wait": 60 })))?;
        claim.push(ms(t));
        let id = v["sandbox"]["id"].as_str().unwrap_or_default().to_string();
        stat_root(svc, &id)?;
        to_answer.push(ms(t));
        if v["source"] != "pool" {
            cold += 1;
        }
        // The floor: the same round trip again, now on a sandbox that is already running.
        let t = Instant::now();
        stat_root(svc, &id)?;
        floor.push(ms(t));
        svc.json("DELETE", &format!("/v1/sandboxes/{}", enc(&id)), None)?;
    }
    let (c, a, f) = (quantiles(&claim), quantiles(&to_answer), quantiles(&floor));
    let mem_text = memory.map(|m| format!("{m:.1} MiB")).unwrap_or_else(|| "not shown by this host".into());
    let summary = format!(
        "pool of {size}: claim to agent answering p50 {:.1} ms, p99 {:.1} ms (claim alone p50 {:.1} ms; floor, a bare \
         agent round trip through the service: p50 {:.1} ms, p99 {:.1} ms); refill {:.2} sandboxes/s ({:.0} ms each); \
         memory per ready sandbox {mem_text}; {cold} of {claims} claims were not served from the pool",
        a["p50"].as_f64().unwrap_or(0.0),
        a["p99"].as_f64().unwrap_or(0.0),
        c["p50"].as_f64().unwrap_or(0.0),
        f["p50"].as_f64().unwrap_or(0.0),
        f["p99"].as_f64().unwrap_or(0.0),
        f64::from(size) / refill_s,
        refill_s * 1e3 / f64::from(size),
    );
    Ok(json!({
        "bench": "pool-claim",
        "backend": "gvisor",
        "method": "through branchboxd over loopback HTTP: claim = POST /v1/pools/{name}/claim from a full pool \
                   (returns after the agent applied the after-fork hook); claim_to_answer adds one agent round trip \
                   (GET files/stat /); floor = that round trip on the already-running claimed sandbox; refill = pool \
                   creation until size ready; memory = the ready sandboxes' memory cgroups / size",
        "inputs": { "snapshot": full["snapshot"], "size": size, "claims": claims },
        "figures": { "claim": c, "claim_to_answer": a, "floor_agent_round_trip": f },
        "refill": { "seconds": refill_s, "per_second": f64::from(size) / refill_s },
        "memory_per_ready_sandbox_mib": memory,
        "not_from_pool": cold,
        "summary": summary,
    }))
}

/// Polls a pool until it holds `size` ready sandboxes, or fails after `limit`.
pub fn wait_full(svc: &dyn Service, name: &str, size: u32, limit: Duration) -> Result<Value> {
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
