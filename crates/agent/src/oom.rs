//! The sandbox's memory limit, enforced from inside: a watcher that kills the largest guest
//! process when the sandbox's memory (processes and in-memory files, as gVisor accounts it)
//! goes past the limit, and remembers whose process group it hit so the command's result can
//! say so.
//!
//! Why a watcher: gVisor does not enforce a memory limit inside the sandbox, and the host's
//! memory cgroup kills the whole runtime. The host's limit sits above ours (see the gvisor
//! backend's bundle), so this watcher acts first.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How fast we assume a guest can allocate: the poll interval is the time this rate would
/// take to reach the limit (measured: about 450 MiB/s for one Python process on this host's
/// ptrace platform; four times that leaves room).
const FASTEST_GROWTH_BYTES_PER_SEC: u64 = 2 << 30;
const MIN_POLL: Duration = Duration::from_millis(5);
const MAX_POLL: Duration = Duration::from_millis(200);
/// Longest a kill may take to show in the usage before the next decision.
const SETTLE: Duration = Duration::from_secs(2);
/// Groups whose kills are remembered at once (exec and spawn register theirs).
const MAX_WATCHED: usize = 4096;

/// Process groups being watched, and whether one of their processes was OOM-killed.
static WATCHED: Mutex<BTreeMap<i32, bool>> = Mutex::new(BTreeMap::new());

fn watched() -> std::sync::MutexGuard<'static, BTreeMap<i32, bool>> {
    WATCHED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts remembering kills in process group `pgid` (a command the agent started).
pub fn watch(pgid: i32) {
    let mut w = watched();
    if w.len() < MAX_WATCHED {
        w.insert(pgid, false);
    }
}

/// Stops watching `pgid`; true when one of its processes was killed at the memory limit.
pub fn take(pgid: i32) -> bool {
    watched().remove(&pgid).unwrap_or(false)
}

fn note_kill(pgid: i32) {
    if let Some(hit) = watched().get_mut(&pgid) {
        *hit = true;
    }
}

/// Memory in use in the sandbox, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Usage {
    /// Everything: processes and files.
    used: u64,
    /// Held by in-memory files (the root overlay, tmpfs), which no kill frees.
    files: u64,
}

/// gVisor reports its memory accounting in `/proc/meminfo`: MemTotal is the runtime's
/// allowance, MemFree what is left of it, Shmem the in-memory files. MemFree lags a release
/// by 100 to 250 ms (measured) while AnonPages and Cached, which add up to the same use,
/// follow at once; the lower of the two is the usage, so a deleted file or a killed process
/// does not look like memory still held.
fn usage() -> Option<Usage> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_usage(&text)
}

fn parse_usage(meminfo: &str) -> Option<Usage> {
    let field = |name: &str| {
        meminfo.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix(':')?;
            rest.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()
        })
    };
    let accounted = field("MemTotal")?.saturating_sub(field("MemFree")?);
    let prompt = field("AnonPages").zip(field("Cached")).map(|(a, c)| a + c).unwrap_or(u64::MAX);
    Some(Usage { used: accounted.min(prompt) * 1024, files: field("Shmem").unwrap_or(0) * 1024 })
}

/// A guest process and its resident memory.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Candidate {
    pid: i32,
    rss: u64,
}

/// Resident bytes from `/proc/<pid>/statm` (pages).
fn parse_statm(text: &str) -> Option<u64> {
    let pages: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// The process holding the most memory, never the agent itself.
fn largest() -> Option<Candidate> {
    let me = std::process::id() as i32;
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != me && *pid != 1)
        .filter_map(|pid| {
            let rss = parse_statm(&std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?)?;
            Some(Candidate { pid, rss })
        })
        // An exiting process has no memory left to free.
        .filter(|c| c.rss > 0)
        .max_by_key(|c| c.rss)
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|s| s.trim().to_string()).unwrap_or_default()
}

fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// How long to sleep before the next look: the time the fastest allocation would take to go
/// from `used` to `trigger`.
fn poll_interval(used: u64, trigger: u64) -> Duration {
    let room = trigger.saturating_sub(used);
    let ms = room.saturating_mul(1000) / FASTEST_GROWTH_BYTES_PER_SEC;
    Duration::from_millis(ms).clamp(MIN_POLL, MAX_POLL)
}

