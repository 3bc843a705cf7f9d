//! Forwarding between real routers over loopback TCP: a node whose peer lists it back never
//! loops, a peer's sandbox is reached with the peer's token only, and a client that does not
//! authenticate here sets nothing in motion at the peers. Listings merge every node's sandboxes
//! (E2B's pages included), naming a peer that did not answer; a create on a full node lands on
//! the roomiest peer that takes it, or says the fleet is full.

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
    node_of_at_most(dir, token, peers, 64)
}

/// [`node`], starting at most `max` sandboxes.
fn node_of_at_most(dir: &Path, token: &str, peers: &Path, max: usize) -> Router {
    let mut cfg = ServiceConfig::new(branchbox_core::Config::from_env(Some(&dir.join("data"))));
    cfg.max_sandboxes = max;
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

/// A peers file naming this node `n2` and the given peers (name, address, token).
fn write_fleet(path: &Path, peers: &[(&str, std::net::SocketAddr, &str)]) {
    let list: Vec<_> = peers
        .iter()
        .map(|(n, a, t)| serde_json::json!({"name": n, "url": format!("http://{a}"), "token": t}))
        .collect();
    std::fs::write(path, serde_json::json!({"node": "n2", "peers": list}).to_string()).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// An address nothing listens on.
async fn dead_address() -> std::net::SocketAddr {
    let (l, a) = listen().await;
    drop(l);
    a
}

/// Serves `router` on a fresh loopback port, logging each request's path, query and headers.
async fn fake_peer(router: Router) -> (std::net::SocketAddr, Arc<Mutex<Vec<(String, HeaderMap)>>>) {
    let seen: Arc<Mutex<Vec<(String, HeaderMap)>>> = Arc::default();
    let log = seen.clone();
    let r = router.layer(axum::middleware::from_fn(move |req: Request, next: Next| {
        let pq = req.uri().path_and_query().map(|p| p.to_string()).unwrap_or_default();
        log.lock().unwrap().push((pq, req.headers().clone()));
        next.run(req)
    }));
    let (l, a) = listen().await;
    tokio::spawn(async move { axum::serve(l, r).await });
    (a, seen)
}

async fn body_json(r: axum::response::Response) -> serde_json::Value {
    let bytes = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
    serde_json::from_slice(&bytes).unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&bytes)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_through_one_node_shows_its_peers_sandboxes_and_names_a_peer_that_did_not_answer() {
    let tmp = tempfile::tempdir().unwrap();
    let (a3, b3) = (SandboxId::generate(), SandboxId::generate());
    let listing =
        serde_json::json!([{"id": b3.as_str(), "created_ms": 20}, {"id": a3.as_str(), "created_ms": 10}]);
    let (addr, seen) =
        fake_peer(Router::new().route("/v1/sandboxes", get(move || async move { axum::Json(listing) })))
            .await;
    let peers = tmp.path().join("peers.json");
    write_fleet(
        &peers,
        &[("n3", addr, "token-n3-0123456789"), ("n4", dead_address().await, "token-n4-0123456789")],
    );
    let entry = node(&tmp.path().join("a"), "token-a-0123456789", &peers);

    let r =
        entry.clone().oneshot(get_req("/v1/sandboxes?state=running", "token-a-0123456789")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let missing = r.headers()[super::listing::UNANSWERED].to_str().unwrap().to_string();
    assert!(missing.starts_with("n4 (did not answer"), "{missing}");
    let got = body_json(r).await;
    let rows: Vec<(&str, &str)> = got
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["id"].as_str().unwrap(), e["node"].as_str().unwrap()))
        .collect();
    assert_eq!(rows, [(a3.as_str(), "n3"), (b3.as_str(), "n3")], "in creation order, each with its node");
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].0, "/v1/sandboxes?state=running", "the client's filters go to the peer");
        assert_eq!(seen[0].1["authorization"], "Bearer token-n3-0123456789");
        assert!(seen[0].1.contains_key(FORWARDED), "the peer must answer with its own sandboxes only");
    }

    // This node's own only: the peers are not asked.
    let r = entry.clone().oneshot(get_req("/v1/sandboxes?local=true", "token-a-0123456789")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(!r.headers().contains_key(super::listing::UNANSWERED));
    assert_eq!(body_json(r).await, serde_json::json!([]));
    assert_eq!(seen.lock().unwrap().len(), 1);
    let r = entry.oneshot(get_req("/v1/sandboxes?local=yes", "token-a-0123456789")).await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(body_json(r).await.to_string().contains("local"));
}

