//! Benchmarks of the engine on real sandboxes (see `docs/benchmarks.md`). Each returns one
//! [`Report`]; clocks stop only when the work is really done (the agent answered).

use crate::report::{Report, Stats};
use branchbox_core::config::Config;
use branchbox_core::engine::{BackendChoice, Engine};
use branchbox_model::{AgentConn, BackendKind, Error, Result, SandboxId};
use branchbox_protocol::{Command, ExecSpec};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A Python process that touches `mib` MiB and then counts, so forks carry real memory.
pub fn memory_holder(mib: u64) -> ExecSpec {
    let code = format!(
        "import time\nb = bytearray({mib} * 1024 * 1024)\nfor i in range(0, len(b), 4096):\n    b[i] = 1\n\
         open('/tmp/holder-ready', 'w').write('ok')\nn = 0\nwhile True:\n    n += 1\n    time.sleep(0.05)\n"
    );
    ExecSpec::new(Command::Argv(vec!["python3".into(), "-c".into(), code]))
}

/// A Python process that ticks every 5 ms and keeps the longest wall-clock gap between two
/// ticks: how long its sandbox stood still. When /tmp/ask-gap appears it writes that gap in
/// microseconds to /tmp/gap and starts a new one. Wall clock: a restored gVisor sandbox's
/// monotonic clock hides the time it was stopped.
const PAUSE_PROBE: &str = "import os, time\nlast = time.time()\nworst = 0.0\nwhile True:\n    time.sleep(0.005)\n    \
     now = time.time()\n    worst = max(worst, now - last)\n    last = now\n    \
     if os.path.exists('/tmp/ask-gap'):\n        os.remove('/tmp/ask-gap')\n        \
     open('/tmp/gap.tmp', 'w').write(str(int(worst * 1e6)))\n        os.rename('/tmp/gap.tmp', '/tmp/gap')\n        \
     worst = 0.0\n";

/// Asks the [`PAUSE_PROBE`] for the longest gap since the last ask.
fn probe_gap(conn: &mut AgentConn) -> Result<Duration> {
    let fail = |e: branchbox_protocol::ClientError| Error::Backend(format!("the pause probe: {e}"));
    let _ = conn.remove("/tmp/gap", false);
    conn.write_file("/tmp/ask-gap", &mut std::io::empty(), None, false, false).map_err(fail)?;
    let asked = Instant::now();
    loop {
        if let Ok(text) = conn.read_file_bytes("/tmp/gap", 64) {
            if let Some(us) = std::str::from_utf8(&text).ok().and_then(|t| t.trim().parse::<u64>().ok()) {
                return Ok(Duration::from_micros(us));
            }
        }
        if asked.elapsed() > Duration::from_secs(30) {
            return Err(Error::Backend("the pause probe did not answer within 30 s".into()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub(crate) fn host_facts(engine: &Engine) -> serde_json::Value {
    let kvm = branchbox_core::host::detect_kvm();
    serde_json::json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "kvm": kvm.kind,
        "runsc": engine.gvisor().check().unwrap_or_else(|e| e.to_string()),
    })
}

pub(crate) fn stats(samples: &[Duration]) -> Result<Stats> {
    Stats::from_durations(samples)
        .ok_or_else(|| Error::InvalidInput("a benchmark needs at least one run".into()))
}

/// Kills the sandboxes it holds when dropped, so a failed benchmark leaks nothing.
pub(crate) struct Cleanup<'a> {
    pub(crate) engine: &'a Engine,
    pub(crate) ids: Vec<SandboxId>,
}

impl Cleanup<'_> {
    /// Kills `id` now and stops holding it.
    pub(crate) fn kill(&mut self, id: &SandboxId) -> Result<()> {
        self.ids.retain(|i| i != id);
        self.engine.kill(id)
    }
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            let _ = self.engine.kill(&id);
        }
    }
}

