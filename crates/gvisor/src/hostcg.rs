//! The host cgroups around one container generation (the backstop of its limits), and why the
//! container ended when they fired.
//!
//! runsc removes the cgroups it creates as soon as its sandbox dies, taking the OOM and
//! fork-failure counters with them. A cgroup that exists before `runsc run` is joined as it is
//! and left in place, so the shim creates the memory and pids cgroups itself (cgroup v1, as on
//! this host), reads their counters once the container has ended, and removes them. On a
//! cgroup v2 host runsc keeps managing them and the reason stays unknown.
//!
//! The sandbox's resolver (its DNS forwarder, in the shim) runs in a CPU cgroup of its own
//! (`branchbox_net::resolver_cgroup`), removed here with the rest.

use serde::Serialize;
use std::path::{Path, PathBuf};

/// Where cgroup v1 hierarchies are mounted.
const V1_ROOT: &str = "/sys/fs/cgroup";
/// The file a dead sandbox's directory gets, read by the engine when it marks the sandbox lost.
pub const ENDED_FILE: &str = "ended.json";

/// Why a container ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Ended {
    /// `memory_limit`, `process_limit` or `agent_exited`.
    pub reason: &'static str,
    /// What happened, for people.
    pub detail: String,
}

fn dir(controller: &str, cid: &str) -> PathBuf {
    Path::new(V1_ROOT).join(controller).join("branchbox").join(cid)
}

fn v1() -> bool {
    Path::new(V1_ROOT).join("memory/memory.limit_in_bytes").is_file()
        && Path::new(V1_ROOT).join("pids").is_dir()
}

/// Creates the memory and pids cgroups of container `cid` with the bundle's limits.
pub fn prepare(cid: &str, spec: &serde_json::Value) -> std::io::Result<()> {
    if !v1() {
        return Ok(());
    }
    let resources = &spec["linux"]["resources"];
    let settings = [
        ("memory", "memory.limit_in_bytes", resources["memory"]["limit"].as_u64()),
        ("pids", "pids.max", resources["pids"]["limit"].as_u64()),
    ];
    for (controller, file, value) in settings {
        let Some(value) = value else { continue };
        let d = dir(controller, cid);
        std::fs::create_dir_all(&d)?;
        std::fs::write(d.join(file), value.to_string())?;
    }
    Ok(())
}

/// The host memory container `cid` uses now, as its memory cgroup counts it (cgroup v1 only;
/// `None` elsewhere or when it has none).
pub fn memory_bytes(cid: &str) -> Option<u64> {
    let text = std::fs::read_to_string(dir("memory", cid).join("memory.usage_in_bytes")).ok()?;
    text.trim().parse().ok()
}

/// The counter `key` in a cgroup file of `key value` lines.
fn counter(text: &str, key: &str) -> u64 {
    text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok()).unwrap_or(0)
}

/// Decides why a container ended from its cgroups' counters (`memory.oom_control`,
/// `pids.events`).
fn judge(cid: &str, oom_control: &str, pids_events: &str, memory_limit: &str, pids_max: &str) -> Ended {
    if counter(oom_control, "oom_kill") > 0 {
        return Ended {
            reason: "memory_limit",
            detail: format!(
                "the host's memory cgroup killed the sandbox's runtime ({cid}) at {} MiB: the sandbox's \
                 memory limit plus the runtime's allowance",
                memory_limit.trim().parse::<u64>().unwrap_or(0) >> 20
            ),
        };
    }
    if counter(pids_events, "max") > 0 {
        return Ended {
            reason: "process_limit",
            detail: format!(
                "the host's pids cgroup refused the sandbox's runtime ({cid}) a new task at {} host tasks, \
                 which the sandbox's process limit allows for",
                pids_max.trim()
            ),
        };
    }
    Ended {
        reason: "agent_exited",
        detail: format!(
            "the sandbox's agent or runtime ({cid}) exited; see shim.log in the sandbox directory"
        ),
    }
}

/// Why container `cid` ended, from its host cgroups (which must still exist).
pub fn verdict(cid: &str) -> Ended {
    let read = |controller: &str, file: &str| {
        std::fs::read_to_string(dir(controller, cid).join(file)).unwrap_or_default()
    };
    judge(
        cid,
        &read("memory", "memory.oom_control"),
        &read("pids", "pids.events"),
        &read("memory", "memory.limit_in_bytes"),
        &read("pids", "pids.max"),
    )
}

