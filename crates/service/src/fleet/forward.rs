//! The forwarding layer: a request naming a sandbox that a peer holds goes to that peer, its
//! body and answer streamed through (server-sent events and Connect streams included).
//!
//! The client authenticates here, by this node's own rules; the forwarded request carries the
//! peer's token instead of the client's credentials, and [`FORWARDED`], which no node forwards
//! again (so a request crosses at most one hop, whatever the peers files say). An E2B answer
//! that hands out a sandbox access token (`envdAccessToken`) is rewritten to the token derived
//! from the key the client presented here, so the client never holds one derived from the
//! peer's token. A WebSocket (a terminal, a UDP relay) is forwarded as its handshake, then
//! as the bytes of the switched connection, copied both ways.

use super::{Fleet, Peer};
use crate::auth::Tokens;
use crate::caller::Caller;
use crate::error::ApiError;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use branchbox_e2b_wire::connect::RpcError;
use branchbox_model::SandboxId;
use hyper_util::rt::TokioIo;
use std::time::Duration;

/// Marks a request one node forwarded to another (its value: the caller's id at the first
/// node); a request that carries it is never forwarded again.
pub const FORWARDED: &str = "x-branchbox-forwarded";

/// Longest the connection to a peer may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a peer may take to say whether it holds a sandbox.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);
/// Largest E2B control-plane answer read whole (to rewrite its access tokens).
const MAX_REWRITTEN: usize = 4 << 20;

/// Which API a request belongs to: it decides the credential the peer gets and the shape of
/// an error answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plane {
    /// branchbox's own `/v1` (bearer token).
    V1,
    /// E2B's REST control plane under `/e2b` (`X-API-Key`).
    E2bControl,
    /// E2B's envd data plane under `/e2b/envd` (`E2b-Sandbox-Id`, `X-Access-Token`).
    Envd,
}

/// The sandbox a request names, and its plane; `None` for requests that name none (a create,
/// a listing), which are served here.
pub fn target_of(path: &str, headers: &HeaderMap) -> Option<(SandboxId, Plane)> {
    let first = |rest: &str| SandboxId::parse(rest.split('/').next().unwrap_or("")).ok();
    if let Some(rest) = path.strip_prefix("/v1/sandboxes/") {
        return first(rest).map(|id| (id, Plane::V1));
    }
    if path.starts_with("/e2b/envd/") {
        let raw = headers.get("e2b-sandbox-id")?.to_str().ok()?.trim();
        return SandboxId::parse(raw).ok().map(|id| (id, Plane::Envd));
    }
    let rest = path.strip_prefix("/e2b/sandboxes/").or_else(|| path.strip_prefix("/e2b/v2/sandboxes/"))?;
    first(rest).map(|id| (id, Plane::E2bControl))
}

/// Whether a request must be served here and never forwarded: it was forwarded already.
/// The plane of a path naming the collection of sandboxes (`/v1/sandboxes`, E2B's
/// `/e2b/sandboxes` and `/e2b/v2/sandboxes`), whose listings and creates the fleet handles.
pub(super) fn sandboxes_collection(path: &str) -> Option<Plane> {
    match path {
        "/v1/sandboxes" => Some(Plane::V1),
        "/e2b/sandboxes" | "/e2b/v2/sandboxes" => Some(Plane::E2bControl),
        _ => None,
    }
}

pub fn was_forwarded(headers: &HeaderMap) -> bool {
    headers.contains_key(FORWARDED)
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty() && v.len() <= 512)
}

/// Who the client is at this node, and the key it presented (for E2B's access tokens); `None`
/// when it does not authenticate here (then this node answers it, with its 401). `id` is the
/// sandbox an envd request names, whose access token it may present.
pub(super) fn authenticate(
    tokens: Option<&Tokens>,
    req: &Request,
    id: Option<&SandboxId>,
    plane: Plane,
) -> Option<(Caller, Option<String>)> {
    let Some(t) = tokens else { return Some((Caller("anonymous".into()), None)) };
    let h = req.headers();
    match plane {
        Plane::V1 => t.authenticate_request(req.method(), req.uri(), h).ok().map(|c| (c, None)),
        Plane::E2bControl => match header(h, "x-api-key") {
            Some(k) => t.check(k).map(|c| (c, Some(k.to_string()))),
            None => {
                let c = t.authenticate(h).ok()?;
                let key = header(h, "authorization")
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .map(|k| k.trim().to_string());
                Some((c, key))
            }
        },
        Plane::Envd => header(h, "x-access-token")
            .and_then(|v| id.and_then(|id| t.check_sandbox_token(id.as_str(), v)))
            .or_else(|| header(h, "x-api-key").and_then(|k| t.check(k)))
            .map(|c| (c, None)),
    }
}

