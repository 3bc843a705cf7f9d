//! Fleet-wide listings: on a node with peers, `GET /v1/sandboxes` and E2B's
//! `GET /e2b/sandboxes` and `GET /e2b/v2/sandboxes` answer with the sandboxes of every node, so
//! a client that knows one node's address lists the fleet.
//!
//! The listing is asked of every peer at once, marked as forwarded (each answers with its own
//! sandboxes only), with the client's query, and merged with this node's own answer. Every
//! node filters alike, so the merge only has to keep the order: branchbox's listing (one page,
//! in creation order) becomes one page of all the nodes' sandboxes, each entry with the `node`
//! that holds it; E2B's pages stay pages, since each node answers the first `limit` sandboxes
//! after the same `nextToken` position (start time, then id) and the merged page is the first
//! `limit` of those. A peer that does not answer in [`PEER_DEADLINE`] (or answers something
//! else than a listing) is named in [`UNANSWERED`], never left out silently. `local=true` lists
//! this node's sandboxes only.

use super::forward::{
    authenticate, error, outgoing, rewrite_access_tokens, send, was_forwarded, Head, Plane,
};
use super::{Fleet, Peer};
use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};
use std::time::Duration;

/// Longest a peer may take to answer a listing, its body included.
pub const PEER_DEADLINE: Duration = Duration::from_secs(3);
/// Largest listing read from one node.
const MAX_LISTING: usize = 8 << 20;
/// E2B's page length when the query gives none (as E2B's listing in `crate::e2b::rest`).
const E2B_DEFAULT_PAGE: usize = 100;
/// Names the peers whose sandboxes a merged listing lacks, each with why:
/// `n4 (no answer in 3 s), n5 (answered 500)`.
pub const UNANSWERED: &str = "x-branchbox-peers-unanswered";
/// E2B's header with the next page's token.
const NEXT_TOKEN: &str = "x-next-token";

/// The plane of a listing request, `None` for any other request.
pub fn plane_of(method: &Method, path: &str) -> Option<Plane> {
    if method != Method::GET {
        return None;
    }
    super::forward::sandboxes_collection(path)
}

/// What the merge needs of the query: `local`, and E2B's `limit` and `order` (which each node's
/// own handler checks; a bad one fails there first).
#[derive(Debug, Default, PartialEq, Eq)]
struct Query {
    local: bool,
    limit: Option<usize>,
    /// `order` as given: `Some(true)` for `desc`, `Some(false)` for `asc`.
    desc: Option<bool>,
}

impl Query {
    /// Whether the merged listing runs newest first: as asked, else as each node's own handler
    /// orders it without `order` (E2B's newest first, as E2B's server answers; branchbox's
    /// `/v1` listing in creation order).
    fn newest_first(&self, plane: Plane) -> bool {
        self.desc.unwrap_or(plane != Plane::V1)
    }
}

fn query(raw: Option<&str>) -> Result<Query, String> {
    let mut q = Query::default();
    for (k, v) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
        match &*k {
            "local" => {
                q.local = match &*v {
                    "true" => true,
                    "false" => false,
                    other => {
                        let shown: String = other.chars().take(32).collect();
                        return Err(format!("local {shown:?} is not true or false"));
                    }
                }
            }
            "limit" => q.limit = v.parse().ok(),
            "order" => {
                q.desc = match &*v {
                    "desc" => Some(true),
                    "asc" => Some(false),
                    _ => None,
                }
            }
            _ => {}
        }
    }
    Ok(q)
}

/// Where an entry sits in the listing's order: its creation time in ms, then its id.
type Key = (i64, String);

fn key(plane: Plane, entry: &Map<String, Value>) -> Option<Key> {
    let text = |k: &str| entry.get(k).and_then(Value::as_str);
    match plane {
        Plane::V1 => Some((entry.get("created_ms")?.as_i64()?, text("id")?.to_string())),
        _ => {
            let ms = chrono::DateTime::parse_from_rfc3339(text("startedAt")?).ok()?.timestamp_millis();
            Some((ms, text("sandboxID")?.to_string()))
        }
    }
}

/// One node's answer: its entries in order, and whether it has more after them.
struct Page {
    entries: Vec<(Key, Map<String, Value>)>,
    more: bool,
}

