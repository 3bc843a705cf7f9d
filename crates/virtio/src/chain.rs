//! Descriptor chains as the guest wrote them, checked before a device touches them.
//!
//! virtio-queue walks the descriptor table and stops a chain after as many descriptors as the
//! queue has (so a loop ends), but it hands over whatever it found: a chain cut short by a
//! loop or by a `next` index past the queue, buffers outside guest memory, device-readable
//! buffers after device-writable ones. [`parse_chain`] turns a chain into two lists of
//! checked segments or says precisely what is wrong, under limits each device sets.

use std::ops::Deref;

use virtio_queue::DescriptorChain;
use vm_memory::{Bytes, GuestAddress, GuestMemory, Permissions};

/// Bounds a device sets on the chains it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainLimits {
    /// Most descriptors in one chain.
    pub max_descriptors: usize,
    /// Most bytes in the device-readable part.
    pub max_readable: u32,
    /// Most bytes in the device-writable part.
    pub max_writable: u32,
}

/// One buffer of a chain: `len` bytes at guest address `addr`, checked to lie in guest memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Guest-physical address of the buffer.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
}

/// Which part of a chain a check or copy concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Buffers the device reads (the driver's request).
    Readable,
    /// Buffers the device writes (the device's answer).
    Writable,
}

/// What is wrong with a chain. The device returns the chain to the guest with an error status
/// where it can and carries on with the next one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    /// The head descriptor could not be read or named an unusable indirect table.
    #[error("the chain has no usable descriptor")]
    Empty,
    /// The walk stopped while the last descriptor still said NEXT.
    #[error(
        "the chain does not end after {descriptors} descriptors: it loops or names a \
         descriptor outside the queue"
    )]
    Unterminated {
        /// Descriptors seen before the walk stopped.
        descriptors: usize,
    },
    /// More descriptors than the device accepts in one chain.
    #[error("the chain has more than {limit} descriptors, the most this device accepts")]
    TooManyDescriptors {
        /// The device's limit.
        limit: usize,
    },
    /// A device-readable descriptor after a device-writable one (the spec forbids it).
    #[error("descriptor {index} is device-readable but follows a device-writable one")]
    ReadableAfterWritable {
        /// Position of the descriptor in the chain.
        index: usize,
    },
    /// A buffer that is not entirely inside guest memory.
    #[error("buffer of {len} bytes at {addr:#x} is not inside guest memory")]
    OutOfMemory {
        /// The buffer's guest address.
        addr: u64,
        /// The buffer's length.
        len: u32,
    },
    /// The buffers of one direction add up to more than the device accepts.
    #[error("the {direction:?} buffers hold more than {limit} bytes, the most this device accepts")]
    TooLong {
        /// Which part is too long.
        direction: Direction,
        /// The device's limit.
        limit: u32,
    },
    /// A copy asked for bytes past the end of the chain's buffers of that direction.
    #[error("{len} bytes at offset {offset} are past the {total} bytes of the {direction:?} buffers")]
    Short {
        /// Which part was accessed.
        direction: Direction,
        /// Offset asked for.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// Bytes the chain has in that direction.
        total: u32,
    },
    /// Guest memory refused an access to a buffer that was checked earlier (the memory map
    /// changed under the device).
    #[error("guest memory refused an access at {addr:#x}")]
    Memory {
        /// The address of the refused access.
        addr: u64,
    },
}

/// A chain that passed [`parse_chain`]: its head index and its buffers, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedChain {
    head: u16,
    readable: Vec<Segment>,
    writable: Vec<Segment>,
    readable_len: u32,
    writable_len: u32,
}

