//! The host cgroups around one container generation (the backstop of its limits), and why the
//! container ended when they fired.
//!
//! runsc removes the cgroups it creates as soon as its sandbox dies, taking the OOM and
//! fork-failure counters with them. A cgroup that exists before `runsc run` is joined as it is
//! and left in place, so the shim creates the memory and pids cgroups itself (cgroup v1, as on
//! this host), reads their counters once the container has ended, and removes them. On a
//! cgroup v2 host runsc keeps managing them and the reason stays unknown.

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
        let d = dir(controller, cid);
        for _ in 0..100 {
            match std::fs::remove_dir(&d) {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    std::thread::sleep(std::time::Duration::from_millis(20))
                }
                _ => break,
            }
        }
    }
}

/// Removes the cgroups of every generation of sandbox `id` (after a shim that could not clean
/// up, such as one killed).
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

    #[test]
    fn the_record_is_the_shape_the_engine_reads() {
        let d = tempfile::tempdir().unwrap();
        record(d.path(), &Ended { reason: "memory_limit", detail: "d".into() }).unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(d.path().join(ENDED_FILE)).unwrap()).unwrap();
        assert_eq!(v, serde_json::json!({"reason": "memory_limit", "detail": "d"}));
    }
}
