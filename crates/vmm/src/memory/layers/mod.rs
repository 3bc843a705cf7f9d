//! Memory layer chains: a full base layer plus delta layers, and the merged page index that
//! makes mapping a chain cost the same at any depth.
//!
//! A snapshot's guest RAM is `layers[0]` (a raw image of all of RAM) overlaid by deltas,
//! oldest first ([`delta`] is the file format). [`Chain`] keeps, per snapshot, one merged
//! index: for every page some delta holds, the newest layer holding it and where its data
//! sits in that file, coalesced into runs. Mapping a chain is then one `mmap` of the base
//! plus one `MAP_FIXED` `mmap` per run, whatever the depth; the index is built once per
//! snapshot (when opened, or the first time a checkpoint is used), never per spawn.

pub mod delta;
pub(crate) mod plan;
pub(crate) mod writer;

use crate::error::{Error, Result};
use crate::memory::PAGE_SIZE;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// Most layers (base included) one snapshot may chain.
pub const MAX_LAYERS: usize = 256;

/// How a state file names one memory layer, and what ties that name to the file's content.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct LayerRef {
    /// File name inside the snapshot directory.
    pub name: String,
    /// Base image or delta.
    pub kind: LayerKind,
}

/// The two kinds of memory layer.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum LayerKind {
    /// A raw image of all of guest RAM (holes read as zero pages), with the CRC-32 of the
    /// whole image for on-demand verification.
    Base {
        /// CRC-32 of the RAM image.
        crc32: u32,
    },
    /// A delta layer; `id` must equal the id in its header.
    Delta {
        /// Random id written in the delta's header.
        id: u64,
    },
}

/// One opened layer file.
#[derive(Debug)]
pub struct OpenLayer {
    /// File name (relative to the snapshot directory).
    pub name: String,
    /// Where it was opened from (for errors and verification).
    pub path: PathBuf,
    /// The open file; kept open so children map it without opening anything.
    pub file: File,
    /// What the state file says about it.
    pub kind: LayerKind,
    /// For a delta: the file page where page data starts.
    pub data_page: u64,
}

/// Where the newest copy of one guest page lives: layer index in the chain, page in file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageSrc {
    /// Guest page number.
    pub page: u64,
    /// Index of the layer in [`Chain::layers`].
    pub layer: u32,
    /// Page offset inside that layer's file.
    pub file_page: u64,
}

/// Consecutive guest pages whose data is consecutive in one layer file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// First guest page.
    pub page: u64,
    /// Pages in the run.
    pub len: u64,
    /// Index of the layer in [`Chain::layers`].
    pub layer: u32,
    /// Page offset of the run's first page inside that file.
    pub file_page: u64,
}

/// The merged index of a chain: only pages some delta holds (the rest come from the base).
#[derive(Debug, Default)]
pub struct Merged {
    /// Newest source of each delta-held page, by guest page.
    pub pages: Vec<PageSrc>,
    /// The same, coalesced into mappable runs.
    pub runs: Vec<Run>,
}

/// The chain a checkpoint extends and the guest pages of its new delta, not merged yet.
type Pending = (Arc<Chain>, Arc<Vec<u64>>);

/// An opened chain of memory layers: base first, then deltas oldest first.
#[derive(Debug)]
pub struct Chain {
    size: u64,
    layers: Vec<Arc<OpenLayer>>,
    /// For a chain made by a checkpoint: the chain it extends and the new delta's pages,
    /// merged on first use (so the checkpoint's pause does not pay for it).
    pending: Mutex<Option<Pending>>,
    merged: OnceLock<Merged>,
}

impl Chain {
    /// A chain of just a base layer.
    pub fn base(size: u64, layer: Arc<OpenLayer>) -> Chain {
        let merged = OnceLock::new();
        let _ = merged.set(Merged::default());
        Chain { size, layers: vec![layer], pending: Mutex::new(None), merged }
    }

    /// `parent` extended by one delta holding `pages` (its index, strictly increasing).
    pub fn extend(parent: &Arc<Chain>, layer: Arc<OpenLayer>, pages: Arc<Vec<u64>>) -> Chain {
        let mut layers = parent.layers.clone();
        layers.push(layer);
        let pending = Mutex::new(Some((Arc::clone(parent), pages)));
        Chain { size: parent.size, layers, pending, merged: OnceLock::new() }
    }

    /// Opens the layers `refs` names inside `dir` for RAM of `size` bytes and builds the
    /// merged index (reads each delta's header and index, not its data).
    pub fn open(dir: &Path, refs: &[LayerRef], size: u64) -> Result<Chain> {
        let mut layers = Vec::with_capacity(refs.len());
        let mut merged = Vec::new();
        for (i, r) in refs.iter().enumerate() {
            let path = dir.join(&r.name);
            let file =
                File::open(&path).map_err(|source| Error::LayerMissing { path: path.clone(), source })?;
            let data_page = match r.kind {
                LayerKind::Base { .. } => {
                    let found = file
                        .metadata()
                        .map_err(|source| Error::LayerMissing { path: path.clone(), source })?
                        .len();
                    if found != size {
                        return Err(Error::LayerSize { path, found, expected: size });
                    }
                    0
                }
                LayerKind::Delta { id } => {
                    let d = delta::open(&path, &file, size)?;
                    if d.header.id != id {
                        return Err(Error::LayerCorrupt {
                            path,
                            reason: format!(
                                "layer id {:#x} is not the {id:#x} the snapshot names: the file was replaced",
                                d.header.id
                            ),
                        });
                    }
                    let data_page = d.header.data_off / PAGE_SIZE as u64;
                    merged = overlay(&merged, i as u32, data_page, &d.index);
                    data_page
                }
            };
            layers.push(Arc::new(OpenLayer { name: r.name.clone(), path, file, kind: r.kind, data_page }));
        }
        let chain = Chain { size, layers, pending: Mutex::new(None), merged: OnceLock::new() };
        let _ = chain.merged.set(Merged { runs: runs_of(&merged), pages: merged });
        Ok(chain)
    }