/// A request naming a sandbox: served here when it names none, when this node holds it or when
/// no peer holds it; otherwise forwarded to the peer holding it. [`super::dispatch`] sends
/// listings and creates elsewhere first.
pub(super) async fn to_owner(fleet: Fleet, req: Request, next: Next) -> Response {
    let Some((id, plane)) = target_of(req.uri().path(), req.headers()) else { return next.run(req).await };
    let peers = fleet.peers();
    if peers.is_empty() {
        return next.run(req).await;
    }
    let Some((caller, presented)) = authenticate(fleet.state().tokens.as_ref(), &req, Some(&id), plane)
    else {
        return next.run(req).await;
    };
    let here = id.clone();
    if fleet.state().blocking(move |engine, _| Ok(engine.sandbox(&here).is_ok())).await.unwrap_or(false) {
        return next.run(req).await;
    }
    let Some(peer) = owner(&fleet, &peers, &id).await else { return next.run(req).await };
    // A WebSocket (a terminal, a UDP relay, one through the port proxy): the handshake goes to
    // the peer, and once both sides have switched protocols the bytes are copied both ways.
    let mut req = req;
    let upgrade = req.headers().get(header::UPGRADE).cloned();
    let client_side = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
    let mut forwarded = outgoing(req, &peer, plane, &caller);
    if let Some(u) = upgrade {
        forwarded.headers_mut().insert(header::UPGRADE, u);
        forwarded.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    let resp = match send(&peer, forwarded).await {
        Ok(r) => r,
        Err(e) => {
            fleet.forget_owner(id.as_str());
            let msg = format!(
                "sandbox {id} lives on fleet node {} ({}), which did not answer: {e}",
                peer.name, peer.authority
            );
            return error(plane, StatusCode::BAD_GATEWAY, "peer_unavailable", msg);
        }
    };
    if resp.status() == StatusCode::NOT_FOUND {
        fleet.forget_owner(id.as_str());
    }
    match client_side {
        Some(client) if resp.status() == StatusCode::SWITCHING_PROTOCOLS => splice(client, resp),
        _ => incoming(resp, plane, presented.as_deref()).await,
    }
}

/// Answers the client's handshake with the peer's 101, then copies bytes both ways between the
/// two upgraded connections until either side closes.
fn splice(
    client: hyper::upgrade::OnUpgrade,
    mut resp: axum::http::Response<hyper::body::Incoming>,
) -> Response {
    let peer_side = hyper::upgrade::on(&mut resp);
    tokio::spawn(async move {
        match (client.await, peer_side.await) {
            (Ok(a), Ok(b)) => {
                let _ = tokio::io::copy_bidirectional(&mut TokioIo::new(a), &mut TokioIo::new(b)).await;
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::debug!("a forwarded WebSocket did not switch protocols: {e}")
            }
        }
    });
    let (parts, _) = resp.into_parts();
    Response::from_parts(parts, Body::empty())
}

/// An error answer in the plane's shape.
pub(super) fn error(plane: Plane, status: StatusCode, code: &'static str, msg: String) -> Response {
    match plane {
        Plane::V1 => ApiError::new(status, code, msg).into_response(),
        Plane::E2bControl => crate::error::E2bError(ApiError::new(status, code, msg)).into_response(),
        Plane::Envd => (status, axum::Json(RpcError::new("unavailable", msg).json())).into_response(),
    }
}

/// The peer holding `id`: the cached answer, else the first peer that answers its
/// `GET /v1/sandboxes/{id}` with 200.
async fn owner(fleet: &Fleet, peers: &[Peer], id: &SandboxId) -> Option<Peer> {
    if let Some(name) = fleet.cached_owner(id.as_str()) {
        if let Some(p) = peers.iter().find(|p| p.name == name) {
            return Some(p.clone());
        }
    }
    let asks = peers.iter().map(|p| async move {
        let req = axum::http::Request::builder()
            .method(Method::GET)
            .uri(format!("/v1/sandboxes/{id}"))
            .header(header::HOST, &p.authority)
            .header(header::AUTHORIZATION, format!("Bearer {}", p.token))
            .header(FORWARDED, "lookup")
            .body(Body::empty())
            .ok()?;
        let r = tokio::time::timeout(LOOKUP_TIMEOUT, send(p, req)).await.ok()?.ok()?;
        (r.status() == StatusCode::OK).then(|| p.clone())
    });
    let found = futures_util::future::join_all(asks).await.into_iter().flatten().next()?;
    fleet.remember_owner(id.as_str(), &found.name);
    Some(found)
}

/// A request's method, URI and headers, kept to send it again: to each peer, or to a peer after
/// this node answered it.
pub(super) struct Head {
    method: Method,
    uri: axum::http::Uri,
    headers: HeaderMap,
}

impl Head {
    pub(super) fn of(req: &Request) -> Head {
        Head { method: req.method().clone(), uri: req.uri().clone(), headers: req.headers().clone() }
    }

    /// The request again, with `body`.
    pub(super) fn with(&self, body: Body) -> Request {
        let mut r = Request::new(body);
        *r.method_mut() = self.method.clone();
        *r.uri_mut() = self.uri.clone();
        *r.headers_mut() = self.headers.clone();
        r
    }
}

/// Headers that belong to one connection, carry the client's credentials for this node, or
/// were checked here (`Origin`, by the guard, which runs before this layer).
fn dropped(name: &HeaderName, plane: Plane) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "cookie"
            | "x-api-key"
            | "x-access-token"
            | "x-csrf-token"
            | "origin"
            | FORWARDED
    ) || (name == header::AUTHORIZATION && plane != Plane::Envd)
}