/// An E2B listing of `all` (start ms, id) as a node pages it: `order`, `limit`, `nextToken`.
fn e2b_page(all: &[(i64, String)], q: &HashMap<String, String>) -> axum::response::Response {
    use axum::response::IntoResponse;
    let desc = q.get("order").map(String::as_str) == Some("desc");
    let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(100);
    let from = q.get("nextToken").map(|t| {
        let (ms, id) = t.split_once('.').unwrap();
        (ms.parse::<i64>().unwrap(), id.to_string())
    });
    let mut v = all.to_vec();
    v.sort();
    if desc {
        v.reverse();
    }
    v.retain(|k| from.as_ref().is_none_or(|f| if desc { k < f } else { k > f }));
    let more = v.len() > limit;
    v.truncate(limit);
    let stamp = |ms: i64| chrono::DateTime::from_timestamp_millis(ms).unwrap().to_rfc3339();
    let page: Vec<_> =
        v.iter().map(|(ms, id)| serde_json::json!({"sandboxID": id, "startedAt": stamp(*ms)})).collect();
    let mut r = axum::Json(page).into_response();
    if let (true, Some((ms, id))) = (more, v.last()) {
        r.headers_mut().insert("x-next-token", format!("{ms}.{id}").parse().unwrap());
    }
    r
}

use std::collections::HashMap;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_pages_through_one_node_walk_every_nodes_sandboxes_once_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let ids: Vec<(i64, String)> =
        (0..7).map(|i| (1_000 + i * 10, SandboxId::generate().to_string())).collect();
    // n3 holds the even ones, n4 the odd ones.
    let mut addrs = Vec::new();
    for part in 0..2 {
        let mine: Vec<(i64, String)> = ids.iter().skip(part).step_by(2).cloned().collect();
        let r = Router::new().route(
            "/e2b/v2/sandboxes",
            get(move |axum::extract::Query(q): axum::extract::Query<HashMap<String, String>>| {
                let mine = mine.clone();
                async move { e2b_page(&mine, &q) }
            }),
        );
        addrs.push(fake_peer(r).await.0);
    }
    let peers = tmp.path().join("peers.json");
    write_fleet(&peers, &[("n3", addrs[0], "token-n3-0123456789"), ("n4", addrs[1], "token-n4-0123456789")]);
    let entry = node(&tmp.path().join("a"), "token-a-0123456789", &peers);
    for order in ["asc", "desc"] {
        let (mut walked, mut token, mut pages) = (Vec::new(), None::<String>, 0);
        loop {
            let mut uri = format!("/e2b/v2/sandboxes?limit=3&order={order}");
            if let Some(t) = &token {
                uri += &format!("&nextToken={t}");
            }
            let req = axum::http::Request::builder()
                .uri(uri)
                .header("host", "127.0.0.1:1")
                .header("x-api-key", "token-a-0123456789")
                .body(Body::empty())
                .unwrap();
            let r = entry.clone().oneshot(req).await.unwrap();
            assert_eq!(r.status(), StatusCode::OK);
            token = r.headers().get("x-next-token").map(|v| v.to_str().unwrap().to_string());
            let page = body_json(r).await;
            walked.extend(
                page.as_array().unwrap().iter().map(|e| e["sandboxID"].as_str().unwrap().to_string()),
            );
            pages += 1;
            if token.is_none() {
                break;
            }
            assert!(pages < 10, "the pages do not end");
        }
        let mut want: Vec<String> = ids.iter().map(|(_, id)| id.clone()).collect();
        if order == "desc" {
            want.reverse();
        }
        assert_eq!(walked, want, "order {order}");
        assert_eq!(pages, 3, "7 sandboxes, 3 a page");
    }
}

