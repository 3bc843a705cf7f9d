//! The HTTP API: routes, the OpenAPI document generated from them, and the layers every request
//! passes (metrics, authentication, audit, time limit).
//!
//! Routes are registered through `utoipa-axum`, so the OpenAPI document at `/openapi.json` is
//! built from the same handler list the router serves and cannot drift from it.

pub mod commands;
pub mod diff;
#[cfg(test)]
mod diff_timeline_tests;
pub mod extract;
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
pub mod types;
pub mod udp;

use crate::auth::Caller;
use crate::db::AuditEntry;
use crate::error::{ApiError, ErrorBody, ErrorCodeTag};
use crate::state::AppState;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use std::time::Instant;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::OpenApi as OpenApiDoc;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// What a state-changing handler tells the audit log beyond the route and status.
#[derive(Debug, Clone, Default)]
pub struct AuditNote {
    /// The sandbox acted on or created.
    pub sandbox: Option<String>,
    /// The snapshot created, used or deleted.
    pub snapshot: Option<String>,
    /// The parent (source sandbox of a fork, snapshot a sandbox came from).
    pub parent: Option<String>,
    /// Anything else worth keeping.
    pub detail: Option<String>,
}

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

/// Builds the router and its OpenAPI document.
pub fn router(st: AppState) -> (Router, OpenApiDoc) {
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
    let authed = control
        .merge(streams)
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
        .merge(proxy)
        .merge(mcp)
        .merge(crate::e2b::router(st.clone()))
        .merge(crate::ui::router())
        .fallback(|| async { ApiError::not_found("no such route; GET /openapi.json lists them") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this route does not take that method; GET /openapi.json lists what it takes",
            )
        })
        .layer(axum::extract::DefaultBodyLimit::max(st.cfg.max_json_bytes))
        .layer(from_fn_with_state(crate::fleet::Fleet::new(&st), crate::fleet::forward))
        .layer(from_fn_with_state(st.clone(), crate::guard::guard))
        .layer(from_fn_with_state(st.clone(), count))
        .layer(axum::middleware::from_fn(crate::unread::close_if_unread))
        .with_state(st);
    (router, doc)
}

async fn authenticate(State(st): State<AppState>, mut req: Request, next: Next) -> Response {
    let caller = match &st.tokens {
        None => Caller("anonymous".into()),
        Some(tokens) => match tokens.authenticate_request(req.method(), req.uri(), req.headers()) {
            Ok(c) => c,
            Err(e) => return e.into_response(),
        },
    };
    req.extensions_mut().insert(caller);
    next.run(req).await
}

async fn time_limit(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let limit = st.cfg.request_timeout;
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(r) => r,
        Err(_) => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "timeout",
            format!(
                "the operation did not finish within {} s; it may still complete, so check the sandbox or \
                 snapshot before retrying",
                limit.as_secs()
            ),
        )
        .into_response(),
    }
}

fn route_of(req: &Request) -> String {
    req.extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into())
}

