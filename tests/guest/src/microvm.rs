//! The microvm backend over the cached guest: a backend and sandbox plans for the default
//! image, whose root disk the cache holds (shared by the backend tests on PVM and on hardware
//! KVM).

use crate::artifacts::{agent, images_dir, root_disk, vmlinux};
use branchbox_image::{image_id, Recipe};
use branchbox_microvm::{default_vmm_program, MicrovmBackend, MicrovmConfig};
use branchbox_model::{Limits, SandboxId, SandboxPlan};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The cached guest: its kernel, and the image cache holding its root disk.
pub struct CachedGuest {
    /// The `vmlinux`.
    pub kernel: PathBuf,
    /// The image cache.
    pub images: PathBuf,
    /// The agent the disk was built with.
    pub agent: PathBuf,
}

/// The cached kernel and disk, or why they are not there.
pub fn cached_guest() -> Result<CachedGuest, String> {
    let kernel = vmlinux()?;
    let images = images_dir(&root_disk()?)?;
    Ok(CachedGuest { kernel, images, agent: agent()? })
}

impl CachedGuest {
    /// A backend booting this guest, waiting up to `patience` for its agent.
    pub fn backend(&self, patience: Duration) -> MicrovmBackend {
        MicrovmBackend::new(MicrovmConfig {
            vmm: default_vmm_program(),
            kernel: self.kernel.clone(),
            images_dir: self.images.clone(),
            agent: self.agent.clone(),
            agent_timeout: patience,
        })
    }

    /// A plan for a sandbox of the default image (the one `guest disk` builds) in `dir`, with `memory_mib` of RAM.
    pub fn plan(&self, dir: &Path, memory_mib: u64) -> Result<SandboxPlan, String> {
        let image = image_id(&Recipe::standard(), &self.agent).map_err(|e| e.to_string())?;
        Ok(SandboxPlan {
            id: SandboxId::generate(),
            dir: dir.to_path_buf(),
            rootfs: self.images.join(image).join("rootfs"),
            limits: Limits { memory_mib, cpus: 1, pids: 512 },
            hostname: "bb-microvm-test".into(),
            network: None,
        })
    }
}

/// Whether process `pid` is still there (and not a zombie).
pub fn process_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}
