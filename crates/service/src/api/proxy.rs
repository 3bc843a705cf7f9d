//! The proxy to a sandbox's exposed ports: `/v1/sandboxes/{id}/ports/{port}/{path}` is passed,
//! as HTTP/1.1, to the server listening on `port` inside networked sandbox `id`, at the
//! sandbox's router address (docs/network.md, "Exposed ports"). It sits behind the same token
//! as every other route, and the token never reaches the sandbox: the credentials the client
//! sent the service (`Authorization`, `Cookie`) and the hop-by-hop headers are dropped.
//!
//! Not in the OpenAPI document: what a route under it takes and answers is the sandbox
//! server's own.

use crate::error::ApiError;
use crate::state::AppState;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use hyper_util::rt::TokioIo;
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
    req: Request,
) -> Response {
    pass(st, id, port, String::new(), req).await.unwrap_or_else(IntoResponse::into_response)
}

async fn to_path(
    State(st): State<AppState>,
    Path((id, port, rest)): Path<(String, String, String)>,
    req: Request,
) -> Response {
    pass(st, id, port, rest, req).await.unwrap_or_else(IntoResponse::into_response)
}

async fn pass(
    st: AppState,
    id: String,
    port: String,
    rest: String,
    req: Request,
) -> Result<Response, ApiError> {
    let id = super::extract::sandbox_id(&id)?;
    let port = super::network::port_number(&port)?;
    // Opened where the sandbox's router answers: the host, or the uplink namespace
    // (BRANCHBOX_NET_UPLINK_NETNS) when there is one.
    let stream = st.blocking(move |engine, _| Ok(engine.connect_port(&id, port, CONNECT_TIMEOUT)?)).await?;
    let stream = stream
        .and_then(|s| {
            s.set_nonblocking(true)?;
            tokio::net::TcpStream::from_std(s)
        })
        .map_err(|e| unreachable(port, &e))?;
    forward(stream, port, &rest, req).await
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

/// Sends `req` over `stream` (to the HTTP server on `port` of the sandbox) as a request for
/// `/rest` (with the original query), streaming both bodies.
pub async fn forward(
    stream: tokio::net::TcpStream,
    port: u16,
    rest: &str,
    req: Request,
) -> Result<Response, ApiError> {
    let (mut parts, body) = req.into_parts();
    let path = match parts.uri.query() {
        Some(q) => format!("/{rest}?{q}"),
        None => format!("/{rest}"),
    };
    parts.uri = path.parse::<Uri>().map_err(|e| {
        ApiError::bad_request("invalid_path", format!("{path:?} is not a path to pass on: {e}"))
    })?;
    strip(&mut parts.headers);
    if let Some(host) = stream.peer_addr().ok().and_then(|a| HeaderValue::from_str(&a.to_string()).ok()) {
        parts.headers.insert(header::HOST, host);
    }
    parts.version = axum::http::Version::HTTP_11;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| unreachable(port, &e))?;
    tokio::spawn(async move {
        // Ends when either side is done; its error is the response's, reported below.
        let _ = conn.await;
    });
    let answer = sender.send_request(axum::http::Request::from_parts(parts, body)).await.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "port_failed",
            format!("the server on port {port} of the sandbox did not answer with HTTP: {e}"),
        )
    })?;
    let (mut parts, body) = answer.into_parts();
    strip(&mut parts.headers);
    // What the sandbox serves comes from the service's own origin, beside the console: as a
    // page of its own origin it could read the console with a signed-in user's cookie. The
    // policy gives it an opaque origin instead (its scripts run, but what they ask of the
    // service is cross-origin), and it may not set cookies on the service's name.
    parts.headers.remove(header::SET_COOKIE);
    parts.headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(SANDBOXED));
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// Removes the hop-by-hop headers, those `Connection` names, and the client's credentials.
fn strip(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in DROPPED.iter().chain(named.iter()) {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-request HTTP server: answers `hello` and hands back the request head it read.
    async fn upstream() -> (SocketAddr, tokio::task::JoinHandle<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                assert!(n > 0, "the request ended early");
                head.extend_from_slice(&buf[..n]);
            }
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
        let resp = forward(stream, addr.port(), "a/b", req).await.unwrap();
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
        let e = forward(stream, addr.port(), "", req).await.unwrap_err();
        assert_eq!((e.status, e.code), (StatusCode::BAD_GATEWAY, "port_failed"));
        assert!(e.message.contains(&format!("port {}", addr.port())), "{}", e.message);
        server.await.unwrap();
    }
}
