//! The OCI bundle of a sandbox: its image's rootfs read-only (writes land in gVisor's
//! in-memory overlay, which checkpoints capture with the processes), the agent as process 1,
//! no network, and the sandbox's limits.

use branchbox_image::STATX_COMPAT_IN_IMAGE;
use branchbox_model::{Error, Limits, Result};
use serde_json::json;
use std::path::Path;

/// Where images install the agent.
pub const AGENT_PATH: &str = "/usr/local/bin/branchbox-agent";

/// Writes `config.json` into `bundle`.
pub fn write(bundle: &Path, rootfs: &Path, hostname: &str, limits: &Limits, cgroup: &str) -> Result<()> {
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
    let config = json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": [AGENT_PATH],
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
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]},
            {"destination": "/run", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=755"]}
        ],
        "linux": {
            "namespaces": [
                {"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}
            ],
            "cgroupsPath": cgroup,
            "resources": {
                "memory": {"limit": limits.memory_mib * 1024 * 1024},
                "cpu": {"quota": i64::from(limits.cpus) * 100_000, "period": 100_000},
                "pids": {"limit": limits.pids}
            }
        }
    });
    let path = bundle.join("config.json");
    let text = serde_json::to_vec_pretty(&config).map_err(|e| Error::Backend(e.to_string()))?;
    std::fs::write(&path, text).map_err(|e| Error::io(&path, e))
}
