//! The one error type of the crate: every failure says what broke and what to do next.

use std::path::PathBuf;

/// Everything that can go wrong while building, running, snapshotting or forking a VM.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `/dev/kvm` could not be opened.
    #[error(
        "cannot open /dev/kvm: {0}; run on a Linux host with KVM enabled and give this user \
         read/write access to /dev/kvm"
    )]
    KvmUnavailable(#[source] kvm_ioctls::Error),
    /// A KVM ioctl failed.
    #[error("KVM {op} failed: {source}")]
    Kvm {
        /// The operation that failed, as KVM names it.
        op: &'static str,
        /// The errno KVM returned.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// A host memory operation (mmap, madvise, file I/O on a layer) failed.
    #[error("guest memory: {op} failed: {source}")]
    Memory {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The machine configuration asks for something this VMM cannot build.
    #[error("invalid VM configuration: {0}")]
    Config(String),
    /// KVM refused some saved MSRs on restore.
    #[error(
        "KVM refused saved MSR {first_refused:#x} (after accepting {set} of {total}); \
         the snapshot was taken on a host whose KVM exposes different MSRs: restore it on the \
         same kind of host"
    )]
    MsrRestore {
        /// MSRs that KVM accepted.
        set: usize,
        /// MSRs in the snapshot.
        total: usize,
        /// Index of the first MSR KVM refused.
        first_refused: u32,
    },
    /// The guest stopped in a way the VMM cannot continue from.
    #[error("guest stopped: {0}")]
    Guest(String),
    /// The guest did not answer the way the test guest's protocol says.
    #[error("test guest protocol: {0}")]
    Protocol(String),
    /// A snapshot state file could not be read or written.
    #[error("snapshot {path}: {op} failed: {source}; check the path and its permissions")]
    SnapshotIo {
        /// The file involved.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The state file ends before the length its header declares.
    #[error(
        "snapshot {path} is truncated ({found} bytes, header needs {expected}); it was not \
         written completely: take the snapshot again"
    )]
    SnapshotTruncated {
        /// The state file.
        path: PathBuf,
        /// Bytes present.
        found: u64,
        /// Bytes the header declares.
        expected: u64,
    },
    /// The state file is damaged or not a snapshot at all.
    #[error("snapshot {path} is corrupt: {reason}; take the snapshot again")]
    SnapshotCorrupt {
        /// The state file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The state file was written by another snapshot format version.
    #[error(
        "snapshot {path} has format version {found}, this build writes version {supported} and reads {reads}; \
         restore it with the branchbox release that wrote it, or take a new snapshot"
    )]
    SnapshotVersion {
        /// The state file.
        path: PathBuf,
        /// Version in the file.
        found: u32,
        /// Version this build writes.
        supported: u32,
        /// The versions this build reads, in words.
        reads: String,
    },
    /// The memory layer named by a snapshot is not next to its state file.
    #[error(
        "memory layer {path} of this snapshot is missing: {source}; copy the whole snapshot \
         directory (state file and its layer files) together"
    )]
    LayerMissing {
        /// Where the layer was expected.
        path: PathBuf,
        /// The OS error from opening it.
        #[source]
        source: std::io::Error,
    },
    /// The memory layer exists but does not match what the state file says.
    #[error(
        "memory layer {path} is {found} bytes, the snapshot needs {expected}; the layer was \
         replaced or cut short: take the snapshot again"
    )]
    LayerSize {
        /// The layer file.
        path: PathBuf,
        /// Its size on disk.
        found: u64,
        /// Size the state file records.
        expected: u64,
    },
    /// A memory layer is damaged or is not the layer its snapshot names.
    #[error("memory layer {path} is corrupt: {reason}; take the snapshot again")]
    LayerCorrupt {
        /// The layer file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A checkpoint could not be completed or used.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// A part of the VM (a device, for one) refused the state a snapshot holds for it.
    #[error("{0}; restore the snapshot into a VM built like the one it was taken from")]
    Restore(#[from] branchbox_persist::RestoreError),
    /// A device could not be put on a bus.
    #[error("device bus: {0}")]
    Bus(#[from] branchbox_devices::BusError),
    /// A seccomp filter could not be built or installed on a VMM thread.
    #[error("seccomp filter for the {thread} thread: {reason}")]
    Seccomp {
        /// The kind of thread the filter is for.
        thread: &'static str,
        /// What failed.
        reason: String,
    },
    /// A VMM process (see `process`) failed or could not be reached.
    #[error("VMM process: {0}")]
    Process(String),
    /// A running vCPU thread panicked or could not be joined.
    #[error("vCPU thread failed: {0}")]
    Thread(String),
}

/// Shorthand for results of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Wraps a KVM ioctl error with the operation's name.
pub(crate) fn kvm(op: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
    move |source| Error::Kvm { op, source }
}

/// Wraps an OS error from a memory operation with the operation's name.
pub(crate) fn mem(op: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Memory { op, source }
}
