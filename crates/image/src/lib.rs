//! Sandbox images, built reproducibly and cached by the hash of their recipe, or imported.
//!
//! An image is built in two stages, each cached under the image directory:
//! 1. `base-<hash>`: a Debian root filesystem from debootstrap; the hash covers the recipe
//!    (suite, variant, packages). This is the slow stage (about a minute).
//! 2. `img-<hash>`: the base plus the agent at `/usr/local/bin/branchbox-agent`; the hash
//!    covers the base hash and the agent binary. Made by hard-linking the base tree (the
//!    rootfs is only ever mounted read-only) and copying the agent in: well under a second.
//!
//! Every stage is built in a temporary directory and renamed into place, so an interrupted
//! build never leaves a half-built image that looks complete.
//!
//! Linux guests (microVMs) boot the guest kernel (`kernel`, built from Debian's kernel source
//! with the fragments under `images/kernel/`) and an ext4 root disk made from an image's tree;
//! both are cached by recipe hash under `<images>/kernel/` and `<images>/disk/`.
//!
//! Images have names: `default` (minbase, python3, pip, venv, git, curl, Node.js and npm) and
//! `minimal` (minbase and python3) are recipes; others are imported from an OCI image layout or a
//! `docker save` tarball (`names`), unpacked as hostile input (`unpack`), and get the agent the
//! same way.
//!
//! Not for: running sandboxes or recording metadata.

mod build;
pub mod disk;
pub mod kconfig;
pub mod kernel;
mod lock;
mod names;
mod oci;
mod recipe;
mod tar_members;
mod unpack;

pub use build::{ensure_image, image_id, Image, STATX_COMPAT_IN_IMAGE};
pub use disk::{cached_disk, collect_disks, ensure_disk, Disk, DiskRecipe};
pub use kernel::{
    cached_kernel, ensure_kernel, external_kernel, Kernel, KernelRecipe, KernelSource, KERNEL_ENV,
};
pub use names::{
    image_names, images_of, import_image, imported_image, remove_image, resolve_image, tree_shared,
    ImportedImage, RemovedImage,
};
pub use oci::RunConfig;
pub use recipe::{Recipe, BUILTIN_IMAGES, DEFAULT_IMAGE, MINIMAL_IMAGE};
pub use unpack::ImportLimits;
