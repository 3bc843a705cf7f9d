//! branchboxd: the branchbox service. One per host, owning one data directory, it puts the
//! engine (`branchbox-core`) behind an HTTP+JSON API with bearer-token authentication, size and
//! time limits, a cap on concurrent sandboxes, sandbox timeouts, an audit log and metrics. The
//! API is described by the OpenAPI document it serves at `/openapi.json`; `docs/service.md`
//! gives the overview.
//!
//! Not for: sandbox mechanics (the engine and its backends) or the agent protocol.

pub mod api;
pub mod auth;
pub mod backups;
pub mod caller;
pub mod config;
pub mod db;
pub mod e2b;
pub mod error;
pub mod extract;
pub mod fleet;
pub mod guard;
pub mod metrics;
pub mod middleware;
pub mod ops;
pub mod pool;
pub mod serve;
pub mod state;
pub mod streams;
pub mod ttl;
pub mod ui;
pub mod unread;

pub use config::ServiceConfig;
pub use state::AppState;
