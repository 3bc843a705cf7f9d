//! The page: the unit every memory layer, dirty log and mapping of guest RAM counts in.
//!
//! A module of its own, importing nothing, so that layers, memory and the dirty-page
//! tracking all depend on it rather than on one another.

/// Host page size assumed for accounting and sparse writes.
pub const PAGE_SIZE: usize = 4096;
