//! Setting up the sandbox from inside, once at boot: the limits the agent enforces on the
//! processes it starts, the workload cgroup that counts them, and `/etc/hostname`.
//!
//! Why inside: the host's cgroup around gVisor's runtime counts the runtime's own host tasks
//! and memory, not the guest's, so a limit there kills the whole sandbox instead of failing a
//! fork or killing one process. gVisor's own cgroupfs enforces `pids.max` for guest tasks
//! (fork fails with EAGAIN) but not `memory.limit_in_bytes`; memory is watched by [`crate::oom`].

use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::OnceLock;

/// Where the agent mounts gVisor's cgroupfs (a tmpfs holding one directory per controller,
/// as on a cgroup v1 host).
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// The cgroup every process the agent starts is placed in; the agent itself stays outside,
/// so it can still answer when the workloads are at their limit.
const WORKLOADS: &str = "/sys/fs/cgroup/pids/workloads";
/// Where commands go while the workloads are at their limit, so `ps` and `pkill` still run.
const RESERVE: &str = "/sys/fs/cgroup/pids/reserve";
/// Tasks the reserve allows (a shell pipeline to find and stop processes).
const RESERVE_PIDS: u32 = 16;
/// Room a new command needs in the workload cgroup (a shell and a pipeline); with less, it
/// goes to the reserve.
const ROOM: u32 = 4;

/// The limits the host asked for on the agent's command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Memory of the whole sandbox (processes and in-memory files), bytes.
    pub memory_bytes: u64,
    /// Guest tasks (processes and threads) the workloads may have at once.
    pub pids: u32,
}

/// Parses `--memory-mib N --pids N` (the bundle passes both or neither).
pub fn parse_args(args: &[String]) -> Result<Option<Limits>, String> {
    let (mut memory, mut pids) = (None, None);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let n: u64 = value.parse().map_err(|_| format!("{flag} {value:?} is not a number"))?;
        match flag.as_str() {
            "--memory-mib" => memory = Some(n.checked_mul(1024 * 1024).ok_or("--memory-mib is too large")?),
            "--pids" => pids = Some(u32::try_from(n).map_err(|_| "--pids is too large")?),
            _ => return Err(format!("unknown argument {flag:?}")),
        }
    }
    match (memory, pids) {
        (Some(memory_bytes), Some(pids)) => Ok(Some(Limits { memory_bytes, pids })),
        (None, None) => Ok(None),
        _ => Err("give both --memory-mib and --pids".into()),
    }
}

/// The workload and reserve cgroups, their `cgroup.procs` kept open so a child can join
/// before it runs.
struct Cgroups {
    workloads: OwnedFd,
    reserve: OwnedFd,
    limit: u32,
}

static CGROUPS: OnceLock<Cgroups> = OnceLock::new();

