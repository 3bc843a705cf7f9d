//! What a rollback must do to guest RAM: for every page that can differ between what the
//! mapping shows now and the target chain, either drop its private copy (the mapping
//! already points at the right file page) or map the target's file page over it.
//!
//! The work is proportional to the pages dirtied since the mapping was last re-pointed
//! plus the delta pages of the two chains, never to RAM size.

use super::{Chain, PageSrc};

/// One step of re-pointing guest RAM, in guest pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemapOp {
    /// Drop private copies (`MADV_DONTNEED`): the mapping's file page is already right.
    Drop {
        /// First guest page.
        page: u64,
        /// Pages.
        len: u64,
    },
    /// Map `len` pages of target layer `layer` from `file_page` over guest page `page`.
    Map {
        /// First guest page.
        page: u64,
        /// Pages.
        len: u64,
        /// Index of the layer in the target chain.
        layer: u32,
        /// Page offset in that layer's file.
        file_page: u64,
    },
}

/// The operations that turn a RAM mapping showing `mapped` plus private copies of the
/// pages in `dirty` (sorted, unique) into one showing exactly `target`. Both chains must
/// share their base layer.
pub fn rollback_plan(mapped: &Chain, target: &Chain, dirty: &[u64]) -> Vec<RemapOp> {
    // Layer identity across chains is by file name; translate target indices once.
    let same_layer: Vec<Option<u32>> = target
        .layers()
        .iter()
        .map(|t| mapped.layers().iter().position(|m| m.name == t.name).map(|i| i as u32))
        .collect();
    let (mp, tp) = (&mapped.merged().pages, &target.merged().pages);
    let (mut i, mut j, mut k) = (0, 0, 0);
    let mut ops: Vec<RemapOp> = Vec::new();
    // Target source of the last page dropped: a drop run never spans two file pieces, so it
    // lies in one host mapping and can be moved out whole (`GuestRam::drop_pages`).
    let mut drop_src = None;
    loop {
        let next = [mp.get(i).map(|s| s.page), tp.get(j).map(|s| s.page), dirty.get(k).copied()]
            .into_iter()
            .flatten()
            .min();
        let Some(page) = next else { break };
        let m = take_if(mp, &mut i, page);
        let t = take_if(tp, &mut j, page);
        let d = dirty.get(k) == Some(&page);
        if d {
            k += 1;
        }
        let unchanged = match (m, t) {
            (None, None) => true,
            (Some(m), Some(t)) => {
                same_layer.get(t.layer as usize).copied().flatten() == Some(m.layer)
                    && m.file_page == t.file_page
            }
            _ => false,
        };
        let (layer, file_page) = t.map_or((0, page), |t| (t.layer, t.file_page));
        if unchanged {
            if d {
                push_drop(&mut ops, page, (layer, file_page), &mut drop_src);
            }
        } else {
            push_map(&mut ops, page, layer, file_page);
        }
    }
    ops
}

fn take_if(list: &[PageSrc], at: &mut usize, page: u64) -> Option<PageSrc> {
    let s = list.get(*at).filter(|s| s.page == page).copied();
    if s.is_some() {
        *at += 1;
    }
    s
}

fn push_drop(ops: &mut Vec<RemapOp>, page: u64, src: (u32, u64), last: &mut Option<(u32, u64)>) {
    let continues = matches!(*last, Some((l, f)) if l == src.0 && f + 1 == src.1);
    *last = Some(src);
    if let Some(RemapOp::Drop { page: p, len }) = ops.last_mut() {
        if *p + *len == page && continues {
            *len += 1;
            return;
        }
    }
    ops.push(RemapOp::Drop { page, len: 1 });
}

fn push_map(ops: &mut Vec<RemapOp>, page: u64, layer: u32, file_page: u64) {
    if let Some(RemapOp::Map { page: p, len, layer: l, file_page: f }) = ops.last_mut() {
        if *p + *len == page && *l == layer && *f + *len == file_page {
            *len += 1;
            return;
        }
    }
    ops.push(RemapOp::Map { page, len: 1, layer, file_page });
}