/// Exec round trip: `true` through the agent of a live sandbox, against the agent's ping.
pub fn exec(engine: &Engine, runs: usize) -> Result<Report> {
    let sandbox = engine.create(BackendChoice::Exactly(BackendKind::Gvisor), None, &mut |_| {})?;
    let mut guard = Cleanup { engine, ids: vec![sandbox.id.clone()] };
    let mut conn = engine.connect(&sandbox.id)?;
    let spec = ExecSpec::new(Command::Argv(vec!["true".into()]));
    for _ in 0..5 {
        conn.ping().map_err(|e| Error::Backend(e.to_string()))?;
        conn.exec(spec.clone(), None).map_err(|e| Error::Backend(e.to_string()))?;
    }
    let (mut ping, mut exec, mut fresh) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let t = Instant::now();
        conn.ping().map_err(|e| Error::Backend(e.to_string()))?;
        ping.push(t.elapsed());
        let t = Instant::now();
        let out = conn.exec(spec.clone(), None).map_err(|e| Error::Backend(e.to_string()))?;
        exec.push(t.elapsed());
        if out.status.code != Some(0) {
            return Err(Error::Backend(format!("`true` exited with {:?}", out.status)));
        }
        let t = Instant::now();
        let mut c = engine.connect(&sandbox.id)?;
        c.exec(spec.clone(), None).map_err(|e| Error::Backend(e.to_string()))?;
        fresh.push(t.elapsed());
    }
    guard.ids.clear();
    engine.kill(&sandbox.id)?;
    let mut figures = BTreeMap::new();
    figures.insert("exec_true".to_string(), stats(&exec)?);
    figures.insert("exec_true_new_connection".to_string(), stats(&fresh)?);
    figures.insert("ref_ping".to_string(), stats(&ping)?);
    let ratio = figures["exec_true"].p50 / figures["ref_ping"].p50.max(1e-9);
    let summary = format!(
        "gvisor exec `true`: p50 {:.2} ms (ping {:.2} ms, {:.1}x), with a new connection {:.2} ms; {runs} runs",
        figures["exec_true"].p50, figures["ref_ping"].p50, ratio, figures["exec_true_new_connection"].p50
    );
    Ok(Report {
        bench: "exec".into(),
        backend: "gvisor".into(),
        method: "clock starts before the request is written to an open agent connection and stops when the \
                 exit code arrives; reference: the agent's ping on the same connection"
            .into(),
        inputs: serde_json::json!({"runs": runs, "command": ["true"]}),
        host: host_facts(engine),
        figures,
        ratios: BTreeMap::from([("exec_true/ref_ping".to_string(), ratio)]),
        summary,
    })
}

/// Longest the fork benchmark waits for restore shells to be ready.
const SHELL_WAIT: Duration = Duration::from_secs(60);

