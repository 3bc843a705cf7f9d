//! The layer file format (docs/disk-layers.md), parsed as untrusted input: typed fields,
//! checked sizes and offsets, checksums, and no panic on any bytes.
//!
//! A layer file is a 4 KiB header, an index region of one 16-byte slot per cluster of the
//! disk, and a data region of 4 KiB clusters. Slot `i` describes data cluster `i`: which
//! cluster of the disk it holds. Slots are filled in order, so the valid slots are a prefix.

use std::collections::HashSet;

use crate::block::CLUSTER_SIZE;

/// First bytes of every layer file.
pub const MAGIC: [u8; 8] = *b"BBXDLAY\0";
/// The format version this crate writes and reads.
pub const VERSION: u32 = 1;
/// Bytes of the header; the index region starts here.
pub const HEADER_LEN: u64 = 4096;
/// Bytes of one index slot.
pub const ENTRY_LEN: u64 = 16;
/// The largest disk a layer may describe: the merged index of a chain is 8 bytes per cluster
/// of the disk (128 MiB at this size), shared by every top over the same frozen chain.
pub const MAX_DISK_SIZE: u64 = 64 << 30;
/// The tag of a filled slot; an empty slot is all zeros.
const ENTRY_FILLED: u32 = 1;

/// Why layer bytes are not a layer this crate accepts.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    /// Fewer bytes than the structure needs.
    #[error("{what} is {have} bytes, it needs {need}")]
    Short {
        /// The structure.
        what: &'static str,
        /// Bytes needed.
        need: u64,
        /// Bytes present.
        have: u64,
    },
    /// Not a branchbox layer file.
    #[error("not a branchbox disk layer (bad magic)")]
    Magic,
    /// A layer of another format version.
    #[error("layer format version {found}; this build reads version {VERSION}")]
    Version {
        /// The version in the file.
        found: u32,
    },
    /// The header's checksum does not match its bytes.
    #[error("the layer header's checksum does not match: the header is damaged")]
    HeaderChecksum,
    /// A field this version requires to be zero is not.
    #[error("the layer header's {field} is {value}, it must be 0 in version {VERSION}")]
    Reserved {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
    /// The disk size is zero, not whole clusters, or over the limit.
    #[error(
        "the layer's disk size {size} is not a non-zero multiple of {CLUSTER_SIZE} of at most \
         {MAX_DISK_SIZE} bytes"
    )]
    DiskSize {
        /// The size in the header.
        size: u64,
    },
    /// The layer id is zero.
    #[error("the layer's id is 0, which no layer has")]
    ZeroId,
    /// A slot the chain's manifest says is filled is empty or damaged.
    #[error(
        "index slot {slot} is empty or damaged, but the manifest says the layer holds {expected} clusters"
    )]
    MissingEntry {
        /// The slot.
        slot: u64,
        /// How many the manifest records.
        expected: u64,
    },
    /// Two slots hold the same cluster of the disk.
    #[error("index slots {first} and {second} both hold disk cluster {cluster}")]
    Duplicate {
        /// The disk cluster.
        cluster: u64,
        /// The earlier slot.
        first: u64,
        /// The later slot.
        second: u64,
    },
    /// The manifest records more clusters than the disk has.
    #[error("the manifest says the layer holds {expected} clusters; the disk has only {clusters}")]
    TooManyEntries {
        /// How many the manifest records.
        expected: u64,
        /// Clusters of the disk.
        clusters: u64,
    },
}

/// The header of a layer file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The disk's size in bytes, a multiple of [`CLUSTER_SIZE`].
    pub disk_size: u64,
    /// The layer's random id, also in the file name and the chain manifests.
    pub id: u64,
}

impl Header {
    /// Clusters of the disk (and slots of the index).
    pub fn clusters(&self) -> u64 {
        self.disk_size / CLUSTER_SIZE
    }

    /// Where data cluster 0 starts: after the header and the index, rounded up to a cluster.
    pub fn data_offset(&self) -> u64 {
        data_offset(self.disk_size)
    }