fn mount(source: &str, target: &str, fstype: &str, data: &str) -> std::io::Result<()> {
    let c = |s: &str| CString::new(s).map_err(std::io::Error::other);
    let (source, target, fstype, data) = (c(source)?, c(target)?, c(fstype)?, c(data)?);
    // SAFETY: valid NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(source.as_ptr(), target.as_ptr(), fstype.as_ptr(), libc::MS_NOSUID, data.as_ptr().cast())
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn cgroup(dir: &str, pids: u32) -> std::io::Result<OwnedFd> {
    std::fs::create_dir(dir)?;
    std::fs::write(format!("{dir}/pids.max"), pids.to_string())?;
    let procs = std::fs::OpenOptions::new().write(true).open(format!("{dir}/cgroup.procs"))?;
    Ok(procs.into())
}

/// Mounts cgroupfs and creates the workload cgroup with `pids.max = pids` and the reserve.
fn setup_cgroups(pids: u32) -> std::io::Result<Cgroups> {
    mount("cgroup", CGROUP_ROOT, "tmpfs", "mode=755")?;
    for controller in ["pids", "memory"] {
        let dir = format!("{CGROUP_ROOT}/{controller}");
        std::fs::create_dir(&dir)?;
        mount("cgroup", &dir, "cgroup", controller)?;
    }
    Ok(Cgroups { workloads: cgroup(WORKLOADS, pids)?, reserve: cgroup(RESERVE, RESERVE_PIDS)?, limit: pids })
}

fn workloads_full(limit: u32) -> bool {
    std::fs::read_to_string(format!("{WORKLOADS}/pids.current"))
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .is_some_and(|n| n.saturating_add(ROOM) > limit)
}

/// Makes `cmd`'s child join the workload cgroup (or the reserve, when the workloads are at
/// their limit) before it executes anything, so even its first fork counts.
pub fn confine(cmd: &mut Command) {
    let Some(cg) = CGROUPS.get() else { return };
    let fd = if workloads_full(cg.limit) { cg.reserve.as_raw_fd() } else { cg.workloads.as_raw_fd() };
    let join = move || {
        // Only async-signal-safe calls here: format the pid into a stack buffer.
        let mut buf = [0u8; 16];
        // SAFETY: getpid cannot fail.
        let mut pid = unsafe { libc::getpid() } as u32;
        let mut at = buf.len();
        loop {
            at -= 1;
            buf[at] = b'0' + (pid % 10) as u8;
            pid /= 10;
            if pid == 0 {
                break;
            }
        }
        let digits = &buf[at..];
        // SAFETY: writing a byte slice we own to a descriptor the agent keeps open.
        if unsafe { libc::write(fd, digits.as_ptr().cast(), digits.len()) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: the closure makes only async-signal-safe calls (getpid, write).
    unsafe { cmd.pre_exec(join) };
}

/// `/etc/hostname` as `hostname` reports it (the image was built on another host).
pub fn write_etc_hostname(name: &str) -> std::io::Result<()> {
    let mut f = std::fs::File::create("/etc/hostname")?;
    f.write_all(format!("{name}\n").as_bytes())
}

fn current_hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer and its length are valid.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return String::new();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Boot-time setup from the agent's arguments. Failures are reported on stderr (the shim's
/// log) and leave that limit unenforced inside; the host's cgroup remains as the backstop.
pub fn boot(args: &[String]) {
    let name = current_hostname();
    if !name.is_empty() {
        if let Err(e) = write_etc_hostname(&name) {
            eprintln!("branchbox-agent: cannot write /etc/hostname: {e}");
        }
    }
    let limits = match parse_args(args) {
        Ok(Some(l)) => l,
        Ok(None) => return,
        Err(e) => {
            eprintln!("branchbox-agent: bad arguments ({e}); limits are not enforced inside the sandbox");
            return;
        }
    };
    match setup_cgroups(limits.pids) {
        Ok(cg) => {
            let _ = CGROUPS.set(cg);
            crate::forkbomb::start(WORKLOADS, limits.pids);
        }
        Err(e) => eprintln!(
            "branchbox-agent: cannot set up the workload cgroup ({e}); the process limit is not enforced inside"
        ),
    }
    crate::oom::start(limits.memory_bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn limits_parse_from_the_bundle_arguments() {
        assert_eq!(
            parse_args(&args(&["--memory-mib", "512", "--pids", "64"])),
            Ok(Some(Limits { memory_bytes: 512 << 20, pids: 64 }))
        );
        assert_eq!(parse_args(&[]), Ok(None));
    }

    #[test]
    fn bad_arguments_are_refused() {
        assert!(parse_args(&args(&["--memory-mib", "512"])).is_err());
        assert!(parse_args(&args(&["--pids"])).is_err());
        assert!(parse_args(&args(&["--pids", "-1", "--memory-mib", "1"])).is_err());
        assert!(parse_args(&args(&["--memory-mib", "99999999999999999", "--pids", "1"])).is_err());
        assert!(parse_args(&args(&["--what", "1"])).is_err());
    }
}