/// Walks `chain` (read from guest memory `mem`) and checks every descriptor against `mem`
/// and `limits`.
pub fn parse_chain<G, M>(
    mem: &G,
    chain: DescriptorChain<M>,
    limits: ChainLimits,
) -> Result<ParsedChain, ChainError>
where
    G: GuestMemory + ?Sized,
    M: Deref,
    M::Target: GuestMemory,
{
    let mut parsed = ParsedChain {
        head: chain.head_index(),
        readable: Vec::new(),
        writable: Vec::new(),
        readable_len: 0,
        writable_len: 0,
    };
    let mut seen = 0usize;
    let mut last_has_next = false;
    let mut any_writable = false;
    for desc in chain {
        seen += 1;
        if seen > limits.max_descriptors {
            return Err(ChainError::TooManyDescriptors { limit: limits.max_descriptors });
        }
        last_has_next = desc.has_next();
        let seg = Segment { addr: desc.addr().0, len: desc.len() };
        let writable = desc.is_write_only();
        let perm = if writable { Permissions::Write } else { Permissions::Read };
        if seg.len > 0 && !mem.check_range(GuestAddress(seg.addr), seg.len as usize, perm) {
            return Err(ChainError::OutOfMemory { addr: seg.addr, len: seg.len });
        }
        let (list, total, limit, direction) = if writable {
            any_writable = true;
            (&mut parsed.writable, &mut parsed.writable_len, limits.max_writable, Direction::Writable)
        } else {
            if any_writable {
                return Err(ChainError::ReadableAfterWritable { index: seen - 1 });
            }
            (&mut parsed.readable, &mut parsed.readable_len, limits.max_readable, Direction::Readable)
        };
        *total = total
            .checked_add(seg.len)
            .filter(|t| *t <= limit)
            .ok_or(ChainError::TooLong { direction, limit })?;
        if seg.len > 0 {
            list.push(seg);
        }
    }
    if seen == 0 {
        return Err(ChainError::Empty);
    }
    if last_has_next {
        return Err(ChainError::Unterminated { descriptors: seen });
    }
    Ok(parsed)
}

impl ParsedChain {
    /// The index of the chain's head descriptor, which goes on the used ring.
    pub fn head(&self) -> u16 {
        self.head
    }

    /// Total bytes of the device-readable buffers.
    pub fn readable_len(&self) -> u32 {
        self.readable_len
    }

    /// Total bytes of the device-writable buffers.
    pub fn writable_len(&self) -> u32 {
        self.writable_len
    }

    /// Reads `buf.len()` bytes at `offset` of the device-readable buffers.
    pub fn read_at<G: GuestMemory + ?Sized>(
        &self,
        mem: &G,
        offset: u32,
        buf: &mut [u8],
    ) -> Result<(), ChainError> {
        walk(&self.readable, self.readable_len, Direction::Readable, offset, buf.len(), |addr, range| {
            mem.read_slice(&mut buf[range], addr)
        })
    }

    /// Writes `data` at `offset` of the device-writable buffers.
    pub fn write_at<G: GuestMemory + ?Sized>(
        &self,
        mem: &G,
        offset: u32,
        data: &[u8],
    ) -> Result<(), ChainError> {
        walk(&self.writable, self.writable_len, Direction::Writable, offset, data.len(), |addr, range| {
            mem.write_slice(&data[range], addr)
        })
    }
}

/// Splits the byte range `[offset, offset + len)` of `segs` (which hold `total` bytes) into
/// per-segment pieces and hands each to `copy` with its guest address and its range in the
/// caller's buffer.
fn walk(
    segs: &[Segment],
    total: u32,
    direction: Direction,
    offset: u32,
    len: usize,
    mut copy: impl FnMut(GuestAddress, std::ops::Range<usize>) -> Result<(), vm_memory::GuestMemoryError>,
) -> Result<(), ChainError> {
    let short = ChainError::Short { direction, offset: u64::from(offset), len: len as u64, total };
    if u64::from(offset) + len as u64 > u64::from(total) {
        return Err(short);
    }
    let mut skip = offset as usize;
    let mut done = 0usize;
    for seg in segs {
        if done == len {
            break;
        }
        let seg_len = seg.len as usize;
        if skip >= seg_len {
            skip -= seg_len;
            continue;
        }
        let n = (seg_len - skip).min(len - done);
        let addr = seg.addr + skip as u64;
        copy(GuestAddress(addr), done..done + n).map_err(|_| ChainError::Memory { addr })?;
        done += n;
        skip = 0;
    }
    if done == len {
        Ok(())
    } else {
        Err(short)
    }
}
