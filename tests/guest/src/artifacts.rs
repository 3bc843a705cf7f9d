//! Where the guest kernel and root disk come from: the project's cached builds, found with
//! `branchbox guest kernel|disk --print-path --cached` (which never build), so a test uses
//! exactly the artifacts of the current recipes. `BRANCHBOX_IMAGES` names the cache as for
//! every branchbox command; `BRANCHBOX_KERNEL` names another kernel (the CLI reports it as is).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The guest's kernel and root filesystem.
pub struct GuestFiles {
    /// A bzImage with virtio-pci (QEMU's q35 machine boots it).
    pub bzimage: PathBuf,
    /// The cached ext4 root filesystem with the agent as /sbin/init: a read-only base.
    pub rootfs: PathBuf,
}

/// The directory of the workspace's binaries: tests run from `<target>/<profile>/deps/`,
/// examples from `<target>/<profile>/examples/`.
fn binaries() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program's own path: {e}"))?;
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .ok_or_else(|| format!("{} is not under <target>/<profile>/", exe.display()))
}

/// Runs `branchbox guest <what> --print-path --cached`: the cached artifact's path, or why
/// there is none with the command that builds it.
fn cached(what: &str) -> Result<PathBuf, String> {
    let bin = binaries()?;
    let branchbox = bin.join("branchbox");
    if !branchbox.is_file() {
        return Err(format!(
            "{} is missing: run `cargo build --workspace` first (the disk's recipe covers the agent it builds)",
            branchbox.display()
        ));
    }
    let mut cmd = Command::new(&branchbox);
    cmd.args(["guest", what, "--print-path", "--cached"]);
    if std::env::var_os("BRANCHBOX_AGENT").is_none() {
        cmd.env("BRANCHBOX_AGENT", bin.join("branchbox-agent"));
    }
    let out = cmd.output().map_err(|e| format!("cannot run {}: {e}", branchbox.display()))?;
    if !out.status.success() {
        return Err(format!(
            "the guest {what} is not built; build it first with `branchbox guest {what}` \
             (BRANCHBOX_IMAGES={:?}; a cold kernel build takes about 10 minutes on 2 cores, then it \
             is cached): {}",
            std::env::var_os("BRANCHBOX_IMAGES"),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// One file of the cached kernel (`vmlinux` or `bzImage`), or the kernel `BRANCHBOX_KERNEL`
/// names.
fn kernel_file(name: &str) -> Result<PathBuf, String> {
    let kernel = cached("kernel")?;
    let file = if kernel.is_dir() { kernel.join(name) } else { kernel };
    if file.is_file() {
        Ok(file)
    } else {
        Err(format!("no kernel at {}", file.display()))
    }
}

/// The guest kernel as an ELF `vmlinux`, the form our VMM loads.
pub fn vmlinux() -> Result<PathBuf, String> {
    let file = kernel_file("vmlinux")?;
    let elf = std::fs::read(&file).map(|b| b.get(..4) == Some(b"\x7fELF")).unwrap_or(false);
    if elf {
        Ok(file)
    } else {
        Err(format!("{} is not a readable vmlinux (ELF); our VMM boots the ELF", file.display()))
    }
}

/// The cached root disk: a read-only base, never written by a test.
pub fn root_disk() -> Result<PathBuf, String> {
    let disk = cached("disk")?;
    if disk.is_file() {
        Ok(disk)
    } else {
        Err(format!("no root disk at {}", disk.display()))
    }
}

/// The agent the root disk was built with: `BRANCHBOX_AGENT`, or the workspace's build.
pub fn agent() -> Result<PathBuf, String> {
    match std::env::var_os("BRANCHBOX_AGENT") {
        Some(a) => Ok(PathBuf::from(a)),
        None => Ok(binaries()?.join("branchbox-agent")),
    }
}

/// The image cache the root disk lies in (`<images>/disk/<hash>/rootfs.ext4`).
pub fn images_dir(disk: &Path) -> Result<PathBuf, String> {
    disk.ancestors()
        .nth(3)
        .map(Path::to_path_buf)
        .ok_or_else(|| format!("{} is not <images>/disk/<hash>/rootfs.ext4", disk.display()))
}

/// The guest files QEMU boots; panics naming the command that builds them when they are not
/// built. There is no silent skip: CI builds them before running these tests.
pub fn guest_files() -> GuestFiles {
    let bzimage = kernel_file("bzImage").unwrap_or_else(|e| panic!("{e}"));
    let rootfs = root_disk().unwrap_or_else(|e| panic!("{e}"));
    GuestFiles { bzimage, rootfs }
}