async fn page_of(plane: Plane, resp: axum::http::Response<Body>) -> Result<Page, String> {
    let more = resp.headers().contains_key(NEXT_TOKEN);
    let bytes = axum::body::to_bytes(resp.into_body(), MAX_LISTING)
        .await
        .map_err(|_| format!("its listing was cut short or is over {} MiB", MAX_LISTING >> 20))?;
    let unreadable = || "its listing is not a list of sandboxes this node can read".to_string();
    let items: Vec<Value> = serde_json::from_slice(&bytes).map_err(|_| unreadable())?;
    let mut entries = Vec::with_capacity(items.len());
    for item in items {
        let Value::Object(map) = item else { return Err(unreadable()) };
        entries.push((key(plane, &map).ok_or_else(unreadable)?, map));
    }
    Ok(Page { entries, more })
}

/// The listing of one peer, within [`PEER_DEADLINE`]; `Err` says why there is none.
async fn ask(peer: &Peer, plane: Plane, req: Request) -> Result<Page, String> {
    let asked = async {
        let r = send(peer, req).await.map_err(|e| format!("did not answer: {e}"))?;
        if r.status() != StatusCode::OK {
            return Err(format!("answered {}", r.status().as_u16()));
        }
        page_of(plane, r.map(Body::new)).await
    };
    tokio::time::timeout(PEER_DEADLINE, asked)
        .await
        .unwrap_or_else(|_| Err(format!("no answer in {} s", PEER_DEADLINE.as_secs())))
}

/// Serves a listing: here only when it asks for `local=true`, was forwarded, or this node has
/// no peers; else merged from this node's answer and every peer's.
pub async fn list(fleet: Fleet, plane: Plane, req: Request, next: Next) -> Response {
    let q = match query(req.uri().query()) {
        Ok(q) => q,
        Err(why) => return error(plane, StatusCode::BAD_REQUEST, "bad_query", why),
    };
    if q.local || !fleet.enabled() || was_forwarded(req.headers()) {
        return next.run(req).await;
    }
    let peers = fleet.peers();
    if peers.is_empty() {
        return next.run(req).await;
    }
    let Some((caller, presented)) = authenticate(fleet.state().tokens.as_ref(), &req, None, plane) else {
        return next.run(req).await;
    };
    let head = Head::of(&req);
    let asks = peers.iter().map(|p| ask(p, plane, outgoing(head.with(Body::empty()), p, plane, &caller)));
    let (here, there) = tokio::join!(next.run(req), futures_util::future::join_all(asks));
    if here.status() != StatusCode::OK {
        return here;
    }
    let mine = match page_of(plane, here).await {
        Ok(p) => p,
        Err(why) => {
            let msg = format!("this node's own listing failed ({why}); list it alone with local=true");
            return error(plane, StatusCode::INTERNAL_SERVER_ERROR, "internal", msg);
        }
    };
    let mut unanswered = Vec::new();
    let mut pages = vec![(fleet.node_name(), mine)];
    for (peer, got) in peers.iter().zip(there) {
        match got {
            Ok(page) => pages.push((Some(peer.name.clone()), page)),
            Err(why) => {
                tracing::warn!(
                    "fleet listing: peer {} ({}) {why}; its sandboxes are not listed",
                    peer.name,
                    peer.authority
                );
                unanswered.push(format!("{} ({})", peer.name, printable(&why)));
            }
        }
    }
    let limit = (plane != Plane::V1).then(|| q.limit.unwrap_or(E2B_DEFAULT_PAGE));
    let (mut entries, next_token) = merge(plane, pages, limit, q.newest_first(plane));
    if plane != Plane::V1 {
        entries.iter_mut().for_each(|e| rewrite_access_tokens(e, presented.as_deref(), 0));
    }
    let mut resp = axum::Json(Value::Array(entries)).into_response();
    let h = resp.headers_mut();
    if let Some(v) = next_token.and_then(|t| HeaderValue::from_str(&t).ok()) {
        h.insert(NEXT_TOKEN, v);
    }
    if !unanswered.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&unanswered.join(", ")) {
            h.insert(UNANSWERED, v);
        }
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    resp
}

/// A reason fit for a header: visible ASCII and spaces, at most 120 characters.
fn printable(why: &str) -> String {
    why.chars().map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '?' }).take(120).collect()
}

