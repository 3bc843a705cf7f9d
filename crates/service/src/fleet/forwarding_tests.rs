//! Forwarding between real routers over loopback TCP: a node whose peer lists it back never
//! loops, a peer's sandbox is reached with the peer's token only, and a client that does not
//! authenticate here sets nothing in motion at the peers.

use super::forward::FORWARDED;
use crate::config::ServiceConfig;
use crate::AppState;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::routing::{get, post};
use axum::Router;
use branchbox_model::SandboxId;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::ServiceExt;

fn write_peers(path: &Path, name: &str, addr: std::net::SocketAddr, token: &str) {
    let text =
        serde_json::json!({"peers": [{"name": name, "url": format!("http://{addr}"), "token": token}]});
    std::fs::write(path, text.to_string()).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// A node's router over a fresh data directory, with `token` and the peers file `peers`.
fn node(dir: &Path, token: &str, peers: &Path) -> Router {
    let mut cfg = ServiceConfig::new(branchbox_core::Config::from_env(Some(&dir.join("data"))));
    cfg.peers = Some(peers.to_path_buf());
    let st = AppState::open(cfg, Some(crate::auth::Tokens::new([token]))).unwrap();
    crate::serve::router(st, Default::default()).0
}

fn counted(r: Router, n: Arc<AtomicUsize>) -> Router {
    r.layer(axum::middleware::from_fn(move |req: Request, next: Next| {
        let n = n.clone();
        async move {
            n.fetch_add(1, Ordering::SeqCst);
            next.run(req).await
        }
    }))
}

async fn listen() -> (tokio::net::TcpListener, std::net::SocketAddr) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = l.local_addr().unwrap();
    (l, a)
}

fn get_req(path: &str, token: &str) -> Request {
    axum::http::Request::builder()
        .uri(path)
        .header("host", "127.0.0.1:1")
        .header("authorization", format!("Bearer {token}"))
        .body(Body::empty())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_listing_each_other_answer_an_unknown_sandbox_without_a_loop() {
    let tmp = tempfile::tempdir().unwrap();
    let (la, aa) = listen().await;
    let (lb, ab) = listen().await;
    let (pa, pb) = (tmp.path().join("a-peers.json"), tmp.path().join("b-peers.json"));
    write_peers(&pa, "b", ab, "token-b-0123456789");
    write_peers(&pb, "a", aa, "token-a-0123456789");
    let (na, nb) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let a = counted(node(&tmp.path().join("a"), "token-a-0123456789", &pa), na.clone());
    let b = counted(node(&tmp.path().join("b"), "token-b-0123456789", &pb), nb.clone());
    tokio::spawn(async move { axum::serve(la, a).await });
    tokio::spawn(async move { axum::serve(lb, b).await });
    let client = hyper_client(aa).await;
    let id = SandboxId::generate();
    let resp = tokio::time::timeout(
        Duration::from_secs(20),
        client(get_req(&format!("/v1/sandboxes/{id}"), "token-a-0123456789")),
    )
    .await
    .expect("a loop between the two nodes");
    assert_eq!(resp, StatusCode::NOT_FOUND);
    // The client's request at a, one lookup at b (marked, so b asked nobody back).
    assert_eq!((na.load(Ordering::SeqCst), nb.load(Ordering::SeqCst)), (1, 1));
}

/// Sends requests to `addr` over fresh connections; answers the status.
async fn hyper_client(
    addr: std::net::SocketAddr,
) -> impl Fn(Request) -> std::pin::Pin<Box<dyn std::future::Future<Output = StatusCode> + Send>> {
    move |req: Request| {
        Box::pin(async move {
            let s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (mut tx, conn) =
                hyper::client::conn::http1::handshake::<_, Body>(hyper_util::rt::TokioIo::new(s))
                    .await
                    .unwrap();
            tokio::spawn(conn);
            tx.send_request(req).await.unwrap().status()
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peers_sandbox_is_reached_with_the_peers_token_and_the_answer_streams_back() {
    let tmp = tempfile::tempdir().unwrap();
    let (lp, ap) = listen().await;
    let id = SandboxId::generate();
    let seen: Arc<Mutex<Vec<HeaderMap>>> = Arc::default();
    let log = seen.clone();
    let owner = Router::new()
        .route("/v1/sandboxes/{id}", get(|| async { axum::Json(serde_json::json!({})) }))
        .route(
            "/v1/sandboxes/{id}/commands/stream",
            post(|body: String| async move {
                let chunks = ["data: one\n\n".to_string(), format!("data: {body}\n\n")];
                Body::from_stream(futures_util::stream::iter(chunks.into_iter().map(Ok::<_, std::io::Error>)))
            }),
        )
        .layer(axum::middleware::from_fn(move |req: Request, next: Next| {
            log.lock().unwrap().push(req.headers().clone());
            next.run(req)
        }));
    tokio::spawn(async move { axum::serve(lp, owner).await });
    let peers = tmp.path().join("peers.json");
    write_peers(&peers, "n3", ap, "token-peer-0123456789");
    let entry = node(&tmp.path().join("a"), "token-a-0123456789", &peers);

    // Not authenticated here: answered here (401), and the peer hears nothing.
    let r = entry
        .clone()
        .oneshot(get_req(&format!("/v1/sandboxes/{id}"), "token-peer-0123456789"))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(seen.lock().unwrap().is_empty());

    let req = axum::http::Request::builder()
        .method("POST")
        .uri(format!("/v1/sandboxes/{id}/commands/stream"))
        .header("host", "127.0.0.1:1")
        .header("authorization", "Bearer token-a-0123456789")
        .header("content-type", "application/json")
        .body(Body::from("{\"cmd\":\"x\"}"))
        .unwrap();
    let r = entry.oneshot(req).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let body = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
    assert_eq!(&body[..], b"data: one\n\ndata: {\"cmd\":\"x\"}\n\n");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "one lookup, one forwarded request");
    for h in seen.iter() {
        assert_eq!(h["authorization"], "Bearer token-peer-0123456789");
        assert!(h.contains_key(FORWARDED));
        assert!(!format!("{h:?}").contains("token-a-0123456789"), "the client's token reached the peer");
    }
}