fn post_req(path: &str, body: &str, auth: (&str, &str)) -> Request {
    axum::http::Request::builder()
        .method("POST")
        .uri(path)
        .header("host", "127.0.0.1:1")
        .header(auth.0, auth.1)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

/// A fake peer with `room` left that answers creates with `create`'s status and body.
async fn peer_with_room(
    room: usize,
    create: (StatusCode, serde_json::Value),
) -> (std::net::SocketAddr, Arc<Mutex<Vec<(String, HeaderMap)>>>) {
    let cap = serde_json::json!({"sandboxes": 4 - room.min(4), "max_sandboxes": 4, "room": room});
    let answer = move || {
        let create = create.clone();
        async move { (create.0, axum::Json(create.1)) }
    };
    let r = Router::new()
        .route("/v1/fleet/capacity", get(move || async move { axum::Json(cap) }))
        .route("/v1/sandboxes", post(answer.clone()))
        .route("/e2b/v2/sandboxes", post(answer));
    fake_peer(r).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_on_a_full_node_goes_to_the_roomiest_peer_that_takes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let id = SandboxId::generate();
    let full = serde_json::json!({"error": {"code": "at_capacity", "message": "runs 4 of at most 4"}});
    let made = serde_json::json!({"id": id.as_str(), "state": "running"});
    // n4 says it has the most room but is full by the time the create comes; n3 takes it;
    // n5 has none and is never sent the create.
    let (a3, seen3) = peer_with_room(1, (StatusCode::CREATED, made)).await;
    let (a4, seen4) = peer_with_room(3, (StatusCode::SERVICE_UNAVAILABLE, full)).await;
    let (a5, seen5) = peer_with_room(0, (StatusCode::CREATED, serde_json::json!({}))).await;
    let peers = tmp.path().join("peers.json");
    write_fleet(
        &peers,
        &[
            ("n3", a3, "token-n3-0123456789"),
            ("n4", a4, "token-n4-0123456789"),
            ("n5", a5, "token-n5-0123456789"),
        ],
    );
    let entry = node_of_at_most(&tmp.path().join("a"), "token-a-0123456789", &peers, 0);
    let r = entry
        .oneshot(post_req(
            "/v1/sandboxes",
            r#"{"timeout": 60}"#,
            ("authorization", "Bearer token-a-0123456789"),
        ))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(r.headers()[super::spill::NODE], "n3");
    assert_eq!(body_json(r).await["id"], id.as_str());
    let creates = |seen: &Arc<Mutex<Vec<(String, HeaderMap)>>>| {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p == "/v1/sandboxes")
            .map(|(_, h)| h.clone())
            .collect::<Vec<_>>()
    };
    let (c3, c4) = (creates(&seen3), creates(&seen4));
    assert_eq!(
        (c3.len(), c4.len(), creates(&seen5).len()),
        (1, 1, 0),
        "most room first, none to a full peer"
    );
    assert_eq!(c3[0]["authorization"], "Bearer token-n3-0123456789");
    assert!(c3[0].contains_key(FORWARDED), "the peer must not pass it on again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_e2b_create_passed_to_a_peer_gets_an_access_token_from_the_clients_key() {
    let tmp = tempfile::tempdir().unwrap();
    let id = SandboxId::generate();
    let from_peer = crate::auth::Tokens::sandbox_token("token-n3-0123456789", id.as_str());
    let made =
        serde_json::json!({"sandboxID": id.as_str(), "templateID": "base", "envdAccessToken": from_peer});
    let (a3, _) = peer_with_room(2, (StatusCode::CREATED, made)).await;
    let peers = tmp.path().join("peers.json");
    write_fleet(&peers, &[("n3", a3, "token-n3-0123456789")]);
    let entry = node_of_at_most(&tmp.path().join("a"), "token-a-0123456789", &peers, 0);
    let r = entry
        .oneshot(post_req("/e2b/v2/sandboxes", "{}", ("x-api-key", "token-a-0123456789")))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let v = body_json(r).await;
    let mine = crate::auth::Tokens::sandbox_token("token-a-0123456789", id.as_str());
    assert_eq!(v["envdAccessToken"], mine.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_when_every_node_is_full_says_the_fleet_is_full_naming_each_peer() {
    let tmp = tempfile::tempdir().unwrap();
    let (a3, seen3) = peer_with_room(0, (StatusCode::CREATED, serde_json::json!({}))).await;
    let peers = tmp.path().join("peers.json");
    write_fleet(
        &peers,
        &[("n3", a3, "token-n3-0123456789"), ("n4", dead_address().await, "token-n4-0123456789")],
    );
    let entry = node_of_at_most(&tmp.path().join("a"), "token-a-0123456789", &peers, 0);
    for (path, auth) in [
        ("/v1/sandboxes", ("authorization", "Bearer token-a-0123456789")),
        ("/e2b/v2/sandboxes", ("x-api-key", "token-a-0123456789")),
    ] {
        let r = entry.clone().oneshot(post_req(path, "{}", auth)).await.unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE, "{path}");
        let text = body_json(r).await.to_string();
        for want in ["fleet is full", "n3 runs 4 of at most 4", "n4 did not answer"] {
            assert!(text.contains(want), "{path}: {want:?} not in {text}");
        }
    }
    assert!(seen3.lock().unwrap().iter().all(|(p, _)| p == "/v1/fleet/capacity"), "a full peer got a create");
}
