//! Soak: a pool of gVisor sandboxes under a random mix of normal and hostile workloads, forks,
//! checkpoints, rollbacks and kills. It reports sandboxes lost that their own limits did not
//! end, processes and directories left behind, and this process's memory; it fails when any
//! sandbox was lost or anything leaked, so CI can run it short.

use crate::report::{Report, Stats};
use crate::sandbox::host_facts;
use branchbox_core::engine::{BackendChoice, Engine};
use branchbox_model::{BackendKind, Error, Limits, Result, SandboxId};
use branchbox_protocol::{Command, ExecSpec, ExitStatus};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// What a soak runs.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// Sandboxes alive at once.
    pub sandboxes: usize,
    /// How long to keep going.
    pub duration: Duration,
    /// Seed of the random mix (printed in the report, so a run can be repeated).
    pub seed: u64,
}

impl SoakOptions {
    /// The CI version: 4 sandboxes for 20 s.
    pub fn short(seed: u64) -> Self {
        SoakOptions { sandboxes: 4, duration: Duration::from_secs(20), seed }
    }
}

/// Small limits, so hostile workloads reach them fast.
const LIMITS: Limits = Limits { memory_mib: 256, cpus: 1, pids: 64 };

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Action {
    Normal,
    MemoryHog,
    ProcessFlood,
    ForkBomb,
    OutputFlood,
    DiskFiller,
    CheckpointRollback,
    Fork,
    Kill,
}

const ACTIONS: [Action; 9] = [
    Action::Normal,
    Action::MemoryHog,
    Action::ProcessFlood,
    Action::ForkBomb,
    Action::OutputFlood,
    Action::DiskFiller,
    Action::CheckpointRollback,
    Action::Fork,
    Action::Kill,
];

impl Action {
    fn name(self) -> &'static str {
        match self {
            Action::Normal => "normal",
            Action::MemoryHog => "memory_hog",
            Action::ProcessFlood => "process_flood",
            Action::ForkBomb => "fork_bomb",
            Action::OutputFlood => "output_flood",
            Action::DiskFiller => "disk_filler",
            Action::CheckpointRollback => "checkpoint_rollback",
            Action::Fork => "fork",
            Action::Kill => "kill",
        }
    }
}

fn shell(line: &str) -> ExecSpec {
    ExecSpec::new(Command::Shell(line.to_string()))
}

fn run(engine: &Engine, id: &SandboxId, spec: ExecSpec) -> Result<(ExitStatus, String)> {
    let mut out = Vec::new();
    let (status, _) = engine.exec(id, spec, None, &mut |_, chunk| out.extend_from_slice(chunk))?;
    Ok((status, String::from_utf8_lossy(&out).into_owned()))
}

fn expect(what: &str, ok: bool, detail: impl std::fmt::Debug) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::Backend(format!("{what} did not behave: {detail:?}")))
    }
}

