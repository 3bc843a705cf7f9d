//! Where a block device's sectors live: [`BlockBackend`], the seam between a virtio-blk
//! device and its storage, and the units every backend counts in (sectors of
//! [`SECTOR_SIZE`] bytes for requests, clusters of [`CLUSTER_SIZE`] bytes for copy-on-write).
//!
//! The device only reads, writes and flushes whole sectors through the trait; the backends
//! are [`OverlayBackend`](crate::OverlayBackend) (base + overlay file) and
//! [`LayeredBackend`](crate::LayeredBackend) (a chain of layers).

use std::io;

/// Bytes in one sector, the unit of every block request.
pub const SECTOR_SIZE: u64 = 512;

/// Storage of a block device, addressed in sectors of [`SECTOR_SIZE`] bytes. Buffers passed
/// in are whole sectors; the device checks ranges against [`sectors`](Self::sectors) first.
pub trait BlockBackend: Send {
    /// The disk's size in sectors.
    fn sectors(&self) -> u64;
    /// Fills `buf` from `sector` on.
    fn read(&mut self, sector: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Stores `data` from `sector` on.
    fn write(&mut self, sector: u64, data: &[u8]) -> io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&mut self) -> io::Result<()>;
}

/// Granularity of the overlay's bookkeeping: the first write to a cluster copies the base's
/// cluster into the overlay, so a cluster is read wholly from one file or the other. It is
/// no larger than the allocation unit of the filesystems the overlay lives on (ext4, xfs,
/// btrfs, tmpfs), so which clusters were written can be found again from the overlay's
/// allocated extents when it is reopened.
pub const CLUSTER_SIZE: u64 = 4096;

/// The disk byte range `[offset, offset + len)` split at cluster boundaries: for each piece, its
/// cluster, its offset within that cluster, its offset within the request and its length. Every
/// cluster-granular backend (the overlay, the layered disks) walks requests with it.
pub(crate) fn cluster_pieces(offset: u64, len: usize) -> impl Iterator<Item = (u64, u64, usize, usize)> {
    let end = offset + len as u64;
    let mut pos = offset;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let cluster = pos / CLUSTER_SIZE;
        let stop = ((cluster + 1) * CLUSTER_SIZE).min(end);
        let piece = (cluster, pos % CLUSTER_SIZE, (pos - offset) as usize, (stop - pos) as usize);
        pos = stop;
        Some(piece)
    })
}
