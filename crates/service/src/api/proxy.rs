//! The proxy to a sandbox's exposed ports: `/v1/sandboxes/{id}/ports/{port}/{path}` is passed,
//! as HTTP/1.1, to the server listening on `port` inside networked sandbox `id`, at the
//! sandbox's router address (docs/network.md, "Exposed ports"). It sits behind the same token
//! as every other route, and the token never reaches the sandbox: the credentials the client
//! sent the service (`Authorization`, `Cookie`) and the hop-by-hop headers are dropped.
//!
//! A WebSocket joined through it holds two sockets for as long as both ends talk, so joined
//! WebSockets are bounded per sandbox, per token and in the service (`crate::streams`; 429
//! `too_many_streams` past a bound), and end when the service stops.
//!
//! Not in the OpenAPI document: what a route under it takes and answers is the sandbox
//! server's own.

use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;
use crate::streams::{self, Place};
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::{Extension, Router};
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// Longest wait for the sandbox's server to accept the connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Headers that describe one connection, not the message, and so are not passed on (RFC 9110
/// section 7.6.1), plus the client's credentials for the service.
const DROPPED: [HeaderName; 10] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::AUTHORIZATION,
    header::COOKIE,
];

/// The `Content-Security-Policy` of every proxied answer, replacing the sandbox's own: no
/// `allow-same-origin`, so a page is of no origin the service trusts.
const SANDBOXED: &str = "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads";

/// The proxy's routes; the caller adds authentication.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/sandboxes/{id}/ports/{port}", any(to_root))
        .route("/v1/sandboxes/{id}/ports/{port}/", any(to_root))
        .route("/v1/sandboxes/{id}/ports/{port}/{*rest}", any(to_path))
}

async fn to_root(
    State(st): State<AppState>,
    Path((id, port)): Path<(String, String)>,
    caller: Option<Extension<Caller>>,
    req: Request,
) -> Response {
    pass(st, id, port, String::new(), caller, req).await.unwrap_or_else(IntoResponse::into_response)
}

async fn to_path(
    State(st): State<AppState>,
    Path((id, port, rest)): Path<(String, String, String)>,
    caller: Option<Extension<Caller>>,
    req: Request,
) -> Response {
    pass(st, id, port, rest, caller, req).await.unwrap_or_else(IntoResponse::into_response)
}

