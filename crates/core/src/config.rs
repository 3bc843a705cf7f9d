//! Where things live and which executables to use, from the environment with defaults.

use branchbox_model::Limits;
use std::path::{Path, PathBuf};

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
    /// Limits of sandboxes created without explicit ones.
    pub limits: Limits,
}

/// Default Debian mirror.
pub const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";
/// Default most children per fork.
pub const DEFAULT_MAX_FORK: usize = 64;

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
            limits: Limits::default(),
            data_dir,
        }
    }
}