async fn count(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let (method, route, t) = (req.method().to_string(), route_of(&req), Instant::now());
    let has_body = req.headers().contains_key(header::TRANSFER_ENCODING)
        || req.headers().get(header::CONTENT_LENGTH).is_some_and(|v| v != "0");
    let mut r = next.run(req).await;
    st.metrics.request(&method, &route, r.status().as_u16(), t.elapsed());
    // A request refused before its body was read leaves unread bytes on the connection; closing
    // it (and saying so) keeps a client from sending its next request into them.
    if has_body && r.status().as_u16() >= 400 {
        r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

/// The `{id}` or `{snapshot}` segment of a path, when the route has one.
fn path_object(path: &str, collection: &str) -> Option<String> {
    path.strip_prefix(collection)?.split('/').next().filter(|s| !s.is_empty()).map(str::to_string)
}

/// The audit layer: records every state-changing request after it is answered.
pub(crate) async fn audit(State(st): State<AppState>, req: Request, next: Next) -> Response {
    // Reads are not recorded; opening a terminal (a GET, as every WebSocket handshake is) is.
    if matches!(*req.method(), Method::GET | Method::HEAD) && route_of(&req) != "/v1/sandboxes/{id}/pty" {
        return next.run(req).await;
    }
    let who = req.extensions().get::<Caller>().map(|c| c.0.clone()).unwrap_or_default();
    let action = format!("{} {}", req.method(), route_of(&req));
    let path = req.uri().path().to_string();
    let r = next.run(req).await;
    let note = r.extensions().get::<AuditNote>().cloned().unwrap_or_default();
    let entry = AuditEntry {
        seq: 0,
        at_ms: 0,
        who,
        action,
        status: r.status().as_u16(),
        code: r.extensions().get::<ErrorCodeTag>().map(|c| c.0.to_string()),
        sandbox: note
            .sandbox
            .or_else(|| path_object(&path, "/v1/sandboxes/"))
            .or_else(|| path_object(&path, "/e2b/sandboxes/"))
            .or_else(|| path_object(&path, "/e2b/v2/sandboxes/")),
        snapshot: note.snapshot.or_else(|| path_object(&path, "/v1/snapshots/")),
        parent: note.parent,
        detail: note.detail,
    };
    let st2 = st.clone();
    let written =
        tokio::task::spawn_blocking(move || st2.db().audit(branchbox_model::now_ms(), &entry)).await;
    if !matches!(written, Ok(Ok(()))) {
        tracing::error!("could not write an audit record: {written:?}");
    }
    r
}

#[cfg(test)]
mod tests {
    use super::path_object;

    #[test]
    fn audit_finds_the_object_in_the_path() {
        assert_eq!(path_object("/v1/sandboxes/sbx-1/fork", "/v1/sandboxes/").as_deref(), Some("sbx-1"));
        assert_eq!(path_object("/v1/sandboxes", "/v1/sandboxes/"), None);
        assert_eq!(path_object("/v1/snapshots/warm", "/v1/snapshots/").as_deref(), Some("warm"));
    }
}

#[cfg(test)]
mod route_tests {
    use super::*;
    use crate::config::ServiceConfig;
    use axum::body::Body;
    use tower::ServiceExt;

    fn app() -> (tempfile::TempDir, Router, OpenApiDoc) {
        let dir = tempfile::tempdir().unwrap();
        let cfg = ServiceConfig::new(branchbox_core::Config::from_env(Some(dir.path())));
        let st = AppState::open(cfg, Some(crate::auth::Tokens::new(["test-token-0123456789"]))).unwrap();
        let (r, d) = router(st);
        (dir, r, d)
    }

    fn ops(d: &OpenApiDoc) -> Vec<(String, &'static str, String)> {
        let mut out = Vec::new();
        for (path, item) in &d.paths.paths {
            for (m, op) in [
                ("GET", &item.get),
                ("PUT", &item.put),
                ("POST", &item.post),
                ("DELETE", &item.delete),
                ("PATCH", &item.patch),
            ] {
                if let Some(op) = op {
                    out.push((path.clone(), m, op.operation_id.clone().unwrap_or_default()));
                }
            }
        }
        out
    }

    #[test]
    fn operation_ids_are_unique() {
        let (_d, _r, doc) = app();
        let ids: Vec<String> = ops(&doc).into_iter().map(|o| o.2).collect();
        let unique: std::collections::BTreeSet<&String> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len(), "{ids:?}");
    }

    #[tokio::test]
    async fn every_documented_operation_is_routed_and_needs_a_token() {
        let (_d, router, doc) = app();
        for (path, method, _) in ops(&doc) {
            let uri = path
                .replace("{id}", "sbx-0000000000000000")
                .replace("{snapshot}", "x")
                .replace("{pid}", "1")
                .replace("{pool}", "p");
            let req = axum::http::Request::builder()
                .method(method)
                .uri(&uri)
                .header("host", "127.0.0.1")
                .body(Body::empty())
                .unwrap();
            let r = router.clone().oneshot(req).await.unwrap();
            let want = match path.as_str() {
                "/healthz" => 200,
                "/v1/auth/challenge" => 400,
                _ => 401,
            };
            assert_eq!(r.status().as_u16(), want, "{method} {path}");
        }
        let req = axum::http::Request::builder()
            .uri("/v1/nope")
            .header("host", "127.0.0.1")
            .body(Body::empty())
            .unwrap();
        assert_eq!(router.oneshot(req).await.unwrap().status().as_u16(), 404);
    }

    #[tokio::test]
    async fn the_udp_relay_checks_its_port_before_it_wants_a_websocket() {
        let (_d, router, _) = app();
        for (port, status, code) in
            [("0", 400, "invalid_port"), ("dns", 400, "invalid_port"), ("53", 426, "websocket_required")]
        {
            let req = axum::http::Request::builder()
                .uri(format!("/v1/sandboxes/sbx-0000000000000000/udp/{port}"))
                .header("host", "127.0.0.1")
                .header("authorization", "Bearer test-token-0123456789")
                .body(Body::empty())
                .unwrap();
            let r = router.clone().oneshot(req).await.unwrap();
            assert_eq!(r.status().as_u16(), status, "port {port}");
            let body = axum::body::to_bytes(r.into_body(), 4096).await.unwrap();
            assert!(String::from_utf8_lossy(&body).contains(code), "port {port}: {body:?}");
        }
    }
}