/// The request as the peer gets it: same method, path, query and body; the client's
/// credentials replaced with the peer's token (envd's `Authorization` names an account, not a
/// credential, and is kept).
pub fn outgoing(req: Request, peer: &Peer, plane: Plane, caller: &Caller) -> Request {
    let (parts, body) = req.into_parts();
    let mut out = Request::new(body);
    *out.method_mut() = parts.method;
    *out.uri_mut() =
        parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/").parse().unwrap_or_default();
    let h = out.headers_mut();
    for (k, v) in &parts.headers {
        if !dropped(k, plane) {
            h.append(k.clone(), v.clone());
        }
    }
    if let Ok(v) = HeaderValue::from_str(&peer.authority) {
        h.insert(header::HOST, v);
    }
    if let Ok(v) = HeaderValue::from_str(&caller.0) {
        h.insert(FORWARDED, v);
    } else {
        h.insert(FORWARDED, HeaderValue::from_static("1"));
    }
    let cred = match plane {
        Plane::V1 => (header::AUTHORIZATION, format!("Bearer {}", peer.token)),
        Plane::E2bControl | Plane::Envd => (HeaderName::from_static("x-api-key"), peer.token.clone()),
    };
    if let Ok(mut v) = HeaderValue::from_str(&cred.1) {
        v.set_sensitive(true);
        h.insert(cred.0, v);
    }
    out
}

/// One request to a peer over a fresh connection; the answer's body streams as it comes.
pub(super) async fn send(
    peer: &Peer,
    req: Request,
) -> Result<axum::http::Response<hyper::body::Incoming>, String> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(&peer.authority))
        .await
        .map_err(|_| format!("no connection in {} s", CONNECT_TIMEOUT.as_secs()))?
        .map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    let (mut tx, conn) = hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!("connection to a fleet peer ended: {e}");
        }
    });
    tx.send_request(req).await.map_err(|e| e.to_string())
}

/// The peer's answer as the client gets it: connection headers dropped, the body streamed; an
/// E2B control-plane JSON answer has its access tokens re-derived from the client's key.
pub(super) async fn incoming(
    resp: axum::http::Response<hyper::body::Incoming>,
    plane: Plane,
    presented: Option<&str>,
) -> Response {
    let (mut parts, body) = resp.into_parts();
    for name in ["connection", "keep-alive", "transfer-encoding", "trailer", "upgrade"] {
        parts.headers.remove(name);
    }
    let json = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if plane != Plane::E2bControl || !json || !parts.status.is_success() {
        return Response::from_parts(parts, Body::new(body));
    }
    let Ok(bytes) = axum::body::to_bytes(Body::new(body), MAX_REWRITTEN).await else {
        return error(
            plane,
            StatusCode::BAD_GATEWAY,
            "peer_unavailable",
            "the owning node's answer was cut short or too large".into(),
        );
    };
    let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    rewrite_access_tokens(&mut v, presented, 0);
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(serde_json::to_vec(&v).unwrap_or_default()))
}