/// Fork of 1 and `wide` children from a sandbox whose Python process holds `mib` MiB, the
/// source's pause during each fork, and the raw-runsc floor of the wide fork.
pub fn fork(engine: &Engine, mib: u64, wide: usize, runs: usize) -> Result<Report> {
    let source = engine.create(BackendChoice::Exactly(BackendKind::Gvisor), None, &mut |_| {})?;
    let mut guard = Cleanup { engine, ids: vec![source.id.clone()] };
    let mut conn = engine.connect(&source.id)?;
    conn.spawn(memory_holder(mib)).map_err(|e| Error::Backend(e.to_string()))?;
    let probe = ExecSpec::new(Command::Argv(vec!["python3".into(), "-c".into(), PAUSE_PROBE.into()]));
    conn.spawn(probe).map_err(|e| Error::Backend(e.to_string()))?;
    let ready = Instant::now();
    while conn.stat("/tmp/holder-ready").is_err() {
        if ready.elapsed() > Duration::from_secs(60) {
            return Err(Error::Backend("the Python memory holder did not start".into()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut figures = BTreeMap::new();
    let mut idle = Vec::new();
    for _ in 0..runs {
        probe_gap(&mut conn)?;
        std::thread::sleep(Duration::from_secs(1));
        idle.push(probe_gap(&mut conn)?);
    }
    figures.insert("ref_probe_gap_idle_1s".to_string(), stats(&idle)?);
    let mut snapshot_bytes = 0;
    // The same data directory without restore shells: every child starts a sandbox process.
    let shell_less = Engine::open(Config { fork_shells: 0, ..engine.config().clone() })?;
    let (mut refill, mut shell_bytes, mut shells_used) = (Vec::new(), Vec::new(), 0);
    for n in [1, wide] {
        let (mut samples, mut pauses, mut cold, mut cold_pauses) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            if n == wide {
                // The refill from none: the shells a fork this wide would want.
                engine.end_shells(true);
                let t = Instant::now();
                engine.prepare_shells(&source.id, n, SHELL_WAIT)?;
                refill.push(t.elapsed());
            }
            // Shells ready, and nothing starting beside either fork.
            let ready = engine.prepare_shells(&source.id, n, SHELL_WAIT)?;
            shells_used = ready.len().min(n);
            shell_bytes.extend(ready.iter().filter_map(|(_, b)| *b));
            for (fork_engine, samples, pauses) in
                [(&shell_less, &mut cold, &mut cold_pauses), (engine, &mut samples, &mut pauses)]
            {
                probe_gap(&mut conn)?;
                let t = Instant::now();
                let outcome = fork_engine.fork(&source.id, n)?;
                let mut ok = 0;
                for c in outcome.children.iter().flatten() {
                    guard.ids.push(c.sandbox.id.clone());
                    engine.connect(&c.sandbox.id)?.ping().map_err(|e| Error::Backend(e.to_string()))?;
                    ok += 1;
                }
                samples.push(t.elapsed());
                pauses.push(probe_gap(&mut conn)?);
                snapshot_bytes = outcome.snapshot.size_bytes;
                if ok != n {
                    return Err(Error::Backend(format!("only {ok} of {n} children started")));
                }
                for id in guard.ids.split_off(1) {
                    engine.kill(&id)?;
                }
                engine.delete_snapshot(outcome.snapshot.id.as_str(), false)?;
            }
        }
        figures.insert(format!("fork_{n}"), stats(&samples)?);
        figures.insert(format!("fork_{n}_source_pause"), stats(&pauses)?);
        figures.insert(format!("fork_{n}_without_shells"), stats(&cold)?);
        figures.insert(format!("fork_{n}_without_shells_source_pause"), stats(&cold_pauses)?);
    }
    engine.end_shells(true);
    figures.insert(format!("shell_refill_{wide}"), stats(&refill)?);
    let mut snap_samples = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let snap = engine.checkpoint(&source.id, None)?;
        snap_samples.push(t.elapsed());
        engine.delete_snapshot(snap.id.as_str(), true)?;
    }
    figures.insert("ref_snapshot_in_place".to_string(), stats(&snap_samples)?);
    let (mut floor, mut floor_checkpoint, mut floor_restore) = (Vec::new(), Vec::new(), Vec::new());
    let dir = engine.sandbox_path(&source.id);
    for _ in 0..runs {
        let f = engine.gvisor().raw_fork_floor(&source.id, &dir, &dir.join("bench-floor"), wide)?;
        floor.push(f.total());
        floor_checkpoint.push(f.checkpoint);
        floor_restore.extend(f.restores);
    }
    figures.insert(format!("floor_raw_runsc_{wide}"), stats(&floor)?);
    figures.insert("floor_raw_runsc_checkpoint".to_string(), stats(&floor_checkpoint)?);
    figures.insert("floor_raw_runsc_restore".to_string(), stats(&floor_restore)?);
    drop(guard);
    let (f1, fw) = (figures["fork_1"].p50, figures[&format!("fork_{wide}")].p50);
    let raw = figures[&format!("floor_raw_runsc_{wide}")].p50;
    let pause = figures[&format!("fork_{wide}_source_pause")].p50;
    let (c1, cw) =
        (figures["fork_1_without_shells"].p50, figures[&format!("fork_{wide}_without_shells")].p50);
    let shell_mib = if shell_bytes.is_empty() {
        "not measured (no cgroup v1 memory counter)".to_string()
    } else {
        format!("{:.1} MiB", shell_bytes.iter().sum::<u64>() as f64 / shell_bytes.len() as f64 / 1048576.0)
    };
    let summary = format!(
        "gvisor fork with a {mib} MiB Python process, restore shells ready: 1 child {f1:.0} ms, {wide} children \
         {fw:.0} ms ({:.2}x the raw runsc floor of {raw:.0} ms: checkpoint + {wide} restores in a row); without \
         shells {c1:.0} ms and {cw:.0} ms ({:.2}x); source paused {pause:.0} ms (probe's idle gap {:.0} ms); \
         {wide} shells started from none in {:.0} ms, {shell_mib} each; snapshot in place {:.0} ms; image {:.1} MiB; \
         p50 of {runs} runs",
        fw / raw.max(1e-9),
        cw / raw.max(1e-9),
        figures["ref_probe_gap_idle_1s"].p50,
        figures[&format!("shell_refill_{wide}")].p50,
        figures["ref_snapshot_in_place"].p50,
        snapshot_bytes as f64 / 1048576.0
    );
    Ok(Report {
        bench: "fork".into(),
        backend: "gvisor".into(),
        method:
            "clock starts at the fork call and stops when every child's agent has answered a ping over a \
                 new connection; each run forks once without restore shells and then once with as many shells \
                 ready as children (started and waited for off the clock, nothing starting during either \
                 fork); the source's pause is the longest wall-clock gap a probe in the source \
                 (ticking every 5 ms) saw during the fork, next to its longest gap over an idle second; \
                 refill: starting the wide fork's shells with none left until all are ready; shell memory: \
                 its host memory cgroup's usage; floor: the same runsc work with nothing around it, \
                 `runsc checkpoint` of the source and one `runsc restore --detach` per child in a row (no \
                 shells); reference: an in-place snapshot of the source"
                .into(),
        inputs: serde_json::json!({"touched_mib": mib, "children": [1, wide], "runs": runs,
                                   "shells_ready_for_the_wide_fork": shells_used}),
        host: host_facts(engine),
        ratios: BTreeMap::from([
            (format!("fork_{wide}/fork_1"), fw / f1.max(1e-9)),
            (format!("fork_{wide}/floor_raw_runsc_{wide}"), fw / raw.max(1e-9)),
            (format!("fork_{wide}_without_shells/floor_raw_runsc_{wide}"), cw / raw.max(1e-9)),
        ]),
        figures,
        summary,
    })
}