/// Merges the nodes' pages in the listing's order; branchbox's entries get the `node` they came
/// from (when it has a name). With a `limit` (E2B's pages) it keeps the first `limit` and hands
/// out the next page's token (`<ms>.<id>` of the last kept) while any node has more.
fn merge(
    plane: Plane,
    pages: Vec<(Option<String>, Page)>,
    limit: Option<usize>,
    desc: bool,
) -> (Vec<Value>, Option<String>) {
    let mut more = false;
    let mut all: Vec<(Key, Map<String, Value>)> = Vec::new();
    for (node, page) in pages {
        more |= page.more;
        for (k, mut entry) in page.entries {
            if plane == Plane::V1 {
                match &node {
                    Some(n) => entry.insert("node".into(), Value::String(n.clone())),
                    None => entry.remove("node"),
                };
            }
            all.push((k, entry));
        }
    }
    all.sort_by(|a, b| if desc { b.0.cmp(&a.0) } else { a.0.cmp(&b.0) });
    let Some(limit) = limit else { return (all.into_iter().map(|(_, e)| Value::Object(e)).collect(), None) };
    more |= all.len() > limit;
    all.truncate(limit);
    let next = more.then(|| all.last().map(|((ms, id), _)| format!("{ms}.{id}"))).flatten();
    (all.into_iter().map(|(_, e)| Value::Object(e)).collect(), next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e2b(ms: i64, id: &str) -> (Key, Map<String, Value>) {
        let mut m = Map::new();
        m.insert("sandboxID".into(), id.into());
        ((ms, id.to_string()), m)
    }

    fn ids(v: &[Value]) -> Vec<&str> {
        v.iter().map(|e| e["sandboxID"].as_str().unwrap()).collect()
    }

    #[test]
    fn the_query_says_local_only_and_a_bad_value_is_named() {
        assert_eq!(query(None).unwrap(), Query::default());
        let q = query(Some("limit=5&order=desc&local=false&metadata=a%3Db")).unwrap();
        assert_eq!(q, Query { local: false, limit: Some(5), desc: Some(true) });
        // Without `order`, E2B's listings merge newest first, as each node's handler answers
        // them; branchbox's own in creation order.
        let q = query(Some("limit=1")).unwrap();
        assert!(q.newest_first(Plane::E2bControl));
        assert!(!q.newest_first(Plane::V1));
        assert!(!query(Some("order=asc")).unwrap().newest_first(Plane::E2bControl));
        assert!(query(Some("local=true")).unwrap().local);
        let err = query(Some("local=yes")).unwrap_err();
        assert!(err.contains("local") && err.contains("yes"), "{err}");
    }

    #[test]
    fn merged_e2b_pages_are_the_first_limit_of_all_nodes_with_a_token_while_any_has_more() {
        // Node a: 1, 4 (and more after); node b: 2, 3. Each answered its first two.
        let a = Page { entries: vec![e2b(1, "a1"), e2b(4, "a4")], more: true };
        let b = Page { entries: vec![e2b(2, "b2"), e2b(3, "b3")], more: false };
        let (page, next) = merge(Plane::E2bControl, vec![(None, a), (None, b)], Some(2), false);
        assert_eq!(ids(&page), ["a1", "b2"]);
        assert_eq!(next.as_deref(), Some("2.b2"));
        // Fewer than the limit in all and nobody has more: the last page, no token.
        let a = Page { entries: vec![e2b(5, "a5")], more: false };
        let b = Page { entries: vec![e2b(5, "b5")], more: false };
        let (page, next) = merge(Plane::E2bControl, vec![(None, a), (None, b)], Some(3), false);
        assert_eq!((ids(&page), next), (vec!["a5", "b5"], None));
        // Newest first, as each node answered with order=desc.
        let a = Page { entries: vec![e2b(9, "a9"), e2b(1, "a1")], more: false };
        let b = Page { entries: vec![e2b(5, "b5")], more: false };
        let (page, next) = merge(Plane::E2bControl, vec![(None, a), (None, b)], Some(2), true);
        assert_eq!((ids(&page), next.as_deref()), (vec!["a9", "b5"], Some("5.b5")));
    }

    #[test]
    fn branchbox_entries_carry_their_node_and_the_merge_keeps_creation_order() {
        let entry = |ms: i64, id: &str| {
            let v = serde_json::json!({"id": id, "created_ms": ms, "node": "forged"});
            let Value::Object(m) = v else { unreachable!() };
            (key(Plane::V1, &m).unwrap(), m)
        };
        let here = Page { entries: vec![entry(1, "h1"), entry(7, "h7")], more: false };
        let peer = Page { entries: vec![entry(3, "p3")], more: false };
        let (all, next) = merge(Plane::V1, vec![(None, here), (Some("n3".into()), peer)], None, false);
        assert_eq!(next, None);
        let got: Vec<(&str, Option<&str>)> =
            all.iter().map(|e| (e["id"].as_str().unwrap(), e.get("node").and_then(Value::as_str))).collect();
        assert_eq!(got, [("h1", None), ("p3", Some("n3")), ("h7", None)]);
    }
}
