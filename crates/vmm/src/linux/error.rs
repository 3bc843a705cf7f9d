//! Why a Linux VM could not be built or run.

use std::path::PathBuf;

/// Errors of the Linux VM builder and runner. What the guest does is never one of these:
/// a guest's failure is a [`RunEnd`](super::RunEnd).
#[derive(Debug, thiserror::Error)]
pub enum LinuxError {
    /// A boot structure could not be built or written.
    #[error(transparent)]
    Boot(#[from] branchbox_arch::Error),
    /// A KVM call failed.
    #[error("{op} failed: {error}")]
    Kvm { op: &'static str, error: kvm_ioctls::Error },
    /// Guest RAM could not be mapped.
    #[error("cannot map {bytes} bytes of guest RAM: {detail}")]
    Memory { bytes: u64, detail: String },
    /// A file the VM needs could not be created.
    #[error("cannot create {what} at {path}: {error}")]
    File { what: &'static str, path: PathBuf, error: std::io::Error },
    /// A device could not be put on a bus or wired to an interrupt.
    #[error("cannot attach {what}: {detail}")]
    Device { what: &'static str, detail: String },
    /// The configuration is not usable.
    #[error("{0}")]
    Config(String),
    /// A vCPU thread could not be started.
    #[error("cannot start the thread of vCPU {vcpu}: {error}")]
    Thread { vcpu: u8, error: std::io::Error },
    /// The engine's shared pieces (the KVM handle) failed.
    #[error(transparent)]
    Vmm(#[from] crate::error::Error),
}

/// Result of the Linux VM's operations.
pub type LinuxResult<T> = std::result::Result<T, LinuxError>;

/// Maps a KVM error to [`LinuxError::Kvm`] naming the call.
pub(super) fn kvm(op: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> LinuxError {
    move |error| LinuxError::Kvm { op, error }
}
