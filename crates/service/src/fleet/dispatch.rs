//! The fleet's middleware: which of its paths a request takes. A listing answers for the whole
//! fleet ([`super::listing`]); a create this node has no room for goes to a peer
//! ([`super::spill`]); a request naming a sandbox a peer holds is forwarded to it
//! ([`super::forward`]); everything else is served here.

use super::forward::{to_owner, was_forwarded};
use super::{listing, spill, Fleet};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

/// The middleware (`serve.rs` puts it in front of every route).
pub async fn forward(State(fleet): State<Fleet>, req: Request, next: Next) -> Response {
    if let Some(plane) = listing::plane_of(req.method(), req.uri().path()) {
        return listing::list(fleet, plane, req, next).await;
    }
    if !fleet.enabled() || was_forwarded(req.headers()) {
        return next.run(req).await;
    }
    if let Some(plane) = spill::plane_of(req.method(), req.uri().path()) {
        return spill::create(fleet, plane, req, next).await;
    }
    to_owner(fleet, req, next).await
}
