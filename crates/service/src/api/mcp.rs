//! MCP over streamable HTTP at `/mcp`, behind the same token as every route: the tools of
//! `branchbox mcp` (crates/mcp, docs/mcp.md), with the sandboxes they start held to the
//! service's capacity limit and given its default timeout, as `POST /v1/sandboxes` does.

use crate::auth::Caller;
use crate::db::SandboxMeta;
use crate::ops::sandboxes::client_meta;
use crate::state::AppState;
use axum::Router;
use branchbox_core::Engine;
use branchbox_model::{now_ms, SandboxId};
use std::sync::Arc;

/// The service as the tools' host.
struct ServiceHost(AppState);

impl branchbox_mcp::Host for ServiceHost {
    fn admit(&self, engine: &Engine, n: usize) -> anyhow::Result<Box<dyn std::any::Any>> {
        Ok(Box::new(self.0.reserve(engine, n).map_err(|e| anyhow::anyhow!("{}", e.message))?))
    }

    fn started(&self, _: &Engine, id: &SandboxId) -> anyhow::Result<()> {
        let meta = client_meta(&self.0, Caller("mcp".into()), None, None, None, None)
            .map_err(|e| anyhow::anyhow!("{}", e.message))?;
        let meta = SandboxMeta { expires_ms: Some(now_ms() + meta.timeout_ms), ..meta };
        self.0.db().put(id, &meta).map_err(|e| anyhow::anyhow!("the service could not record {id}: {e}"))
    }

    fn killed(&self, _: &Engine, id: &SandboxId) {
        self.0.forget(id);
        if let Err(e) = self.0.db().remove(id.as_str()) {
            tracing::warn!("the record of {id}, killed through MCP, stays until the next reconcile: {e}");
        }
    }
}

/// The `/mcp` route; the caller adds authentication.
pub fn router(st: AppState) -> Router<AppState> {
    let service = branchbox_mcp::http_service(st.cfg.engine.clone(), Arc::new(ServiceHost(st)));
    Router::new().route_service("/mcp", service)
}