/// Runs `action` on `id`; the sandbox must still answer afterwards unless it was killed.
fn act(engine: &Engine, id: &SandboxId, action: Action) -> Result<Option<SandboxId>> {
    match action {
        Action::Normal => {
            let (_, out) = run(engine, id, shell("python3 -c 'print(sum(range(1000)))'"))?;
            expect("a normal command", out.trim() == "499500", out)?;
        }
        Action::MemoryHog => {
            let (st, _) = run(engine, id, shell("python3 -c \"x = b'x' * (600 << 20)\""))?;
            expect("a memory hog", st.oom_killed, st)?;
        }
        Action::ProcessFlood => {
            let code = "import os, signal\nkids = []\ntry:\n    for _ in range(200):\n        pid = os.fork()\n        \
                        if pid == 0:\n            os.execvp('sleep', ['sleep', '60'])\n        kids.append(pid)\n\
                        except BlockingIOError:\n    print('EAGAIN')\nfor k in kids:\n    os.kill(k, signal.SIGKILL)\n\
                        for k in kids:\n    os.waitpid(k, 0)";
            let (_, out) = run(
                engine,
                id,
                ExecSpec::new(Command::Argv(vec!["python3".into(), "-c".into(), code.into()])),
            )?;
            expect("a process flood", out.trim() == "EAGAIN", out)?;
        }
        Action::ForkBomb => {
            let mut spec = shell("bomb() { bomb | bomb & }; bomb; sleep 2");
            spec.timeout_ms = Some(2000);
            run(engine, id, spec)?;
            // Host tasks a bomb leaves in the runtime stay until the sandbox ends: replace it.
            engine.kill(id)?;
            return Ok(Some(
                engine.create(BackendChoice::Exactly(BackendKind::Gvisor), Some(LIMITS), &mut |_| {})?.id,
            ));
        }
        Action::OutputFlood => {
            let mut spec = shell("head -c 50000000 /dev/zero");
            spec.output_cap = Some(1 << 20);
            let (st, out) = run(engine, id, spec)?;
            expect("an output flood", st.truncated && out.len() == 1 << 20, st)?;
        }
        Action::DiskFiller => {
            let (st, _) =
                run(engine, id, shell("dd if=/dev/zero of=/root/fill bs=1M count=600 2>/dev/null"))?;
            expect("a disk filler", st.oom_killed, st)?;
            let (st, _) = run(engine, id, shell("rm -f /root/fill"))?;
            expect("rm after a disk filler", st.code == Some(0), st)?;
        }
        Action::CheckpointRollback => {
            run(engine, id, shell("echo before > /root/mark"))?;
            let cp = engine.checkpoint(id, None)?;
            run(engine, id, shell("echo after > /root/mark"))?;
            engine.rollback(id, cp.id.as_str())?;
            let (_, out) = run(engine, id, shell("cat /root/mark"))?;
            expect("a rollback", out.trim() == "before", out)?;
        }
        Action::Fork => {
            let outcome = engine.fork(id, 1)?;
            let child =
                outcome.children.into_iter().next().ok_or_else(|| Error::Backend("no child".into()))??;
            // The pool keeps its size: the child replaces its source.
            engine.kill(id)?;
            return Ok(Some(child.sandbox.id));
        }
        Action::Kill => {
            engine.kill(id)?;
            return Ok(Some(
                engine.create(BackendChoice::Exactly(BackendKind::Gvisor), Some(LIMITS), &mut |_| {})?.id,
            ));
        }
    }
    let (_, out) = run(engine, id, shell("echo alive"))?;
    expect("the sandbox after it", out.trim() == "alive", out)?;
    Ok(None)
}

/// Why a sandbox's runtime ended, when the shim recorded one.
fn ended_reason(dir: &Path) -> Option<String> {
    let text = std::fs::read(dir.join(branchbox_gvisor::hostcg::ENDED_FILE)).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
    v["reason"].as_str().map(str::to_string)
}

fn own_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?.trim().parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// Host processes whose command line names one of `ids`.
fn leaked_processes(ids: &[SandboxId]) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else { return 0 };
    dir.flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|cmd| {
            let cmd = String::from_utf8_lossy(cmd);
            ids.iter().any(|id| cmd.contains(id.as_str()))
        })
        .count()
}

/// Directories of `ids` left: sandbox directories and host cgroups.
fn leaked_dirs(data_dir: &Path, ids: &[SandboxId]) -> usize {
    let mut n = ids.iter().filter(|id| data_dir.join("sandboxes").join(id.as_str()).exists()).count();
    for controller in ["memory", "pids"] {
        let base = Path::new("/sys/fs/cgroup").join(controller).join("branchbox");
        if let Ok(entries) = std::fs::read_dir(base) {
            n += entries
                .flatten()
                .filter(|e| {
                    let name = e.file_name();
                    let name = name.to_string_lossy();
                    ids.iter().any(|id| name.starts_with(id.as_str()))
                })
                .count();
        }
    }
    n
}

fn count(n: usize) -> Stats {
    Stats { unit: "count".into(), runs: 1, min: n as f64, p50: n as f64, p90: n as f64, max: n as f64 }
}

/// What the soak saw.
#[derive(Default)]
struct Tally {
    times: BTreeMap<String, Vec<Duration>>,
    lost: usize,
    by_limit: usize,
    errors: Vec<String>,
    rss: Vec<f64>,
}