/// What bounds a joined WebSocket's life: its place under the bounds (given back when it
/// ends) and the service's stop (which ends it).
pub struct Lifetime {
    place: Option<Place>,
    stopping: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl Lifetime {
    /// No bound and no stop: for a request that is no WebSocket handshake.
    pub fn unbounded() -> Lifetime {
        Lifetime { place: None, stopping: Box::pin(std::future::pending()) }
    }
}

async fn pass(
    st: AppState,
    id: String,
    port: String,
    rest: String,
    caller: Option<Extension<Caller>>,
    req: Request,
) -> Result<Response, ApiError> {
    let id = crate::extract::sandbox_id(&id)?;
    let port = super::network::port_number(&port)?;
    let lifetime = if wants_websocket(req.headers()) {
        let token = caller.as_ref().map_or("anonymous", |c| c.0 .0.as_str());
        let place = st.streams.take(streams::Kind::Socket, &id, token)?;
        Lifetime { place: Some(place), stopping: st.streams.stopping() }
    } else {
        Lifetime::unbounded()
    };
    // Opened where the sandbox's router answers: the host, or the uplink namespace
    // (BRANCHBOX_NET_UPLINK_NETNS) when there is one.
    let stream = st.blocking(move |engine, _| Ok(engine.connect_port(&id, port, CONNECT_TIMEOUT)?)).await?;
    let stream = stream
        .and_then(|s| {
            s.set_nonblocking(true)?;
            tokio::net::TcpStream::from_std(s)
        })
        .map_err(|e| unreachable(port, &e))?;
    forward(stream, port, &rest, req, lifetime).await
}

/// The answer when nothing takes a connection on `port` of the sandbox.
fn unreachable(port: u16, e: &dyn std::fmt::Display) -> ApiError {
    ApiError::new(
        StatusCode::BAD_GATEWAY,
        "port_unreachable",
        format!(
            "nothing answered on port {port} of the sandbox ({e}); is a server listening there on 0.0.0.0?"
        ),
    )
}

/// True when `headers` ask to switch the connection to WebSocket (RFC 6455 section 4.1): the
/// one upgrade passed on; any other (h2c, TLS) is dropped with the hop-by-hop headers.
fn wants_websocket(headers: &HeaderMap) -> bool {
    let upgrade = connection_tokens(headers).any(|t| t.eq_ignore_ascii_case("upgrade"));
    upgrade && headers.get(header::UPGRADE).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"))
}

/// Sends `req` over `stream` (to the HTTP server on `port` of the sandbox) as a request for
/// `/rest` (with the original query), streaming both bodies. A WebSocket handshake is passed
/// on as one: when the server switches protocols, the two connections are joined byte for
/// byte until either side closes or `lifetime` ends them.
pub async fn forward(
    stream: tokio::net::TcpStream,
    port: u16,
    rest: &str,
    mut req: Request,
    lifetime: Lifetime,
) -> Result<Response, ApiError> {
    let websocket = wants_websocket(req.headers());
    let client_side = websocket.then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    let path = match parts.uri.query() {
        Some(q) => format!("/{rest}?{q}"),
        None => format!("/{rest}"),
    };
    parts.uri = path.parse::<Uri>().map_err(|e| {
        ApiError::bad_request("invalid_path", format!("{path:?} is not a path to pass on: {e}"))
    })?;
    strip(&mut parts.headers);
    if websocket {
        parts.headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        parts.headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    }
    if let Some(host) = stream.peer_addr().ok().and_then(|a| HeaderValue::from_str(&a.to_string()).ok()) {
        parts.headers.insert(header::HOST, host);
    }
    parts.version = axum::http::Version::HTTP_11;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| unreachable(port, &e))?;
    tokio::spawn(async move {
        // Ends when either side is done; its error is the response's, reported below.
        let _ = conn.with_upgrades().await;
    });
    let mut answer =
        sender.send_request(axum::http::Request::from_parts(parts, body)).await.map_err(|e| {
            ApiError::new(
                StatusCode::BAD_GATEWAY,
                "port_failed",
                format!("the server on port {port} of the sandbox did not answer with HTTP: {e}"),
            )
        })?;
    let switched = answer.status() == StatusCode::SWITCHING_PROTOCOLS;
    let joined = match client_side {
        Some(client_side) if switched => {
            let server_side = hyper::upgrade::on(&mut answer);
            tokio::spawn(async move {
                let Lifetime { place, stopping } = lifetime;
                if let (Ok(client), Ok(server)) = (client_side.await, server_side.await) {
                    let (mut client, mut server) = (TokioIo::new(client), TokioIo::new(server));
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        () = stopping => {}
                    }
                }
                drop(place);
            });
            true
        }
        _ => false,
    };
    let (mut parts, body) = answer.into_parts();
    strip(&mut parts.headers);
    if joined {
        parts.headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        parts.headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    } else if switched {
        // A switch nobody asked for (or to another protocol) cannot be passed on.
        return Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            "port_failed",
            format!("the server on port {port} of the sandbox switched protocols unasked; only WebSocket upgrades pass"),
        ));
    }
    // What the sandbox serves comes from the service's own origin, beside the console: as a
    // page of its own origin it could read the console with a signed-in user's cookie. The
    // policy gives it an opaque origin instead (its scripts run, but what they ask of the
    // service is cross-origin), and it may not set cookies on the service's name.
    parts.headers.remove(header::SET_COOKIE);
    parts.headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(SANDBOXED));
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// The comma-separated tokens of every `Connection` header, trimmed.
fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
}

