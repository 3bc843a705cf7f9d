//! The delta layer file: the guest pages one checkpoint changed, behind a page index.
//!
//! ```text
//! offset  size  field
//!      0     8  magic b"BBXDELT\0"
//!      8     4  format version, u32 LE (DELTA_VERSION)
//!     12     4  flags, must be 0
//!     16     8  guest RAM size in bytes, u64 LE
//!     24     8  page count n, u64 LE
//!     32     8  data offset: HEADER_LEN + 8n rounded up to a page, u64 LE
//!     40     8  layer id: random u64 the state file names the layer by, LE
//!     48     4  CRC-32 of the index bytes
//!     52     4  CRC-32 of the page data (n * 4096 bytes)
//!     56     4  CRC-32 of header bytes 0..56
//!     60     4  reserved, must be 0
//!     64    8n  index: guest page numbers, u64 LE, strictly increasing, each < RAM pages
//!      …     …  zero padding up to the data offset
//!   data  4096n page data, page i of the index at data offset + i * 4096
//! ```
//!
//! Page data is page-aligned so runs of it can be mapped `MAP_PRIVATE` straight over guest
//! RAM. Opening checks the header, the index and the file size (cheap: 8 bytes per page);
//! the page data's checksum is checked only on demand ([`verify_data`]), never on the
//! spawn path. `docs/microvm.md` is the spec page.

use crate::error::{Error, Result};
use crate::memory::PAGE_SIZE;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// First bytes of every delta layer.
pub const MAGIC: [u8; 8] = *b"BBXDELT\0";
/// The one delta format version this build reads and writes.
pub const DELTA_VERSION: u32 = 1;
/// Size of the fixed header.
pub const HEADER_LEN: usize = 64;
/// Bytes of the header the header checksum covers.
const HEADER_CRC_SPAN: usize = 56;

/// What a delta layer's header says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeltaHeader {
    /// Guest RAM size the layer belongs to.
    pub ram_size: u64,
    /// Pages the layer holds.
    pub pages: u64,
    /// File offset of the first page of data.
    pub data_off: u64,
    /// Random id the state file names this layer by.
    pub id: u64,
    /// CRC-32 of the index bytes.
    pub index_crc: u32,
    /// CRC-32 of the page data.
    pub data_crc: u32,
}

/// File offset of the page data for a layer of `pages` pages.
pub fn data_offset(pages: u64) -> u64 {
    let end = HEADER_LEN as u64 + 8 * pages;
    end.div_ceil(PAGE_SIZE as u64) * PAGE_SIZE as u64
}

/// The index bytes (page numbers, LE) followed by the zero padding up to the data.
pub fn index_bytes(pages: &[u64]) -> Vec<u8> {
    let len = data_offset(pages.len() as u64) as usize - HEADER_LEN;
    let mut out = Vec::with_capacity(len);
    for p in pages {
        out.extend_from_slice(&p.to_le_bytes());
    }
    out.resize(len, 0);
    out
}

/// Encodes a header; the header checksum is filled in by [`seal_header`] once the data's
/// checksum is known.
pub fn encode_header(h: &DeltaHeader) -> [u8; HEADER_LEN] {
    let mut b = [0u8; HEADER_LEN];
    b[0..8].copy_from_slice(&MAGIC);
    b[8..12].copy_from_slice(&DELTA_VERSION.to_le_bytes());
    b[16..24].copy_from_slice(&h.ram_size.to_le_bytes());
    b[24..32].copy_from_slice(&h.pages.to_le_bytes());
    b[32..40].copy_from_slice(&h.data_off.to_le_bytes());
    b[40..48].copy_from_slice(&h.id.to_le_bytes());
    b[48..52].copy_from_slice(&h.index_crc.to_le_bytes());
    seal_header(&mut b, h.data_crc);
    b
}

/// Stores the data checksum and the header checksum into an encoded header. Allocation
/// free: the checkpoint writer process calls it after `fork`.
pub fn seal_header(b: &mut [u8; HEADER_LEN], data_crc: u32) {
    b[52..56].copy_from_slice(&data_crc.to_le_bytes());
    let crc = crc32fast::hash(&b[..HEADER_CRC_SPAN]);
    b[56..60].copy_from_slice(&crc.to_le_bytes());
}

fn u32_at(b: &[u8; HEADER_LEN], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8; HEADER_LEN], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// A delta layer opened and checked: its header and its page index.
#[derive(Debug)]
pub struct OpenDelta {
    /// The header.
    pub header: DeltaHeader,
    /// Guest page numbers, strictly increasing; page i's data is at `data_off + i * 4096`.
    pub index: Vec<u64>,
}

