//! The CPU cgroup a sandbox's resolver runs in, whichever process serves it (the gvisor
//! backend's shim, the microvm backend's VMM process): `cpu/branchbox/<id>-dns` under cgroup
//! v1, capped at a quarter of one core. What a guest's queries make the resolver do (threads,
//! upstream sockets, the `nft` updates of its allow-list set) is so bounded however hard the
//! guest asks, beside the sandbox's own limits (docs/network.md, "Name resolution"). It is not
//! the sandbox's own cgroup: runsc makes and removes that one per container generation, and
//! the resolver outlives generations.

use std::path::{Path, PathBuf};

/// Where cgroup v1 hierarchies are mounted.
const V1_ROOT: &str = "/sys/fs/cgroup";
/// The CPU a sandbox's resolver may use: [`QUOTA_US`] in every [`PERIOD_US`].
pub const QUOTA_US: u64 = 25_000;
/// The CFS period of the resolver's cgroup.
pub const PERIOD_US: u64 = 100_000;

/// The cgroup directory of sandbox `id`'s resolver.
pub fn dir(id: &str) -> PathBuf {
    Path::new(V1_ROOT).join("cpu").join("branchbox").join(format!("{id}-dns"))
}

/// Creates sandbox `id`'s resolver cgroup and moves the calling thread into it, so the threads
/// and processes it starts from now on run there too. `false` when this host has no cgroup v1
/// CPU controller (nothing is moved).
pub fn enter(id: &str) -> std::io::Result<bool> {
    if !Path::new(V1_ROOT).join("cpu/cpu.cfs_quota_us").is_file() {
        return Ok(false);
    }
    let d = dir(id);
    std::fs::create_dir_all(&d)?;
    std::fs::write(d.join("cpu.cfs_period_us"), PERIOD_US.to_string())?;
    std::fs::write(d.join("cpu.cfs_quota_us"), QUOTA_US.to_string())?;
    // SAFETY: gettid(2) takes nothing and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    std::fs::write(d.join("tasks"), tid.to_string())?;
    Ok(true)
}

/// Runs `start` on a thread that entered sandbox `id`'s resolver cgroup first, and returns what
/// it returned: the threads and processes it starts stay in the cgroup. A cgroup that cannot be
/// entered is reported on stderr (naming `who`) and `start` runs all the same.
pub fn start_inside<T: Send + 'static>(
    id: &str,
    who: &'static str,
    start: impl FnOnce() -> T + Send + 'static,
) -> std::thread::Result<T> {
    let id = id.to_string();
    std::thread::spawn(move || {
        if let Err(e) = enter(&id) {
            eprintln!("{who}: the resolver runs outside a CPU cgroup of its own: {e}");
        }
        start()
    })
    .join()
}

/// Removes sandbox `id`'s resolver cgroup once its last task has left (a killed process's
/// tasks leave within milliseconds).
pub fn remove(id: &str) {
    let d = dir(id);
    for _ in 0..100 {
        match std::fs::remove_dir(&d) {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            _ => break,
        }
    }
}
