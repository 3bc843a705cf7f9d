//! Copy-on-write disks for branchbox sandboxes (docs/disk-layers.md), and the disk floor
//! under the block device: [`BlockBackend`], the storage a virtio-blk device reads and writes
//! in sectors of [`SECTOR_SIZE`] bytes, with [`OverlayBackend`] (a read-only base file under a
//! writable overlay file) as its simplest implementation.
//!
//! A disk is a chain: a read-only base (a raw ext4 file, as `branchbox guest disk` makes it),
//! immutable delta layers, and one writable top layer per sandbox, in 4 KiB clusters. A
//! [`Store`] holds layer files and chain manifests. Opening a chain builds one merged index
//! (cluster to layer and offset), so a block lookup is one array read at any depth.
//! [`LayeredBackend`] is the chain as a block device's storage (a [`BlockBackend`]), with
//! [`freeze`](LayeredBackend::freeze) (a snapshot's disk), [`rollback`](LayeredBackend::rollback),
//! and through the store, fork, remove, flatten and the garbage list. The top layer survives a SIGKILL at any instant (see `backend`).
//!
//! Layer files and manifests are untrusted input: [`format`] parses them with checked
//! sizes, offsets and checksums, and never panics.

mod backend;
mod block;
mod chain;
pub mod format;
mod layer;
mod manifest;
mod overlay;
mod store;

pub use backend::LayeredBackend;
pub use block::{BlockBackend, CLUSTER_SIZE, SECTOR_SIZE};
pub use chain::FrozenChain;
pub use format::FormatError;
pub use manifest::MAX_DEPTH;
pub use overlay::{BackendError, OverlayBackend};
pub use store::Store;

/// Why a layer, chain or store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    /// A file could not be read, written or created.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: String,
        /// The system's error.
        source: std::io::Error,
    },
    /// A layer file is not a valid layer.
    #[error(
        "layer {path} is not usable: {source}; remove the chains that use it, or restore it from a copy"
    )]
    Format {
        /// The file.
        path: String,
        /// What is wrong.
        source: FormatError,
    },
    /// A layer file has another id than the manifest names.
    #[error("layer {path} has id {found:016x}, the chain names {want:016x}: the file was replaced")]
    WrongId {
        /// The file.
        path: String,
        /// Its id.
        found: u64,
        /// The id the chain expects.
        want: u64,
    },
    /// A layer belongs to a disk of another size than its chain.
    #[error("layer {path} is for a {layer}-byte disk but the chain's disk is {chain} bytes: the layers of one chain must agree")]
    DiskSizeDisagrees {
        /// The file.
        path: String,
        /// The layer's disk size.
        layer: u64,
        /// The chain's disk size.
        chain: u64,
    },
    /// A layer file is shorter or longer than its index says.
    #[error(
        "layer {path} is {have} bytes; its index needs exactly {want}: the file is truncated or damaged"
    )]
    LayerSize {
        /// The file.
        path: String,
        /// Its size.
        have: u64,
        /// The size its index needs.
        want: u64,
    },
    /// The base disk is not whole clusters, too large, or not the chain's size.
    #[error(
        "base disk {path} is {size} bytes; the chain needs {chain} bytes, a non-zero multiple of \
         4096 of at most 64 GiB (pad it with truncate -s, or use the base the chain was made on)"
    )]
    BaseSize {
        /// The base file.
        path: String,
        /// Its size.
        size: u64,
        /// The size the chain records.
        chain: u64,
    },
    /// A chain manifest is not valid.
    #[error("chain manifest {path}: {reason}")]
    Manifest {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A chain name is not a plain name.
    #[error("chain name {name:?} must be 1 to 64 of A-Z, a-z, 0-9, '_' and '-'")]
    ChainName {
        /// The name given.
        name: String,
    },
    /// A chain of that name exists already.
    #[error("chain {name} exists already; remove it first or pick another name")]
    ChainExists {
        /// The name.
        name: String,
    },
    /// No chain of that name.
    #[error("no chain named {name} in this store")]
    NoChain {
        /// The name.
        name: String,
    },
    /// The chain is frozen (a snapshot) and has no top to write.
    #[error("chain {name} is frozen (it has no writable top); fork or roll back to it instead")]
    NoTop {
        /// The name.
        name: String,
    },
    /// The chain has a writable top where a frozen chain is needed.
    #[error("chain {name} has a writable top; freeze it and save the frozen chain instead")]
    HasTop {
        /// The name.
        name: String,
    },
    /// A process has the chain's top open.
    #[error("top layer {path} is open in another process or handle; close that disk first")]
    TopInUse {
        /// The top's file.
        path: String,
    },
    /// The layer is still part of a chain.
    #[error("layer {id} is still used by chains {chains:?}; remove or flatten those chains first")]
    LayerInUse {
        /// The layer's id.
        id: String,
        /// The chains that reference it.
        chains: Vec<String>,
    },
    /// Another delta would pass the depth limit.
    #[error("a chain of {depth} deltas is over the limit of {limit}; flatten it first")]
    TooDeep {
        /// The depth it would have.
        depth: usize,
        /// The limit.
        limit: usize,
    },
    /// A frozen chain from another store or of another disk.
    #[error("chain {name:?} cannot use that frozen chain: {reason}")]
    OtherChain {
        /// The chain.
        name: String,
        /// Why.
        reason: String,
    },
}