/// Starts the watcher for a limit of `limit` bytes.
pub fn start(limit: u64) {
    std::thread::spawn(move || run(limit));
}

fn run(limit: u64) {
    // Memory that files (the in-memory root overlay, /tmp) hold cannot be freed by a kill.
    // When files fill the sandbox to within `slack` of its limit, a kill moves the trigger to
    // `slack` above the usage, so the user can still run `rm`; it returns to the limit once
    // usage is `slack` below it. A workload that keeps writing files is killed at each new
    // trigger, and the host's cgroup stops the sandbox in the end.
    let slack = (limit / 16).max(16 << 20);
    let mut trigger = limit;
    loop {
        let Some(now) = usage() else {
            std::thread::sleep(MAX_POLL);
            continue;
        };
        if now.used.saturating_add(slack) <= limit {
            trigger = limit;
        }
        if now.used > trigger {
            match largest() {
                Some(victim) => {
                    kill(&victim, now.used, limit);
                    let after = settle(victim.pid, limit, now);
                    if after.files + slack >= limit {
                        trigger = trigger.max(after.used.max(now.used) + slack);
                        eprintln!(
                            "branchbox-agent: files hold {} MiB of the memory limit of {} MiB; delete files \
                             to free memory",
                            after.files >> 20,
                            limit >> 20
                        );
                    }
                    continue;
                }
                None => trigger = now.used + slack,
            }
        }
        std::thread::sleep(poll_interval(now.used, trigger));
    }
}

fn kill(victim: &Candidate, used: u64, limit: u64) {
    // SAFETY: getpgid on any pid is harmless; it fails for a process already gone.
    let pgid = unsafe { libc::getpgid(victim.pid) };
    let name = comm(victim.pid);
    // SAFETY: kill(2) of a guest process; the agent is init and may signal any of them.
    unsafe { libc::kill(victim.pid, libc::SIGKILL) };
    if pgid > 0 {
        note_kill(pgid);
    }
    eprintln!(
        "branchbox-agent: memory limit of {} MiB reached ({} MiB in use): killed pid {} ({name}) holding \
         {} MiB",
        limit >> 20,
        used >> 20,
        victim.pid,
        victim.rss >> 20
    );
}

/// Waits until the victim is gone and its memory shows as released (gVisor's accounting lags
/// a release by up to about 200 ms); returns the usage then.
fn settle(pid: i32, limit: u64, before: Usage) -> Usage {
    let start = Instant::now();
    let mut now = before;
    while start.elapsed() < SETTLE {
        now = usage().unwrap_or(now);
        if now.used <= limit || (gone(pid) && start.elapsed() > Duration::from_millis(300)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    now
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_total_minus_free() {
        let text = "MemTotal:        1048576 kB\nMemFree:          524288 kB\nShmem: 1 kB\n";
        assert_eq!(parse_usage(text), Some(Usage { used: 512 << 20, files: 1024 }));
        let lagging = "MemTotal: 1048576 kB\nMemFree: 524288 kB\nAnonPages: 1024 kB\nCached: 1024 kB\n";
        assert_eq!(parse_usage(lagging), Some(Usage { used: 2 << 20, files: 0 }));
        assert_eq!(parse_usage("MemTotal: 1 kB\n"), None);
        assert_eq!(parse_usage("MemTotal: x kB\nMemFree: 1 kB\n"), None);
    }

    #[test]
    fn statm_gives_resident_bytes() {
        assert_eq!(parse_statm("1000 256 10 1 0 100 0\n"), Some(256 * 4096));
        assert_eq!(parse_statm("1000"), None);
    }

    #[test]
    fn polling_quickens_near_the_limit() {
        let limit = 1 << 30;
        assert_eq!(poll_interval(0, limit), MAX_POLL);
        assert_eq!(poll_interval(limit - (1 << 20), limit), MIN_POLL);
        assert_eq!(poll_interval(limit + 1, limit), MIN_POLL);
    }

    #[test]
    fn kills_are_remembered_only_for_watched_groups() {
        watch(4242);
        note_kill(4242);
        note_kill(4343);
        assert!(take(4242));
        assert!(!take(4242));
        assert!(!take(4343));
    }
}
