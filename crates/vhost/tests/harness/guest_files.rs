//! Where the guest kernel and root disk come from: the project's cached builds
//! (`branchbox guest kernel`, `branchbox guest disk`), or files named in the environment.

use std::path::PathBuf;

/// The guest's kernel and root filesystem.
pub struct GuestFiles {
    /// A bzImage with virtio-pci (QEMU's q35 machine boots it).
    pub bzimage: PathBuf,
    /// The ext4 root filesystem with the agent as /sbin/init.
    pub rootfs: PathBuf,
}

const BUILD: &str = "build them first: `branchbox guest kernel` and `branchbox guest disk` \
    (about 5 minutes on 2 cores, cached afterwards), or name existing files with \
    BRANCHBOX_GUEST_BZIMAGE and BRANCHBOX_GUEST_DISK";

fn from_env(var: &str) -> Option<PathBuf> {
    std::env::var_os(var).filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// The guest files; panics naming the command that builds them when they are missing. There
/// is no silent skip: CI builds them before running this test.
pub fn guest_files() -> GuestFiles {
    let bzimage = from_env("BRANCHBOX_GUEST_BZIMAGE");
    let rootfs = from_env("BRANCHBOX_GUEST_DISK");
    match (bzimage, rootfs) {
        (Some(bzimage), Some(rootfs)) if bzimage.is_file() && rootfs.is_file() => {
            GuestFiles { bzimage, rootfs }
        }
        (b, r) => {
            panic!("the guest kernel and root disk are not built (bzImage {b:?}, rootfs {r:?}); {BUILD}")
        }
    }
}
