//! The fork-bomb breaker: kills the process group that keeps creating processes while the
//! workloads are at their process limit.
//!
//! Why: inside the sandbox a fork bomb only meets EAGAIN at the limit, but under gVisor's
//! ptrace platform every new guest process costs the runtime host tasks that it keeps after
//! the process exits (measured: a bomb held at 64 guest processes took its runtime past 2,000
//! host tasks in under 2 s). Left alone, it reaches the host's backstop and the whole sandbox
//! ends. Processes that sit at the limit without churning (1,000 background `sleep`s) are
//! left alone; a workload that keeps starting short-lived processes while at its limit is
//! treated as a bomb, and its largest process group is killed.

use std::collections::BTreeMap;
use std::time::Duration;

/// A bomb under ptrace adds host tasks at about 15,000 a second (measured: 2,800 to 7,800 in
/// the first 250 ms), so the breaker must look often: a read of `pids.current` costs
/// microseconds.
const TICK: Duration = Duration::from_millis(10);
/// How often an idle sandbox looks (workloads under a quarter of their limit): every sandbox
/// runs a breaker, and under ptrace each look is a few traced syscalls, so idle ones look
/// five times less often; a bomb passes a quarter of its limit within one such look.
const IDLE_TICK: Duration = Duration::from_millis(50);
/// Ticks after the workloads came near their limit over which churn is counted.
const TICKS: usize = 5;

/// The highest pid in `/proc`: gVisor, like Linux, hands out pids in increasing order, so its
/// advance counts the processes created meanwhile.
fn highest_pid() -> i32 {
    std::fs::read_dir("/proc")
        .map(|d| d.flatten().filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok()).max().unwrap_or(0))
        .unwrap_or(0)
}

/// True when more processes were created in a window than there was room for at its start, by at least an eighth of the limit (and never fewer than 8): some
/// died and were replaced, which is churn at the limit. A workload that forks up to the limit
/// and stops (1,000 `sleep`s, a fork loop that meets EAGAIN) never gets there.
fn churning(created: i32, room_then: u32, limit: u32) -> bool {
    // Pid reuse after wrap-around shows as a negative advance: not evidence either way.
    created > 0 && created as u64 >= u64::from(room_then) + (u64::from(limit) / 8).max(8)
}

/// The process group with the most members among `pids`, and their count.
fn biggest_group(pids: &[i32]) -> Option<(i32, usize)> {
    let mut groups: BTreeMap<i32, usize> = BTreeMap::new();
    for pid in pids {
        // SAFETY: getpgid on any pid is harmless; it fails for one already gone.
        let pgid = unsafe { libc::getpgid(*pid) };
        if pgid > 1 {
            *groups.entry(pgid).or_default() += 1;
        }
    }
    groups.into_iter().max_by_key(|(_, n)| *n)
}

fn read_current(dir: &str) -> u32 {
    std::fs::read_to_string(format!("{dir}/pids.current"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Starts the breaker for the workload cgroup at `dir` with a limit of `limit` tasks.
pub fn start(dir: &'static str, limit: u32) {
    std::thread::spawn(move || {
        // Set while the workloads hold at least half their limit: ticks since the window
        // opened, the highest pid and the free room then.
        let mut armed: Option<(usize, i32, u32)> = None;
        let mut tick = IDLE_TICK;
        loop {
            std::thread::sleep(tick);
            let current = read_current(dir);
            tick = if current < limit / 4 { IDLE_TICK } else { TICK };
            if current < limit / 2 {
                armed = None;
                continue;
            }
            let top = highest_pid();
            let Some((ticks, first, room_then)) = armed else {
                armed = Some((0, top, limit.saturating_sub(current)));
                continue;
            };
            if !churning(top - first, room_then, limit) {
                armed = if ticks + 1 >= TICKS {
                    Some((0, top, limit.saturating_sub(current)))
                } else {
                    Some((ticks + 1, first, room_then))
                };
                continue;
            }
            armed = None;
            let procs = std::fs::read_to_string(format!("{dir}/cgroup.procs")).unwrap_or_default();
            let pids: Vec<i32> = procs.lines().filter_map(|l| l.trim().parse().ok()).collect();
            if let Some((pgid, n)) = biggest_group(&pids) {
                crate::exec::kill_group(pgid);
                eprintln!(
                    "branchbox-agent: process limit of {limit} reached while {} processes were created in \
                     {} ms: killed process group {pgid} ({n} processes), a fork bomb",
                    top - first,
                    TICK.as_millis() * (ticks as u128 + 1)
                );
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn churn_is_more_new_processes_than_there_was_room_for() {
        assert!(churning(64 + 10, 10, 512));
        assert!(!churning(63 + 10, 10, 512));
        assert!(churning(8, 0, 16));
        assert!(!churning(7, 0, 16));
        assert!(!churning(-30_000, 0, 512));
    }

    #[test]
    fn the_biggest_group_is_found_among_live_processes() {
        // SAFETY: getpgid/getpid of ourselves.
        let (me, group) = (std::process::id() as i32, unsafe { libc::getpgid(0) });
        assert_eq!(biggest_group(&[me, me]), (group > 1).then_some((group, 2)));
        assert_eq!(biggest_group(&[-5]), None);
    }
}
