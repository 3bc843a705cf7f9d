//! A create this node has no room for goes to a peer: `POST /v1/sandboxes` and E2B's
//! `POST /e2b/sandboxes` and `POST /e2b/v2/sandboxes` are tried here first, and when this node
//! answers `at_capacity` (its `--max-sandboxes` reached), the same request goes to the peer with
//! the most room ([`super::capacity`]), then the next, until one makes the sandbox. The client
//! gets that peer's answer (an E2B access token in it re-derived from the client's key, as any
//! forwarded answer), with [`NODE`] naming the peer; later calls naming the sandbox are
//! forwarded to it as usual. When no peer makes it, the answer is 503 `at_capacity` saying that
//! the fleet is full, with what each peer said.

use super::forward::{authenticate, error, incoming, outgoing, send, Head, Plane};
use super::{capacity, Fleet, Peer};
use crate::error::ErrorCodeTag;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

/// Names the fleet node a create was passed on to.
pub const NODE: &str = "x-branchbox-node";

/// The plane of a create request, `None` for any other request.
pub fn plane_of(method: &Method, path: &str) -> Option<Plane> {
    if method != Method::POST {
        return None;
    }
    super::forward::sandboxes_collection(path)
}

/// Serves a create here, and passes it to a peer when this node is at capacity.
pub async fn create(fleet: Fleet, plane: Plane, req: Request, next: Next) -> Response {
    let peers = fleet.peers();
    if peers.is_empty() {
        return next.run(req).await;
    }
    let Some((caller, presented)) = authenticate(fleet.state().tokens.as_ref(), &req, None, plane) else {
        return next.run(req).await;
    };
    let head = Head::of(&req);
    // The body is kept to send it again; creates are small JSON, under the service's JSON limit.
    let max = fleet.state().cfg.max_json_bytes;
    let Ok(body) = axum::body::to_bytes(req.into_body(), max).await else {
        let msg = format!("the create's body could not be read whole or is over {max} bytes; send less");
        return error(plane, StatusCode::PAYLOAD_TOO_LARGE, "too_large", msg);
    };
    let here = next.run(head.with(Body::from(body.clone()))).await;
    if here.extensions().get::<ErrorCodeTag>().map(|c| c.0) != Some("at_capacity") {
        return here;
    }
    let rooms = capacity::of_peers(&peers).await;
    let mut said: Vec<String> = Vec::new();
    let mut roomy: Vec<(&Peer, usize)> = Vec::new();
    for (p, c) in peers.iter().zip(rooms) {
        match c {
            Ok(c) if c.room > 0 => roomy.push((p, c.room)),
            Ok(c) => said.push(format!("{} runs {} of at most {}", p.name, c.sandboxes, c.max_sandboxes)),
            Err(why) => said.push(format!("{} {why}", p.name)),
        }
    }
    // Most room first; the peers file's order between equals.
    roomy.sort_by_key(|r| std::cmp::Reverse(r.1));
    for (peer, _) in roomy {
        match on_peer(peer, plane, &head, &caller, body.clone()).await {
            Ok(resp) => {
                let mut out = incoming(resp, plane, presented.as_deref()).await;
                if let Ok(v) = HeaderValue::from_str(&peer.name) {
                    out.headers_mut().insert(NODE, v);
                }
                return out;
            }
            Err(why) => said.push(format!("{} {why}", peer.name)),
        }
    }
    let msg = format!(
        "the fleet is full: this node is at its --max-sandboxes and no peer took the sandbox ({}); kill some \
         sandboxes or retry later",
        said.join("; ")
    );
    error(plane, StatusCode::SERVICE_UNAVAILABLE, "at_capacity", msg)
}

/// The create sent to `peer`: its answer when it made the sandbox (or timed out making it, as
/// the sandbox may still come), else why not.
async fn on_peer(
    peer: &Peer,
    plane: Plane,
    head: &Head,
    caller: &crate::caller::Caller,
    body: Bytes,
) -> Result<axum::http::Response<hyper::body::Incoming>, String> {
    let r = send(peer, outgoing(head.with(Body::from(body)), peer, plane, caller))
        .await
        .map_err(|e| format!("did not answer: {e}"))?;
    if r.status().is_success() || r.status() == StatusCode::GATEWAY_TIMEOUT {
        return Ok(r);
    }
    let status = r.status().as_u16();
    let bytes = axum::body::to_bytes(Body::new(r.into_body()), 16 << 10).await.unwrap_or_default();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let message = v["error"]["message"].as_str().or(v["message"].as_str()).unwrap_or("");
    let shown: String = message.chars().take(300).collect();
    Err(format!("answered {status}: {shown}"))
}
