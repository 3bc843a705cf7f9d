//! Where things live and which executables to use, from the environment with defaults.

use branchbox_model::Limits;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Engine configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Metadata, sandbox runtime files and snapshots.
    pub data_dir: PathBuf,
    /// Image cache (defaults to `<data_dir>/images`).
    pub images_dir: PathBuf,
    /// The runsc executable.
    pub runsc: PathBuf,
    /// The agent binary installed into images.
    pub agent: PathBuf,
    /// The gVisor shim executable.
    pub shim: PathBuf,
    /// Debian mirror for image builds.
    pub mirror: String,
    /// Most children one fork may ask for.
    pub max_fork: usize,
    /// Most restore shells kept ready per kind of sandbox (image and limits); 0 turns them off
    /// (docs/architecture.md, "Restore shells").
    pub fork_shells: usize,
    /// How long a restore shell waits unclaimed before it ends itself.
    pub shell_idle: Duration,
    /// Limits of sandboxes created without explicit ones.
    pub limits: Limits,
}

/// Default Debian mirror.
pub const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";
/// Default most children per fork.
pub const DEFAULT_MAX_FORK: usize = 64;
/// Default most restore shells kept per kind of sandbox.
pub const DEFAULT_FORK_SHELLS: usize = 16;
/// Default idle limit of a restore shell.
pub const DEFAULT_SHELL_IDLE: Duration = Duration::from_secs(600);

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// A sibling of the running executable (where cargo puts every binary of the workspace).
fn sibling(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join(name)))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// The default data directory: `/var/lib/branchbox` for root, else under `$HOME`.
pub fn default_data_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/var/lib/branchbox");
    }
    match env_path("HOME") {
        Some(home) => home.join(".local/share/branchbox"),
        None => PathBuf::from("/tmp/branchbox"),
    }
}

impl Config {
    /// Configuration from `BRANCHBOX_*` variables, with `data_dir` overriding
    /// `BRANCHBOX_DATA` when given.
    pub fn from_env(data_dir: Option<&Path>) -> Config {
        let data_dir = data_dir
            .map(Path::to_path_buf)
            .or_else(|| env_path("BRANCHBOX_DATA"))
            .unwrap_or_else(default_data_dir);
        Config {
            images_dir: env_path("BRANCHBOX_IMAGES").unwrap_or_else(|| data_dir.join("images")),
            runsc: env_path("BRANCHBOX_RUNSC").unwrap_or_else(|| PathBuf::from("runsc")),
            agent: env_path("BRANCHBOX_AGENT").unwrap_or_else(|| sibling("branchbox-agent")),
            shim: env_path("BRANCHBOX_SHIM").unwrap_or_else(|| sibling("branchbox-shim")),
            mirror: std::env::var("BRANCHBOX_MIRROR").unwrap_or_else(|_| DEFAULT_MIRROR.to_string()),
            max_fork: std::env::var("BRANCHBOX_MAX_FORK")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(DEFAULT_MAX_FORK),
            fork_shells: std::env::var("BRANCHBOX_FORK_SHELLS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(DEFAULT_FORK_SHELLS),
            shell_idle: std::env::var("BRANCHBOX_SHELL_IDLE_S")
                .ok()
                .and_then(|v| v.parse().ok())
                .map_or(DEFAULT_SHELL_IDLE, Duration::from_secs),
            limits: Limits::default(),
            data_dir,
        }
    }
}