/// Removes the hop-by-hop headers, those `Connection` names, and the client's credentials.
fn strip(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> =
        connection_tokens(headers).filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok()).collect();
    for name in DROPPED.iter().chain(named.iter()) {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Reads from `s` up to the end of an HTTP head (the blank line), one read at a time, so
    /// nothing sent after the head in a later write is taken with it.
    async fn read_head(s: &mut tokio::net::TcpStream) -> Vec<u8> {
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "the connection ended before the end of the head");
            head.extend_from_slice(&buf[..n]);
        }
        head
    }

    /// A one-request HTTP server: answers `hello` and hands back the request head it read.
    async fn upstream() -> (SocketAddr, tokio::task::JoinHandle<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let head = read_head(&mut s).await;
            let reply =
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close, x-private\r\nx-private: 1\r\n\
                         x-kept: 2\r\nset-cookie: bb_session=planted; Path=/\r\n\
                         content-security-policy: default-src *\r\n\r\nhello";
            s.write_all(reply.as_bytes()).await.unwrap();
            String::from_utf8_lossy(&head).into_owned()
        });
        (addr, task)
    }

    #[tokio::test]
    async fn a_request_is_passed_on_without_the_clients_credentials() {
        let (addr, seen) = upstream().await;
        let req = axum::http::Request::get("/v1/sandboxes/x/ports/80/a/b?q=1")
            .header("authorization", "Bearer secret-token")
            .header("cookie", "bb_session=secret")
            .header("x-app", "kept")
            .body(Body::empty())
            .unwrap();
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let resp = forward(stream, addr.port(), "a/b", req, Lifetime::unbounded()).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers().get("x-kept").unwrap(), "2");
        assert!(resp.headers().get("x-private").is_none(), "a header Connection names was passed back");
        assert!(resp.headers().get("set-cookie").is_none(), "the sandbox set a cookie on the service's name");
        let csp: Vec<_> = resp.headers().get_all("content-security-policy").iter().collect();
        assert_eq!(csp, [SANDBOXED], "the sandbox's page kept an origin of the service's");
        let body = axum::body::to_bytes(resp.into_body(), 1024).await.unwrap();
        assert_eq!(&body[..], b"hello");
        let head = seen.await.unwrap().to_ascii_lowercase();
        assert!(head.starts_with("get /a/b?q=1 http/1.1\r\n"), "{head}");
        assert!(head.contains("x-app: kept"), "{head}");
        assert!(head.contains(&format!("host: {addr}")), "{head}");
        assert!(!head.contains("secret"), "the client's credentials reached the sandbox: {head}");
    }

    #[tokio::test]
    async fn a_server_that_does_not_speak_http_is_a_bad_gateway() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            s.write_all(b"SSH-2.0-not-http\r\n").await.unwrap();
        });
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = axum::http::Request::get("/").body(Body::empty()).unwrap();
        let e = forward(stream, addr.port(), "", req, Lifetime::unbounded()).await.unwrap_err();
        assert_eq!((e.status, e.code), (StatusCode::BAD_GATEWAY, "port_failed"));
        assert!(e.message.contains(&format!("port {}", addr.port())), "{}", e.message);
        server.await.unwrap();
    }

    /// A server that takes one WebSocket handshake (checking it arrived as one, without the
    /// client's credentials), switches protocols, then echoes what it reads in upper case.
    async fn websocket_upstream() -> (SocketAddr, tokio::task::JoinHandle<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let head = read_head(&mut s).await;
            let mut buf = [0u8; 1024];
            s.write_all(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\nsec-websocket-accept: x\r\n\r\n").await.unwrap();
            loop {
                let n = s.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                s.write_all(&buf[..n].to_ascii_uppercase()).await.unwrap();
            }
            String::from_utf8_lossy(&head).into_owned()
        });
        (addr, task)
    }

    #[tokio::test]
    async fn a_websocket_handshake_is_passed_on_and_the_connections_joined() {
        let (up, seen) = websocket_upstream().await;
        // The service side: a real HTTP server, whose connections hyper can hand over.
        let app = Router::new().route(
            "/{*rest}",
            any(move |req: Request| async move {
                let stream = tokio::net::TcpStream::connect(up).await.unwrap();
                forward(stream, up.port(), "ws", req, Lifetime::unbounded())
                    .await
                    .unwrap_or_else(IntoResponse::into_response)
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let front = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let mut c = tokio::net::TcpStream::connect(front).await.unwrap();
        c.write_all(
            b"GET /ws HTTP/1.1\r\nhost: x\r\nconnection: keep-alive, Upgrade\r\nupgrade: websocket\r\n\
                      sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\
                      authorization: Bearer secret-token\r\n\r\n",
        )
        .await
        .unwrap();
        let got = read_head(&mut c).await;
        let head = String::from_utf8_lossy(&got).to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 101"), "{head}");
        assert!(head.contains("upgrade: websocket") && head.contains("sec-websocket-accept: x"), "{head}");
        c.write_all(b"frames").await.unwrap();
        let mut echo = [0u8; 6];
        tokio::time::timeout(Duration::from_secs(10), c.read_exact(&mut echo))
            .await
            .expect("no echo within 10 s: the connections were not joined")
            .unwrap();
        assert_eq!(&echo, b"FRAMES", "bytes did not cross the joined connections");
        drop(c);
        let asked = seen.await.unwrap().to_ascii_lowercase();
        assert!(asked.starts_with("get /ws http/1.1\r\n"), "{asked}");
        assert!(asked.contains("upgrade: websocket") && asked.contains("connection: upgrade"), "{asked}");
        assert!(asked.contains("sec-websocket-key: dghlihnhbxbszsbub25jzq=="), "{asked}");
        assert!(!asked.contains("secret"), "the client's credentials reached the sandbox: {asked}");
    }

    #[tokio::test]
    async fn a_joined_websocket_holds_its_place_until_the_service_stops_it() {
        use crate::streams::{Kind, Streams};
        let (up, _seen) = websocket_upstream().await;
        let streams = std::sync::Arc::new(Streams::default());
        let (s2, id) = (streams.clone(), branchbox_model::SandboxId::generate());
        let app = Router::new().route(
            "/{*rest}",
            any(move |req: Request| {
                let (s2, id) = (s2.clone(), id.clone());
                async move {
                    let stream = tokio::net::TcpStream::connect(up).await.unwrap();
                    let place = s2.take(Kind::Socket, &id, "tok").unwrap();
                    let lifetime = Lifetime { place: Some(place), stopping: s2.stopping() };
                    forward(stream, up.port(), "ws", req, lifetime)
                        .await
                        .unwrap_or_else(IntoResponse::into_response)
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let front = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let mut c = tokio::net::TcpStream::connect(front).await.unwrap();
        c.write_all(
            b"GET /ws HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\nupgrade: websocket\r\n\
                      sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n",
        )
        .await
        .unwrap();
        read_head(&mut c).await;
        c.write_all(b"ping").await.unwrap();
        let mut echo = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(10), c.read_exact(&mut echo)).await.unwrap().unwrap();
        assert_eq!(streams.open(Kind::Socket), 1, "the joined socket holds no place");
        streams.stop();
        let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut echo))
            .await
            .expect("the joined socket outlived the service's stop")
            .unwrap();
        assert_eq!(n, 0);
        for _ in 0..100 {
            if streams.open(Kind::Socket) == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the stopped socket kept its place");
    }

    #[test]
    fn only_websocket_upgrades_count() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("WebSocket"));
        assert!(wants_websocket(&h));
        h.insert(header::UPGRADE, HeaderValue::from_static("h2c"));
        assert!(!wants_websocket(&h));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        assert!(!wants_websocket(&h), "an Upgrade header without Connection: upgrade");
    }
}