    /// The 4 KiB header as written to the file.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN as usize];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[16..24].copy_from_slice(&self.disk_size.to_le_bytes());
        b[24..32].copy_from_slice(&self.id.to_le_bytes());
        b[32..40].copy_from_slice(&HEADER_LEN.to_le_bytes());
        b[40..48].copy_from_slice(&self.data_offset().to_le_bytes());
        let crc = crc32fast::hash(&b[0..48]);
        b[48..52].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses and checks a header from the first bytes of a layer file.
    pub fn decode(bytes: &[u8]) -> Result<Header, FormatError> {
        let b = bytes.get(..HEADER_LEN as usize).ok_or(FormatError::Short {
            what: "the layer header",
            need: HEADER_LEN,
            have: bytes.len() as u64,
        })?;
        if b[0..8] != MAGIC {
            return Err(FormatError::Magic);
        }
        let version = u32_at(b, 8);
        if version != VERSION {
            return Err(FormatError::Version { found: version });
        }
        if crc32fast::hash(&b[0..48]) != u32_at(b, 48) {
            return Err(FormatError::HeaderChecksum);
        }
        let flags = u32_at(b, 12);
        if flags != 0 {
            return Err(FormatError::Reserved { field: "flags", value: flags.into() });
        }
        if let Some(i) = b[52..].iter().position(|&x| x != 0) {
            return Err(FormatError::Reserved {
                field: "padding after the checksum",
                value: (52 + i) as u64,
            });
        }
        let disk_size = u64_at(b, 16);
        if disk_size == 0 || disk_size % CLUSTER_SIZE != 0 || disk_size > MAX_DISK_SIZE {
            return Err(FormatError::DiskSize { size: disk_size });
        }
        let id = u64_at(b, 24);
        if id == 0 {
            return Err(FormatError::ZeroId);
        }
        let header = Header { disk_size, id };
        // Written by this version as fixed functions of the size; anything else is damage.
        if u64_at(b, 32) != HEADER_LEN {
            return Err(FormatError::Reserved { field: "index offset (must be 4096)", value: u64_at(b, 32) });
        }
        if u64_at(b, 40) != header.data_offset() {
            return Err(FormatError::Reserved { field: "data offset", value: u64_at(b, 40) });
        }
        Ok(header)
    }
}

/// Where data cluster 0 starts for a disk of `disk_size` bytes.
pub fn data_offset(disk_size: u64) -> u64 {
    let index = disk_size / CLUSTER_SIZE * ENTRY_LEN;
    HEADER_LEN + index.div_ceil(CLUSTER_SIZE) * CLUSTER_SIZE
}

/// File offset of index slot `slot`.
pub fn slot_offset(slot: u64) -> u64 {
    HEADER_LEN + slot * ENTRY_LEN
}

/// The bytes of slot `slot` of layer `id` holding disk cluster `cluster`. The checksum covers
/// the layer id and the slot number, so a slot copied from another place does not validate.
pub fn encode_entry(id: u64, slot: u64, cluster: u64) -> [u8; ENTRY_LEN as usize] {
    let mut e = [0u8; ENTRY_LEN as usize];
    e[0..8].copy_from_slice(&cluster.to_le_bytes());
    e[8..12].copy_from_slice(&ENTRY_FILLED.to_le_bytes());
    let crc = entry_crc(id, slot, &e[0..12]);
    e[12..16].copy_from_slice(&crc.to_le_bytes());
    e
}

fn entry_crc(id: u64, slot: u64, fields: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&id.to_le_bytes());
    h.update(&slot.to_le_bytes());
    h.update(fields);
    h.finalize()
}

/// The disk cluster slot `slot` holds, or `None` when the slot is empty, torn or damaged
/// (bad checksum, unknown tag, a cluster past the disk's end).
pub fn decode_entry(header: &Header, slot: u64, e: &[u8]) -> Option<u64> {
    let e = e.get(..ENTRY_LEN as usize)?;
    if u32_at(e, 8) != ENTRY_FILLED || entry_crc(header.id, slot, &e[0..12]) != u32_at(e, 12) {
        return None;
    }
    let cluster = u64_at(e, 0);
    (cluster < header.clusters()).then_some(cluster)
}

/// Reads a layer's index slot by slot, as the file's bytes arrive in pieces.
pub struct IndexReader {
    header: Header,
    expected: Option<u64>,
    seen: HashSet<u64>,
    clusters: Vec<u64>,
    done: bool,
}

impl IndexReader {
    /// A reader for `header`'s index. `expected`: for a frozen delta, how many slots the
    /// chain's manifest says are filled (all must be, and no more are read); for a top,
    /// `None`: the filled slots are the prefix before the first empty or damaged one.
    pub fn new(header: Header, expected: Option<u64>) -> Result<IndexReader, FormatError> {
        if let Some(n) = expected {
            if n > header.clusters() {
                return Err(FormatError::TooManyEntries { expected: n, clusters: header.clusters() });
            }
        }
        Ok(IndexReader {
            header,
            expected,
            seen: HashSet::new(),
            clusters: Vec::new(),
            done: expected == Some(0),
        })
    }

    /// How many slots the reader still wants (it stops at the limit or the first bad slot).
    pub fn wanted(&self) -> u64 {
        if self.done {
            return 0;
        }
        self.expected.unwrap_or(self.header.clusters()) - self.clusters.len() as u64
    }

