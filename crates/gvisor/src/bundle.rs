//! The OCI bundle of a sandbox: its image's rootfs read-only (writes land in gVisor's
//! in-memory overlay, which checkpoints capture with the processes), the agent as process 1,
//! no network or the guest network namespace made for it (docs/network.md), and the
//! sandbox's limits.
//!
//! Limits are enforced twice. Inside, the agent (given the limits on its command line) puts
//! every process it starts in a guest cgroup whose `pids.max` is the process limit and kills
//! the largest process when memory goes past the memory limit. Outside, the host cgroup of the
//! runtime is a backstop sized so it only fires when the runtime itself misbehaves: it counts
//! the runtime's own memory and host tasks, which the guest limits do not bound.

use branchbox_image::STATX_COMPAT_IN_IMAGE;
use branchbox_model::{Error, Limits, Result};
use serde_json::json;
use std::path::Path;

/// Where images install the agent.
pub const AGENT_PATH: &str = "/usr/local/bin/branchbox-agent";

/// Memory the runtime may use above the sandbox's limit before the host stops it: the
/// sentry's own heap and page tables (about 25 MiB idle; about 0.4 MiB more per guest process
/// under ptrace, 550 MiB with 1,000 processes measured) and what the agent's watcher lets
/// through between two looks.
pub fn host_memory_bytes(limits: &Limits) -> u64 {
    let limit = limits.memory_mib * 1024 * 1024;
    let per_process = u64::from(limits.pids) * 512 * 1024;
    limit + (limit / 4).max(256 << 20) + per_process
}

/// Host tasks (threads) the runtime may have: gVisor's ptrace platform uses one traced host
/// thread per guest address space and sentry thread that entered it, and keeps them pooled
/// after the guest process exits. Measured: 1,000 idle guest processes held about 14,500 host
/// tasks, an idle sandbox 30 to 400.
pub fn host_pids(limits: &Limits) -> u64 {
    u64::from(limits.pids) * HOST_TASKS_PER_PROCESS + HOST_TASKS_BASE
}

/// Host tasks counted per guest process (see [`host_pids`]).
pub const HOST_TASKS_PER_PROCESS: u64 = 16;
/// Host tasks of the runtime itself (sentry threads, gofer, stub processes; 30 to 400 seen
/// idle), with room for the tasks a fork bomb adds before the agent's breaker stops it (its
/// first burst took a `--pids 64` runtime to 3,212 host tasks at most, docs/limits.md).
pub const HOST_TASKS_BASE: u64 = 8192;

/// A networked sandbox's part of the bundle.
#[derive(Debug, Clone, Copy)]
pub struct Network<'a> {
    /// The guest network namespace runsc's netstack takes its interface from.
    pub netns: &'a Path,
    /// The resolver file to mount read-only at `/etc/resolv.conf` (naming the sandbox's DNS
    /// forwarder).
    pub resolv_conf: &'a Path,
}

/// Writes `config.json` into `bundle`.
pub fn write(
    bundle: &Path,
    rootfs: &Path,
    hostname: &str,
    limits: &Limits,
    cgroup: &str,
    network: Option<Network<'_>>,
) -> Result<()> {
    std::fs::create_dir_all(bundle).map_err(|e| Error::io(bundle, e))?;
    let caps = json!([
        "CAP_CHOWN",
        "CAP_DAC_OVERRIDE",
        "CAP_FOWNER",
        "CAP_FSETID",
        "CAP_KILL",
        "CAP_SETGID",
        "CAP_SETUID",
        "CAP_SETPCAP",
        "CAP_NET_BIND_SERVICE",
        "CAP_SYS_CHROOT",
        "CAP_MKNOD",
        "CAP_AUDIT_WRITE",
        "CAP_SETFCAP",
        "CAP_SYS_ADMIN",
        "CAP_SYS_TIME"
    ]);
    let mut mounts = json!([
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]},
        {"destination": "/run", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=755"]}
    ]);
    let mut netns = json!({"type": "network"});
    if let Some(net) = network {
        netns["path"] = json!(net.netns);
        if let Some(list) = mounts.as_array_mut() {
            list.push(json!({"destination": "/etc/resolv.conf", "type": "bind", "source": net.resolv_conf, "options": ["rbind", "ro"]}));
        }
    }
    let config = json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": [
                AGENT_PATH,
                "--memory-mib", limits.memory_mib.to_string(),
                "--pids", limits.pids.to_string()
            ],
            "env": [
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME=/root",
                "LANG=C.UTF-8",
                format!("LD_PRELOAD={STATX_COMPAT_IN_IMAGE}"),
                "PYTHONUNBUFFERED=1"
            ],
            "cwd": "/",
            "capabilities": {
                "bounding": caps, "effective": caps, "permitted": caps
            },
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 65536, "soft": 65536}],
            "noNewPrivileges": true
        },
        "root": {"path": rootfs, "readonly": false},
        "hostname": hostname,
        "mounts": mounts,
        "linux": {
            "namespaces": [
                {"type": "pid"}, netns, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}
            ],
            "cgroupsPath": cgroup,
            "resources": {
                "memory": {"limit": host_memory_bytes(limits)},
                "cpu": {"quota": i64::from(limits.cpus) * 100_000, "period": 100_000},
                "pids": {"limit": host_pids(limits)}
            }
        }
    });
    let path = bundle.join("config.json");
    let text = serde_json::to_vec_pretty(&config).map_err(|e| Error::Backend(e.to_string()))?;
    std::fs::write(&path, text).map_err(|e| Error::io(&path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_gets_the_limits_and_the_host_cgroup_the_backstop() {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits { memory_mib: 512, cpus: 1, pids: 64 };
        write(dir.path(), Path::new("/rootfs"), "bb-1", &limits, "/branchbox/x", None).unwrap();
        let spec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("config.json")).unwrap()).unwrap();
        assert_eq!(spec["process"]["args"], json!([AGENT_PATH, "--memory-mib", "512", "--pids", "64"]));
        let memory = spec["linux"]["resources"]["memory"]["limit"].as_u64().unwrap();
        let pids = spec["linux"]["resources"]["pids"]["limit"].as_u64().unwrap();
        assert!(memory >= (512 + 256) << 20, "no room for the runtime: {memory}");
        assert!(pids >= 64 * HOST_TASKS_PER_PROCESS, "no room for the runtime's host tasks: {pids}");
        assert_eq!(
            spec["linux"]["namespaces"][1],
            json!({"type": "network"}),
            "no network: a namespace of its own"
        );
    }

    #[test]
    fn a_networked_bundle_names_the_guest_namespace_and_mounts_the_resolver_file() {
        let dir = tempfile::tempdir().unwrap();
        let net = Network { netns: Path::new("/run/netns/bbg-0"), resolv_conf: Path::new("/d/resolv.conf") };
        write(dir.path(), Path::new("/rootfs"), "bb-1", &Limits::default(), "/branchbox/x", Some(net))
            .unwrap();
        let spec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("config.json")).unwrap()).unwrap();
        assert_eq!(spec["linux"]["namespaces"][1], json!({"type": "network", "path": "/run/netns/bbg-0"}));
        let mounts = spec["mounts"].as_array().unwrap();
        let resolv = mounts.iter().find(|m| m["destination"] == "/etc/resolv.conf").unwrap();
        assert_eq!(resolv["source"], "/d/resolv.conf");
        assert!(resolv["options"].as_array().unwrap().contains(&json!("ro")));
    }
}