/// Reads and checks the header and index of the delta layer `file` (named `path` in
/// errors) for a VM with `ram_size` bytes of RAM. The page data is not read.
pub fn open(path: &Path, file: &File, ram_size: u64) -> Result<OpenDelta> {
    let corrupt = |reason: String| Error::LayerCorrupt { path: path.to_path_buf(), reason };
    let found =
        file.metadata().map_err(|source| Error::LayerMissing { path: path.to_path_buf(), source })?.len();
    if found < HEADER_LEN as u64 {
        return Err(Error::LayerSize { path: path.to_path_buf(), found, expected: HEADER_LEN as u64 });
    }
    let mut b = [0u8; HEADER_LEN];
    file.read_exact_at(&mut b, 0)
        .map_err(|source| Error::LayerMissing { path: path.to_path_buf(), source })?;
    if b[0..8] != MAGIC {
        return Err(corrupt("it does not start with the delta layer magic".into()));
    }
    let crc = crc32fast::hash(&b[..HEADER_CRC_SPAN]);
    if u32_at(&b, 56) != crc {
        return Err(corrupt(format!("header checksum is {crc:#010x}, header says {:#010x}", u32_at(&b, 56))));
    }
    let version = u32_at(&b, 8);
    if version != DELTA_VERSION {
        return Err(corrupt(format!("delta format version {version}, this build reads {DELTA_VERSION}")));
    }
    if u32_at(&b, 12) != 0 || u32_at(&b, 60) != 0 {
        return Err(corrupt("unknown header flags".into()));
    }
    let header = DeltaHeader {
        ram_size: u64_at(&b, 16),
        pages: u64_at(&b, 24),
        data_off: u64_at(&b, 32),
        id: u64_at(&b, 40),
        index_crc: u32_at(&b, 48),
        data_crc: u32_at(&b, 52),
    };
    if header.ram_size != ram_size {
        return Err(corrupt(format!("layer is for {} bytes of RAM, the VM has {ram_size}", header.ram_size)));
    }
    let ram_pages = ram_size / PAGE_SIZE as u64;
    if header.pages > ram_pages {
        return Err(corrupt(format!("{} pages in a layer of a {ram_pages}-page RAM", header.pages)));
    }
    if header.data_off != data_offset(header.pages) {
        return Err(corrupt(format!("data offset {} does not follow the index", header.data_off)));
    }
    let expected = header.data_off + header.pages * PAGE_SIZE as u64;
    if found != expected {
        return Err(Error::LayerSize { path: path.to_path_buf(), found, expected });
    }
    let mut raw = vec![0u8; 8 * header.pages as usize];
    file.read_exact_at(&mut raw, HEADER_LEN as u64)
        .map_err(|source| Error::LayerMissing { path: path.to_path_buf(), source })?;
    if crc32fast::hash(&raw) != header.index_crc {
        return Err(corrupt("page index checksum mismatch".into()));
    }
    let index: Vec<u64> = raw
        .chunks_exact(8)
        .map(|c| c.iter().rev().fold(0u64, |acc, &byte| (acc << 8) | u64::from(byte)))
        .collect();
    let ordered = index.windows(2).all(|w| w[0] < w[1]);
    if !ordered || index.last().is_some_and(|&p| p >= ram_pages) {
        return Err(corrupt("page index is not strictly increasing inside guest RAM".into()));
    }
    Ok(OpenDelta { header, index })
}

/// Reads the whole page data and compares its checksum with the header's (on demand, off
/// the spawn path).
pub fn verify_data(path: &Path, file: &File, delta: &OpenDelta) -> Result<()> {
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 256 * PAGE_SIZE];
    let total = delta.header.pages * PAGE_SIZE as u64;
    let mut done = 0u64;
    while done < total {
        let n = buf.len().min((total - done) as usize);
        let chunk = &mut buf[..n];
        file.read_exact_at(chunk, delta.header.data_off + done)
            .map_err(|source| Error::LayerMissing { path: path.to_path_buf(), source })?;
        hasher.update(chunk);
        done += n as u64;
    }
    let crc = hasher.finalize();
    if crc != delta.header.data_crc {
        return Err(Error::LayerCorrupt {
            path: path.to_path_buf(),
            reason: format!("page data checksum is {crc:#010x}, header says {:#010x}", delta.header.data_crc),
        });
    }
    Ok(())
}
