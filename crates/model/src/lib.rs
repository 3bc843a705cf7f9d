//! branchbox's domain model: the words every other crate uses.
//!
//! This crate holds types and the [`Backend`] trait only; it performs no I/O of its own.
//! Backends (gvisor, microvm) implement the trait; `branchbox-core` composes them with the
//! store and the image builder.

pub mod bench;
