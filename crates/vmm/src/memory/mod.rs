//! A VM's guest memory: the RAM mapping and everything that decides what it maps.
//!
//! [`GuestRam`] (`ram.rs`) maps guest RAM copy-on-write over immutable memory layer files;
//! [`layers`] holds the chains of those layers (a base and deltas) with their merged page
//! index, the delta file format, the rollback re-mapping plan and the forked layer writer;
//! `dirty.rs` finds the pages written since a point (pagemap or KVM's dirty log); `lineage.rs`
//! is a VM's own record of the chain under its RAM and the chain its next checkpoint extends;
//! `reaper.rs` is the thread that frees the pages a rollback moved out of RAM; `page.rs` is
//! the page size they all count in.

pub(crate) mod dirty;
pub mod layers;
pub(crate) mod lineage;
mod page;
mod ram;
mod reaper;

pub use page::PAGE_SIZE;
pub(crate) use ram::{new_layer_name, sync_dir, write_atomic};
pub use ram::{GuestRam, MemoryState, MOVE_OUT_PAGES};