    /// RAM size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The layers, base first.
    pub fn layers(&self) -> &[Arc<OpenLayer>] {
        &self.layers
    }

    /// The base layer.
    pub fn base_layer(&self) -> &Arc<OpenLayer> {
        // A chain is built with its base and never loses it.
        &self.layers[0]
    }

    /// How the state file names these layers.
    pub fn refs(&self) -> Vec<LayerRef> {
        self.layers.iter().map(|l| LayerRef { name: l.name.clone(), kind: l.kind }).collect()
    }

    /// The merged index, built now if this chain came from a checkpoint and was not used yet.
    pub fn merged(&self) -> &Merged {
        self.merged.get_or_init(|| {
            let pending = self.pending.lock().unwrap_or_else(|e| e.into_inner()).take();
            match pending {
                Some((parent, pages)) => {
                    let top = (self.layers.len() - 1) as u32;
                    let data_page = self.layers[top as usize].data_page;
                    let pages = overlay(&parent.merged().pages, top, data_page, &pages);
                    Merged { runs: runs_of(&pages), pages }
                }
                None => Merged::default(),
            }
        })
    }

    /// Reads every layer in full and checks it against its checksum (on demand: this reads
    /// all of RAM).
    pub fn verify(&self) -> Result<()> {
        for layer in &self.layers {
            match layer.kind {
                LayerKind::Base { crc32 } => {
                    let crc = crc_of_file(&layer.file, self.size)
                        .map_err(|source| Error::LayerMissing { path: layer.path.clone(), source })?;
                    if crc != crc32 {
                        return Err(Error::LayerCorrupt {
                            path: layer.path.clone(),
                            reason: format!("image checksum is {crc:#010x}, the snapshot says {crc32:#010x}"),
                        });
                    }
                }
                LayerKind::Delta { .. } => {
                    let d = delta::open(&layer.path, &layer.file, self.size)?;
                    delta::verify_data(&layer.path, &layer.file, &d)?;
                }
            }
        }
        Ok(())
    }
}

/// `lower` with the pages of a delta (layer index `layer`, data at `data_page`, guest pages
/// `index`) laid over it: the delta's copy wins where both hold a page.
fn overlay(lower: &[PageSrc], layer: u32, data_page: u64, index: &[u64]) -> Vec<PageSrc> {
    let mut out = Vec::with_capacity(lower.len() + index.len());
    let mut lo = lower.iter().peekable();
    for (i, &page) in index.iter().enumerate() {
        while let Some(l) = lo.next_if(|l| l.page < page) {
            out.push(*l);
        }
        lo.next_if(|l| l.page == page);
        out.push(PageSrc { page, layer, file_page: data_page + i as u64 });
    }
    out.extend(lo);
    out
}

/// Coalesces page sources into runs of consecutive pages consecutive in one file.
fn runs_of(pages: &[PageSrc]) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for p in pages {
        match runs.last_mut() {
            Some(r)
                if r.layer == p.layer && r.page + r.len == p.page && r.file_page + r.len == p.file_page =>
            {
                r.len += 1;
            }
            _ => runs.push(Run { page: p.page, len: 1, layer: p.layer, file_page: p.file_page }),
        }
    }
    runs
}

/// CRC-32 of the first `size` bytes of `file` (a base layer), read in 1 MiB chunks.
fn crc_of_file(file: &File, size: u64) -> std::io::Result<u32> {
    let mut crc = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    while done < size {
        let n = buf.len().min((size - done) as usize);
        let chunk = &mut buf[..n];
        file.read_exact_at(chunk, done)?;
        crc.update(chunk);
        done += n as u64;
    }
    Ok(crc.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(page: u64, layer: u32, file_page: u64) -> PageSrc {
        PageSrc { page, layer, file_page }
    }

    #[test]
    fn newer_delta_wins_and_runs_coalesce() {
        let one = overlay(&[], 1, 1, &[2, 3, 4, 9]);
        let two = overlay(&one, 2, 1, &[3, 10]);
        assert_eq!(two, vec![src(2, 1, 1), src(3, 2, 1), src(4, 1, 3), src(9, 1, 4), src(10, 2, 2)]);
        let runs = runs_of(&overlay(&[], 1, 5, &[0, 1, 2, 7]));
        assert_eq!(
            runs,
            vec![
                Run { page: 0, len: 3, layer: 1, file_page: 5 },
                Run { page: 7, len: 1, layer: 1, file_page: 8 }
            ]
        );
    }
}