/// Replaces each `envdAccessToken` beside a `sandboxID` with the one derived from `presented`
/// (or null when this node takes no key), in objects up to a few levels down.
pub fn rewrite_access_tokens(v: &mut serde_json::Value, presented: Option<&str>, depth: usize) {
    if depth > 4 {
        return;
    }
    match v {
        serde_json::Value::Array(items) => {
            items.iter_mut().for_each(|i| rewrite_access_tokens(i, presented, depth + 1))
        }
        serde_json::Value::Object(map) => {
            let id = map.get("sandboxID").and_then(|s| s.as_str()).map(str::to_string);
            if let (Some(id), Some(tok)) = (id, map.get_mut("envdAccessToken")) {
                if !tok.is_null() {
                    *tok = presented
                        .map(|k| Tokens::sandbox_token(k, &id).into())
                        .unwrap_or(serde_json::Value::Null);
                }
            }
            map.values_mut().for_each(|x| rewrite_access_tokens(x, presented, depth + 1));
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> Peer {
        Peer {
            name: "n3".into(),
            authority: "127.0.0.3:7420".into(),
            token: "bbx_peer_token_0123456789".into(),
        }
    }

    fn id() -> SandboxId {
        SandboxId::generate()
    }

    #[test]
    fn requests_name_their_sandbox_by_path_or_envd_header() {
        let id = id();
        let none = HeaderMap::new();
        assert_eq!(target_of(&format!("/v1/sandboxes/{id}/commands"), &none), Some((id.clone(), Plane::V1)));
        assert_eq!(target_of(&format!("/v1/sandboxes/{id}"), &none), Some((id.clone(), Plane::V1)));
        assert_eq!(
            target_of(&format!("/e2b/sandboxes/{id}/connect"), &none),
            Some((id.clone(), Plane::E2bControl))
        );
        assert_eq!(
            target_of(&format!("/e2b/v2/sandboxes/{id}/connect"), &none),
            Some((id.clone(), Plane::E2bControl))
        );
        let mut h = HeaderMap::new();
        h.insert("e2b-sandbox-id", id.as_str().parse().unwrap());
        assert_eq!(target_of("/e2b/envd/process.Process/Start", &h), Some((id.clone(), Plane::Envd)));
        for p in [
            "/v1/sandboxes",
            "/v1/sandboxes/",
            "/v1/sandboxes/not-an-id/x",
            "/e2b/sandboxes",
            "/v1/snapshots/x",
        ] {
            assert_eq!(target_of(p, &none), None, "{p}");
        }
        assert_eq!(target_of("/e2b/envd/health", &none), None);
    }

    #[test]
    fn a_forwarded_request_carries_the_mark_that_stops_a_second_hop_and_only_the_peers_token() {
        let req = axum::http::Request::builder()
            .method("POST")
            .uri("http://127.0.0.2:1/v1/sandboxes/x/commands?wait=1")
            .header("authorization", "Bearer client-token-for-node2")
            .header("cookie", "bbx_session=abc")
            .header("origin", "http://127.0.0.2:1")
            .header("x-api-key", "client-key")
            .header("connection", "keep-alive")
            .header(FORWARDED, "spoofed")
            .header("content-type", "application/json")
            .body(Body::empty())
            .unwrap();
        assert!(was_forwarded(req.headers()), "a request already marked is served where it arrives");
        let out = outgoing(req, &peer(), Plane::V1, &Caller("tok-abc".into()));
        assert!(was_forwarded(out.headers()), "a peer receiving it must not forward it again");
        assert_eq!(out.headers()[FORWARDED], "tok-abc");
        assert_eq!(out.uri(), "/v1/sandboxes/x/commands?wait=1");
        assert_eq!(out.headers()["host"], "127.0.0.3:7420");
        assert_eq!(out.headers()["authorization"], "Bearer bbx_peer_token_0123456789");
        assert_eq!(out.headers().get_all("authorization").iter().count(), 1);
        for gone in ["cookie", "x-api-key", "connection", "origin"] {
            assert!(!out.headers().contains_key(gone), "{gone} was passed on");
        }
        assert_eq!(out.headers()["content-type"], "application/json");
    }

    #[test]
    fn envd_keeps_its_account_header_and_swaps_the_access_token_for_the_peers_key() {
        let req = axum::http::Request::builder()
            .uri("/e2b/envd/files?path=x")
            .header("authorization", "Basic dXNlcjo=")
            .header("x-access-token", "client-sandbox-token")
            .body(Body::empty())
            .unwrap();
        let out = outgoing(req, &peer(), Plane::Envd, &Caller("tok-abc".into()));
        assert_eq!(out.headers()["authorization"], "Basic dXNlcjo=");
        assert_eq!(out.headers()["x-api-key"], "bbx_peer_token_0123456789");
        assert!(!out.headers().contains_key("x-access-token"));
    }

    #[test]
    fn e2b_access_tokens_in_answers_derive_from_the_clients_key() {
        let sid = id();
        let peer_derived = Tokens::sandbox_token("bbx_peer_token_0123456789", sid.as_str());
        let mut v = serde_json::json!([{"sandboxID": sid.as_str(), "envdAccessToken": peer_derived},
                                       {"sandboxes": [{"sandboxID": sid.as_str(), "envdAccessToken": "x"}]}]);
        rewrite_access_tokens(&mut v, Some("client-key-0123456789"), 0);
        let mine = Tokens::sandbox_token("client-key-0123456789", sid.as_str());
        assert_eq!(v[0]["envdAccessToken"], mine.as_str());
        assert_eq!(v[1]["sandboxes"][0]["envdAccessToken"], mine.as_str());
        rewrite_access_tokens(&mut v, None, 0);
        assert!(v[0]["envdAccessToken"].is_null());
        assert!(!v.to_string().contains(&peer_derived));
    }
}
