//! The native HTTP API (`/v1`, `/healthz`, `/metrics`, `/openapi.json`; with the fleet's
//! snapshot push, pull and chunk routes), the port proxy and `/mcp`: their routes, their state
//! ([`ApiState`]) and the OpenAPI document generated from them. `crate::serve::router` puts
//! this surface beside E2B's and the console's.
//!
//! Routes are registered through `utoipa-axum`, so the OpenAPI document at `/openapi.json` is
//! built from the same handler list the router serves and cannot drift from it.

pub mod commands;
pub mod diff;
#[cfg(test)]
mod diff_timeline_tests;
pub mod files;
pub mod follow;
pub mod gc;
pub mod mcp;
pub mod network;
mod places;
pub mod pools;
pub mod proxy;
pub mod pty;
pub mod refs;
pub mod sandboxes;
pub mod snapshots;
pub mod system;
pub mod templates;
pub mod timeline;
pub mod udp;

use self::diff::FileCache;
use crate::error::ErrorBody;
use crate::middleware::{audit, authenticate, time_limit};
use crate::pool::Pools;
use crate::state::AppState;
use axum::extract::FromRef;
use axum::middleware::from_fn_with_state;
use axum::Router;
use std::sync::Arc;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::OpenApi as OpenApiDoc;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "branchbox",
        description = "Sandboxes for AI agents that fork, snapshot, checkpoint and roll back. \
                       Every route but /healthz needs `Authorization: Bearer <token>`; errors are \
                       `{\"error\": {\"code\", \"message\"}}` (docs/service.md lists the codes)."
    ),
    components(schemas(ErrorBody)),
    modifiers(&Security)
)]
struct ApiDoc;

struct Security;

impl utoipa::Modify for Security {
    fn modify(&self, api: &mut OpenApiDoc) {
        let comps = api.components.get_or_insert_with(Default::default);
        comps.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The native API's state: the shared state, warm pools' run-time state (their handlers and
/// the metrics read it) and the cache of snapshot files for text diffs. Handlers take the
/// part they need (`State<AppState>`, `State<Arc<Pools>>`, `State<Arc<FileCache>>`).
#[derive(Clone)]
pub struct ApiState {
    /// The shared state.
    pub app: AppState,
    /// Warm pools at run time (their definitions are in the database); the refill loop holds
    /// the same.
    pub pools: Arc<Pools>,
    /// File contents read from snapshots for text diffs (bounded).
    pub files: Arc<FileCache>,
}

impl FromRef<ApiState> for AppState {
    fn from_ref(s: &ApiState) -> AppState {
        s.app.clone()
    }
}

impl FromRef<ApiState> for Arc<Pools> {
    fn from_ref(s: &ApiState) -> Arc<Pools> {
        s.pools.clone()
    }
}

impl FromRef<ApiState> for Arc<FileCache> {
    fn from_ref(s: &ApiState) -> Arc<FileCache> {
        s.files.clone()
    }
}

/// The native API's routes with their state, authentication, audit and time limit, the port
/// proxy and `/mcp`, and the OpenAPI document.
pub fn router(state: ApiState) -> (Router, OpenApiDoc) {
    let st = state.app.clone();
    // Operations bounded by the request time limit (everything but commands and file streams,
    // which carry their own limits).
    let control = OpenApiRouter::new()
        .routes(routes!(sandboxes::create, sandboxes::list))
        .routes(routes!(sandboxes::get, sandboxes::kill))
        .routes(routes!(sandboxes::pause))
        .routes(routes!(sandboxes::connect))
        .routes(routes!(sandboxes::set_timeout))
        .routes(routes!(sandboxes::set_history))
        .routes(routes!(timeline::timeline))
        .routes(routes!(sandboxes::fork))
        .routes(routes!(network::get, network::set))
        .routes(routes!(network::host))
        .routes(routes!(snapshots::take))
        .routes(routes!(snapshots::checkpoint, snapshots::checkpoints))
        .routes(routes!(snapshots::rollback))
        .routes(routes!(snapshots::list))
        .routes(routes!(snapshots::get, snapshots::delete))
        .routes(routes!(diff::diff))
        .routes(routes!(refs::list))
        .routes(routes!(refs::point, refs::remove))
        .routes(routes!(diff::file))
        .routes(routes!(system::lineage))
        .routes(routes!(system::audit))
        .routes(routes!(system::metrics))
        .routes(routes!(crate::fleet::capacity::capacity))
        .routes(routes!(gc::report, gc::run))
        .routes(routes!(pools::create, pools::list))
        .routes(routes!(pools::get, pools::delete, pools::update))
        .routes(routes!(pools::claim))
        .routes(routes!(commands::list_processes))
        .routes(routes!(commands::signal))
        .routes(routes!(follow::input))
        .routes(routes!(files::list))
        .routes(routes!(files::stat))
        .routes(routes!(files::rename))
        .routes(routes!(files::mkdir))
        .routes(routes!(templates::list))
        .routes(routes!(templates::get, templates::delete))
        .routes(routes!(templates::log))
        .layer(from_fn_with_state(st.clone(), time_limit));
    let streams = OpenApiRouter::new()
        .routes(routes!(commands::run))
        .routes(routes!(commands::run_stream))
        .routes(routes!(commands::start_process))
        .routes(routes!(commands::wait))
        .routes(routes!(files::read, files::write, files::remove))
        .routes(routes!(templates::build))
        .routes(routes!(pty::open))
        .routes(routes!(udp::open))
        .routes(routes!(follow::output))
        .routes(routes!(follow::watch));
    // Portable snapshots' push, pull and chunk routes: long transfers, so without the limit.
    let authed = control
        .merge(streams)
        .merge(crate::fleet::remote::routes(&st))
        .layer(from_fn_with_state(st.clone(), audit))
        .layer(from_fn_with_state(st.clone(), authenticate));
    let open = OpenApiRouter::new().routes(routes!(system::healthz)).routes(routes!(system::challenge));
    let (router, mut api) =
        OpenApiRouter::with_openapi(ApiDoc::openapi()).merge(authed).merge(open).split_for_parts();
    for (path, item) in api.paths.paths.iter_mut() {
        let needs_token = path != "/healthz" && path != "/v1/auth/challenge";
        for op in [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch]
            .into_iter()
            .flatten()
        {
            // Handler names repeat across modules (list, get); the tag makes each id unique.
            let tag = op.tags.as_ref().and_then(|t| t.first()).cloned().unwrap_or_default();
            op.operation_id = op.operation_id.take().map(|id| format!("{tag}_{id}"));
            op.security = Some(if needs_token {
                vec![utoipa::openapi::security::SecurityRequirement::new("bearer", Vec::<String>::new())]
            } else {
                Vec::new()
            });
        }
    }
    let doc = api.clone();
    let served = api.to_json().unwrap_or_default();
    let openapi_route = Router::new()
        .route(
            "/openapi.json",
            axum::routing::get(move || async move { ([("content-type", "application/json")], served) }),
        )
        .layer(from_fn_with_state(st.clone(), authenticate));
    let proxy = proxy::router().layer(from_fn_with_state(st.clone(), authenticate));
    let mcp = mcp::router(st.clone())
        .layer(from_fn_with_state(st.clone(), audit))
        .layer(from_fn_with_state(st.clone(), authenticate));
    let router = router
        .merge(openapi_route)
        .with_state(state)
        .merge(proxy.with_state(st.clone()))
        .merge(mcp.with_state(st));
    (router, doc)
}
