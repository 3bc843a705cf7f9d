//! What the service does, below every surface that offers it: plain async functions that take
//! the shared state ([`crate::state::AppState`]) and typed, already-parsed arguments, and return
//! the service's typed results or its errors. The native API (`crate::api`), E2B's adapter
//! (`crate::e2b`), the console (`crate::ui`), warm pools (`crate::pool`) and the MCP tools all
//! call these, never one another's handlers, so a surface's signatures are its own and the
//! limits, the cap and the records are the same whichever surface a client uses.
//!
//! Not for: HTTP (routes, extractors, answers) or any one surface's wire shapes.

pub mod commands;
pub mod files;
pub mod lineage;
pub mod network;
pub mod sandboxes;
pub mod snapshots;
pub mod types;