/// Runs the soak.
pub fn soak(engine: &Engine, o: &SoakOptions) -> Result<Report> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(o.seed);
    let data_dir = engine.config().data_dir.clone();
    let create = || engine.create(BackendChoice::Exactly(BackendKind::Gvisor), Some(LIMITS), &mut |_| {});
    let mut pool: Vec<SandboxId> = Vec::new();
    let mut all: Vec<SandboxId> = Vec::new();
    let start = Instant::now();
    let result = (|| -> Result<Tally> {
        for _ in 0..o.sandboxes.max(1) {
            let id = create()?.id;
            all.push(id.clone());
            pool.push(id);
        }
        let mut t = Tally { rss: vec![own_rss_mib()], ..Tally::default() };
        while start.elapsed() < o.duration {
            let slot = rng.gen_range(0..pool.len());
            let action = ACTIONS[rng.gen_range(0..ACTIONS.len())];
            let id = pool[slot].clone();
            let began = Instant::now();
            match act(engine, &id, action) {
                Ok(replacement) => {
                    t.times.entry(action.name().to_string()).or_default().push(began.elapsed());
                    if let Some(new) = replacement {
                        all.push(new.clone());
                        pool[slot] = new;
                    }
                }
                Err(e) => {
                    match ended_reason(&data_dir.join("sandboxes").join(id.as_str())).as_deref() {
                        Some("memory_limit" | "process_limit") => t.by_limit += 1,
                        _ => {
                            t.lost += 1;
                            t.errors.push(format!("{} on {id}: {e}", action.name()));
                        }
                    }
                    let _ = engine.kill(&id);
                    let new = create()?.id;
                    all.push(new.clone());
                    pool[slot] = new;
                }
            }
            t.rss.push(own_rss_mib());
        }
        Ok(t)
    })();
    for id in &pool {
        let _ = engine.kill(id);
    }
    let Tally { times, lost, by_limit, errors, rss } = result?;
    let processes = leaked_processes(&all);
    let dirs = leaked_dirs(&data_dir, &all);
    let actions: usize = times.values().map(Vec::len).sum();
    let mut figures = BTreeMap::new();
    for (name, samples) in &times {
        if let Some(s) = Stats::from_durations(samples) {
            figures.insert(format!("action_{name}"), s);
        }
    }
    figures.insert("lost_not_by_own_limit".into(), count(lost));
    figures.insert("ended_by_own_limit".into(), count(by_limit));
    figures.insert("leaked_processes".into(), count(processes));
    figures.insert("leaked_directories".into(), count(dirs));
    if let Some(s) = Stats::from_samples("MiB", &rss) {
        figures.insert("soak_process_rss".into(), s);
    }
    let rss_first = rss.first().copied().unwrap_or(0.0);
    let rss_peak = rss.iter().copied().fold(0.0, f64::max);
    let summary = format!(
        "soak: {} sandboxes for {:.0} s, {actions} actions on {} sandboxes: {lost} lost not by their own limit, \
         {by_limit} ended by their own limit, {processes} processes and {dirs} directories leaked; RSS {rss_first:.1} \
         -> peak {rss_peak:.1} MiB (seed {})",
        o.sandboxes,
        start.elapsed().as_secs_f64(),
        all.len(),
        o.seed
    );
    if lost > 0 || processes > 0 || dirs > 0 {
        return Err(Error::Backend(format!("{summary}; {}", errors.join("; "))));
    }
    Ok(Report {
        bench: "soak".into(),
        backend: "gvisor".into(),
        method:
            "random actions on random sandboxes of a fixed-size pool; after each, the sandbox must answer \
                 `echo`; a sandbox that stops answering counts as ended by its own limit when its ended.json \
                 says so, lost otherwise; leaks are counted after every sandbox is killed"
                .into(),
        inputs: serde_json::json!({
            "sandboxes": o.sandboxes, "duration_s": o.duration.as_secs(), "seed": o.seed,
            "limits": {"memory_mib": LIMITS.memory_mib, "pids": LIMITS.pids},
        }),
        host: host_facts(engine),
        figures,
        ratios: BTreeMap::new(),
        summary,
    })
}