/// Writes `ended` to `<sandbox dir>/ended.json`.
pub fn record(sandbox_dir: &Path, ended: &Ended) -> std::io::Result<()> {
    let text = serde_json::to_vec(ended).map_err(std::io::Error::other)?;
    let tmp = sandbox_dir.join("ended.json.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(tmp, sandbox_dir.join(ENDED_FILE))
}

/// Removes the cgroups of container `cid`. They empty as the runtime's processes exit, which
/// takes a moment after `runsc kill`; a cgroup still busy after that is left for the next try.
pub fn remove(cid: &str) {
    for controller in ["memory", "pids"] {
        remove_dir_when_empty(&dir(controller, cid));
    }
}

fn remove_dir_when_empty(d: &Path) {
    for _ in 0..100 {
        match std::fs::remove_dir(d) {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            _ => break,
        }
    }
}

/// Removes the cgroups of every generation of sandbox `id` (after a shim that could not clean
/// up, such as one killed), and its resolver's.
/// Both controllers are listed: runsc deletes a memory cgroup of its own after an OOM kill,
/// and the pids cgroup of that generation must not be left behind.
pub fn remove_all(id: &str) {
    let prefix = format!("{id}-g");
    let mut cids = std::collections::BTreeSet::new();
    for controller in ["memory", "pids"] {
        let Ok(entries) = std::fs::read_dir(Path::new(V1_ROOT).join(controller).join("branchbox")) else {
            continue;
        };
        cids.extend(
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str().filter(|n| n.starts_with(&prefix)).map(String::from)),
        );
    }
    for cid in cids {
        remove(&cid);
    }
    branchbox_net::resolver_cgroup::remove(id);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oom_kill_means_the_memory_limit() {
        let e = judge(
            "x-g1",
            "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
            "max 0\n",
            "1610612736\n",
            "9216\n",
        );
        assert_eq!(e.reason, "memory_limit");
        assert!(e.detail.contains("1536 MiB"), "{}", e.detail);
    }

    #[test]
    fn a_refused_fork_means_the_process_limit() {
        let e = judge("x-g1", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n", "max 3\n", "1\n", "9216\n");
        assert_eq!(e.reason, "process_limit");
        assert!(e.detail.contains("9216"), "{}", e.detail);
    }

    #[test]
    fn no_counter_means_the_agent_exited() {
        assert_eq!(judge("x-g1", "", "", "", "").reason, "agent_exited");
        assert_eq!(judge("x-g1", "oom_kill 0\n", "max 0\n", "", "").reason, "agent_exited");
    }

    /// CPU seconds the calling thread has used.
    fn thread_cpu() -> f64 {
        let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime(2) fills `t`.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
        t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
    }

    #[test]
    fn the_resolvers_threads_and_processes_are_held_to_a_quarter_of_a_core() {
        if unsafe { libc::geteuid() } != 0 || !Path::new(V1_ROOT).join("cpu/cpu.cfs_quota_us").is_file() {
            eprintln!("skipped: needs root and the cgroup v1 CPU controller");
            return;
        }
        let id = format!("sbx-test{:012x}", std::process::id());
        let inside = id.clone();
        let (spent, child_cgroup) = std::thread::spawn(move || {
            assert!(branchbox_net::resolver_cgroup::enter(&inside).unwrap());
            let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
            let cgroup = std::fs::read_to_string(format!("/proc/{}/cgroup", child.id())).unwrap();
            let _ = child.kill();
            let _ = child.wait();
            // Spin for 2 s of wall time: a quarter of a core allows about 0.5 s of it.
            let (start, cpu) = (std::time::Instant::now(), thread_cpu());
            while start.elapsed() < std::time::Duration::from_secs(2) {
                std::hint::black_box(0u64);
            }
            (thread_cpu() - cpu, cgroup)
        })
        .join()
        .unwrap();
        remove_all(&id);
        eprintln!("a thread spinning for 2 s in the resolver's cgroup used {spent:.2} s of CPU");
        assert!(!branchbox_net::resolver_cgroup::dir(&id).exists(), "the resolver's cgroup is left");
        let want = format!("/branchbox/{id}-dns");
        assert!(
            child_cgroup.lines().any(|l| l.contains(":cpu") && l.ends_with(&want)),
            "a process the resolver started is outside its cgroup:\n{child_cgroup}"
        );
        assert!(spent < 1.0, "the resolver's thread used {spent:.2} s of CPU in 2 s");
    }

    #[test]
    fn the_record_is_the_shape_the_engine_reads() {
        let d = tempfile::tempdir().unwrap();
        record(d.path(), &Ended { reason: "memory_limit", detail: "d".into() }).unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(d.path().join(ENDED_FILE)).unwrap()).unwrap();
        assert_eq!(v, serde_json::json!({"reason": "memory_limit", "detail": "d"}));
    }
}