    /// Feeds the next bytes of the index (whole slots; a trailing partial slot is ignored).
    /// Returns whether the reader wants more.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<bool, FormatError> {
        for e in bytes.chunks_exact(ENTRY_LEN as usize) {
            if self.wanted() == 0 {
                break;
            }
            let slot = self.clusters.len() as u64;
            match decode_entry(&self.header, slot, e) {
                Some(cluster) => {
                    if !self.seen.insert(cluster) {
                        let first = self.clusters.iter().position(|&c| c == cluster).unwrap_or(0) as u64;
                        return Err(FormatError::Duplicate { cluster, first, second: slot });
                    }
                    self.clusters.push(cluster);
                }
                None => {
                    if let Some(expected) = self.expected {
                        return Err(FormatError::MissingEntry { slot, expected });
                    }
                    self.done = true;
                }
            }
        }
        Ok(self.wanted() > 0)
    }

    /// The disk cluster of each filled slot, in slot order. For a delta, checks that every
    /// expected slot was read.
    pub fn finish(self) -> Result<Vec<u64>, FormatError> {
        if let Some(expected) = self.expected {
            let have = self.clusters.len() as u64;
            if have < expected {
                return Err(FormatError::MissingEntry { slot: have, expected });
            }
        }
        Ok(self.clusters)
    }
}

/// Parses a whole layer held in memory: the header, then the index (`expected` as in
/// [`IndexReader::new`]). Returns the header and the disk cluster of each filled slot.
pub fn parse_layer(bytes: &[u8], expected: Option<u64>) -> Result<(Header, Vec<u64>), FormatError> {
    let header = Header::decode(bytes)?;
    let mut reader = IndexReader::new(header, expected)?;
    let index = bytes.get(HEADER_LEN as usize..).unwrap_or_default();
    let index = &index[..index.len().min((header.data_offset() - HEADER_LEN) as usize)];
    reader.feed(index)?;
    Ok((header, reader.finish()?))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(clusters: &[u64]) -> Vec<u8> {
        let h = Header { disk_size: 64 * CLUSTER_SIZE, id: 7 };
        let mut b = h.encode();
        b.resize(h.data_offset() as usize, 0);
        for (slot, &c) in clusters.iter().enumerate() {
            let at = slot_offset(slot as u64) as usize;
            b[at..at + 16].copy_from_slice(&encode_entry(7, slot as u64, c));
        }
        b
    }

    #[test]
    fn a_written_layer_parses_back() {
        let (h, clusters) = parse_layer(&layer(&[5, 3, 63]), Some(3)).expect("parse");
        assert_eq!(h, Header { disk_size: 64 * CLUSTER_SIZE, id: 7 });
        assert_eq!(clusters, vec![5, 3, 63]);
        assert_eq!(parse_layer(&layer(&[5, 3, 63]), None).expect("parse").1, vec![5, 3, 63]);
    }

    #[test]
    fn a_top_stops_at_the_first_torn_slot_and_a_delta_refuses_it() {
        let mut b = layer(&[1, 2, 3]);
        b[slot_offset(1) as usize + 3] ^= 0x40;
        assert_eq!(parse_layer(&b, None).expect("parse").1, vec![1]);
        assert_eq!(parse_layer(&b, Some(3)), Err(FormatError::MissingEntry { slot: 1, expected: 3 }));
    }

    #[test]
    fn a_slot_from_another_layer_or_place_does_not_validate() {
        let h = Header { disk_size: 64 * CLUSTER_SIZE, id: 7 };
        assert_eq!(decode_entry(&h, 0, &encode_entry(8, 0, 1)), None);
        assert_eq!(decode_entry(&h, 1, &encode_entry(7, 0, 1)), None);
        assert_eq!(decode_entry(&h, 0, &encode_entry(7, 0, 64)), None, "past the disk's end");
    }

    #[test]
    fn damaged_headers_are_refused_with_their_reason() {
        let good = layer(&[]);
        assert!(matches!(Header::decode(&good[..100]), Err(FormatError::Short { .. })));
        let mut b = good.clone();
        b[0] = b'X';
        assert_eq!(Header::decode(&b), Err(FormatError::Magic));
        let mut b = good.clone();
        b[8] = 2;
        assert_eq!(Header::decode(&b), Err(FormatError::Version { found: 2 }));
        let mut b = good.clone();
        b[17] ^= 1;
        assert_eq!(Header::decode(&b), Err(FormatError::HeaderChecksum));
        let mut b = good;
        b[4000] = 1;
        assert!(matches!(Header::decode(&b), Err(FormatError::Reserved { .. })));
        let odd = Header { disk_size: 100, id: 1 }.encode();
        assert_eq!(Header::decode(&odd), Err(FormatError::DiskSize { size: 100 }));
        let huge = Header { disk_size: MAX_DISK_SIZE + CLUSTER_SIZE, id: 1 }.encode();
        assert!(matches!(Header::decode(&huge), Err(FormatError::DiskSize { .. })));
    }

    #[test]
    fn duplicates_and_impossible_counts_are_refused() {
        assert!(matches!(parse_layer(&layer(&[4, 4]), None), Err(FormatError::Duplicate { cluster: 4, .. })));
        assert!(matches!(parse_layer(&layer(&[]), Some(65)), Err(FormatError::TooManyEntries { .. })));
    }
}
