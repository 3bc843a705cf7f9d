//! Every benchmark of `branchbox bench` (see `docs/benchmarks.md`), kept out of the library
//! crates they measure: each is a library call the CLI wraps and returns one
//! [`report::Report`] with the reference measured in the same run; nothing
//! here asserts a timing.
//!
//! - [`pool`]: `branchbox pool bench`, a warm pool of branchboxd measured through its API;
//! - [`report`]: the report every benchmark prints, and the distribution of one figure;
//! - [`sandbox`]: exec round trip and fork of real sandboxes through the engine;
//! - [`net`]: a networked sandbox's connects and transfers;
//! - [`soak`]: many sandboxes under random work, what they leave behind;
//! - [`travel`]: checkpoint, rollback, branch and chain on the engine's backends;
//! - [`vmm`]: the microVM monitor's fork, density, claim, checkpoint, rollback, branch and
//!   chain on its synthetic guest (no Linux guest, so they run where KVM does).

pub mod net;
pub mod pool;
pub mod report;
pub mod sandbox;
pub mod soak;
pub mod travel;
pub mod vmm;
