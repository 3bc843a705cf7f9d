//! The top of the service: the one place its router is assembled (every surface with its own
//! state, and the layers every request passes), and the HTTP server loop, with a header-read
//! timeout and a cap on open connections (`axum::serve` has neither, so a client could hold any
//! number of connections open by never finishing its headers).
//!
//! ```text
//! serve (router assembly, server loop)
//!   api (native /v1, proxy, /mcp) | e2b (E2B REST + envd) | ui (console) | fleet, guard
//!     ops (create, info, fork, snapshots, exec spec, template defaults, files, lineage) | pool
//!       layers (auth, audit, time limit, metrics), extract, streams
//!         state (AppState), auth, db, config, error, metrics
//! ```

use crate::api::ApiState;
use crate::error::ApiError;
use crate::guard::Guard;
use crate::middleware::count;
use crate::pool::Pools;
use crate::state::AppState;
use axum::http::StatusCode;
use axum::middleware::from_fn_with_state;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The service's router: the native API (with its OpenAPI document, also returned), E2B's
/// adapter and the console, each with its own state, then what every request passes: the
/// answers to unknown routes and methods, the JSON body limit, fleet forwarding, the guard,
/// metrics and `Connection: close` after an unread body. `pools` is the warm pools' run-time
/// state, which the refill loop (`crate::pool::run`) shares.
pub fn router(st: AppState, pools: Arc<Pools>) -> (Router, utoipa::openapi::OpenApi) {
    let (api, doc) = crate::api::router(ApiState { app: st.clone(), pools, files: Default::default() });
    let router = api
        .merge(crate::e2b::router(st.clone()))
        .merge(crate::ui::router().with_state(st.clone()))
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
        // E2B's API takes Connect and multipart bodies; it authenticates by headers a
        // cross-site form cannot send (X-API-Key, X-Access-Token), never by cookie.
        .layer(from_fn_with_state(
            Guard { st: st.clone(), other_bodies_under: crate::e2b::GUARDED_ELSEWHERE },
            crate::guard::guard,
        ))
        .layer(from_fn_with_state(st, count))
        .layer(axum::middleware::from_fn(crate::unread::close_if_unread));
    (router, doc)
}

/// The answer to a connection over the cap, written before it is closed.
fn busy_answer() -> Vec<u8> {
    let body = r#"{"error":{"code":"too_many_connections","message":"the service holds its most connections; retry later"}}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Limits of the server loop.
#[derive(Debug, Clone, Copy)]
pub struct ServeLimits {
    /// Longest a connection may take to send a request's headers, and longest an idle
    /// kept-alive connection is kept.
    pub header_timeout: Duration,
    /// Most connections at once; more are answered 503 and closed.
    pub max_connections: usize,
}

/// Serves `router` on `listener` until `shutdown` completes, then lets open requests finish
/// for up to `drain`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let busy = busy_answer();
    // hyper-util's GracefulShutdown does not take connections that can be upgraded, so each
    // connection watches this itself and winds down (finishing the request in flight) when it
    // turns true.
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Streamed answers (server-sent events, Connect streams, terminals) are many small
        // writes: without TCP_NODELAY each one after the first waits for the client's delayed
        // ACK (40 ms on Linux), which made a streamed `true` take 50 ms instead of 10.
        let _ = stream.set_nodelay(true);
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            // A fresh socket's send buffer takes this whole; if not, the client just sees the close.
            let _ = stream.try_write(&busy);
            continue;
        };
        // With upgrades: a terminal's WebSocket (and one passed through the proxy) takes the
        // connection over after its 101; from then on it is the upgraded task's, not counted here.
        let conn = http
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(router.clone()))
            .with_upgrades();
        let mut stopping = stopping.clone();
        tokio::spawn(async move {
            tokio::pin!(conn);
            let stop = tokio::select! {
                _ = conn.as_mut() => false,
                r = stopping.wait_for(|s| *s) => r.is_ok(),
            };
            if stop {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
            drop(permit);
        });
    }
    drop(listener);
    let _ = stop.send(true);
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(drain, permits.acquire_many(all)).await.is_err() {
        tracing::warn!("requests still open after {} s; stopping anyway", drain.as_secs());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busy_answer_declares_its_body_length() {
        let answer = busy_answer();
        let text = std::str::from_utf8(&answer).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}", body.len())), "{head}");
        serde_json::from_str::<serde_json::Value>(body).unwrap();
    }
}

#[cfg(test)]
mod route_tests {
    use super::*;
    use crate::config::ServiceConfig;
    use axum::body::Body;
    use tower::ServiceExt;
    use utoipa::openapi::OpenApi as OpenApiDoc;

    fn app() -> (tempfile::TempDir, Router, OpenApiDoc) {
        let dir = tempfile::tempdir().unwrap();
        let cfg = ServiceConfig::new(branchbox_core::Config::from_env(Some(dir.path())));
        let st = AppState::open(cfg, Some(crate::auth::Tokens::new(["test-token-0123456789"]))).unwrap();
        let (r, d) = router(st, Default::default());
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

    #[test]
    fn push_pull_and_chunks_are_in_the_openapi_document_with_their_answers() {
        let (_dir, _router, doc) = app();
        let doc = serde_json::to_value(&doc).unwrap();
        let paths = &doc["paths"];
        let op = |path: &str, method: &str| paths[path][method].clone();
        let chunk = op("/v1/snapshots/{snapshot}/chunks/{hash}", "get");
        assert!(chunk["responses"]["200"]["content"]["application/octet-stream"].is_object(), "{chunk}");
        let push = op("/v1/snapshots/{snapshot}/push", "post");
        assert_eq!(
            push["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/PushAnswer"
        );
        let pull = op("/v1/snapshots/pull", "post");
        assert_eq!(
            pull["requestBody"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/PullBody"
        );
        for o in [&chunk, &push, &pull] {
            assert_eq!(o["security"], serde_json::json!([{"bearer": []}]), "{o}");
        }
        let schemas = &doc["components"]["schemas"];
        for (name, field) in
            [("PushAnswer", "sent_bytes"), ("PullAnswer", "peer_bytes"), ("PullBody", "peer")]
        {
            assert!(schemas[name]["properties"][field].is_object(), "{name}: {}", schemas[name]);
        }
    }
}
