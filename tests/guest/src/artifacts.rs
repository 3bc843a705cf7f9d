//! Where the guest kernel and root disk come from: the project's cached builds, found with
//! `branchbox guest kernel|disk --print-path --cached` (which never build). `BRANCHBOX_IMAGES`
//! names the cache as for every branchbox command; `BRANCHBOX_KERNEL` names another kernel.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The guest's kernel and root filesystem.
pub struct GuestFiles {
    /// A bzImage with virtio-pci (QEMU's q35 machine boots it).
    pub bzimage: PathBuf,
    /// The cached ext4 root filesystem with the agent as /sbin/init: a read-only base.
    pub rootfs: PathBuf,
}

/// The directory of the workspace's binaries: this test runs from `<target>/debug/deps/`.
fn binaries() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    exe.parent().and_then(Path::parent).expect("the test runs from <target>/<profile>/deps").to_path_buf()
}

/// Runs `branchbox guest <what> --print-path --cached`; panics with its message on a miss.
fn cached(what: &str) -> PathBuf {
    let bin = binaries();
    let branchbox = bin.join("branchbox");
    assert!(
        branchbox.is_file(),
        "{} is missing: run `cargo build --workspace` first (the disk's recipe covers the agent it builds)",
        branchbox.display()
    );
    let mut cmd = Command::new(&branchbox);
    cmd.args(["guest", what, "--print-path", "--cached"]);
    if std::env::var_os("BRANCHBOX_AGENT").is_none() {
        cmd.env("BRANCHBOX_AGENT", bin.join("branchbox-agent"));
    }
    let out = cmd.output().expect("run branchbox guest");
    assert!(
        out.status.success(),
        "the guest {what} is not built; build it first with `branchbox guest {what}` \
         (BRANCHBOX_IMAGES={:?}; the kernel takes about 5 minutes on 2 cores, then it is cached): {}",
        std::env::var_os("BRANCHBOX_IMAGES"),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// The guest files; panics naming the command that builds them when they are not built.
/// There is no silent skip: CI builds them before running this test.
pub fn guest_files() -> GuestFiles {
    let kernel = cached("kernel");
    // The cache directory holds vmlinux and bzImage; BRANCHBOX_KERNEL names a file.
    let bzimage = if kernel.is_dir() { kernel.join("bzImage") } else { kernel };
    let rootfs = cached("disk");
    assert!(bzimage.is_file(), "no kernel at {}", bzimage.display());
    assert!(rootfs.is_file(), "no root disk at {}", rootfs.display());
    GuestFiles { bzimage, rootfs }
}
