//! UDP to a networked sandbox's exposed port, relayed over a WebSocket:
//! `GET /v1/sandboxes/{id}/udp/{port}`. Each binary message from the client is one datagram,
//! sent to `port` at the sandbox's router address from a UDP socket the service opens where
//! the HTTP proxy connects (the host, or inside the uplink namespace); each datagram that socket
//! receives (only the sandbox's port can answer a connected socket) is one binary message back.
//! Nothing of the request reaches the sandbox, only the datagrams.
//!
//! A text message, or one over [`MAX_DATAGRAM`] bytes, ends the relay with a policy-violation
//! close (1008) and the reason; so does [`IDLE`] without a datagram either way (a normal close).

use super::places::{upgrade, Cap};
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{sandbox_id, ApiQuery};
use crate::state::AppState;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{close_code, CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use std::io::ErrorKind;
use std::time::Duration;
use tokio::net::UdpSocket;
use utoipa::IntoParams;

/// Largest datagram relayed: the most a UDP datagram over IPv4 carries.
pub const MAX_DATAGRAM: usize = 65_507;
/// Largest WebSocket message (or frame) read at all; between this and [`MAX_DATAGRAM`] a
/// message is read and refused with its size, past it refused unread.
const MAX_MESSAGE: usize = 128 * 1024;
/// How long a relay lasts without a datagram either way.
pub const IDLE: Duration = Duration::from_secs(120);
/// Most relays open at once in one service (each holds a socket and a 64 KiB buffer).
pub const MAX_RELAYS: usize = 256;
/// The longest reason a close frame carries (RFC 6455 section 5.5: 125 bytes, two of them
/// the code).
const MAX_REASON: usize = 123;

static RELAYS: Cap = Cap::new(MAX_RELAYS, "too_many_relays", "UDP relays");

/// How to open a relay.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UdpQuery {
    /// The console session's CSRF token, for a handshake signed in by the session cookie (as
    /// the terminal's); Bearer clients leave it out.
    pub csrf: Option<String>,
}

/// Relays UDP to `port` of a networked sandbox over a WebSocket: each binary message is one
/// datagram to the port, each datagram from it one binary message back (see
/// `docs/service.md`).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/udp/{port}", tag = "network",
    params(("id" = String, Path, description = "sandbox id"), ("port" = u16, Path, description = "1 to 65535"), UdpQuery),
    responses((status = 101, description = "switching to the WebSocket protocol"),
              (status = "4XX", body = ErrorBody, description = "bad id or port, not a WebSocket handshake (426), missing CSRF token (403), not found, or no network (422)"),
              (status = "5XX", body = ErrorBody, description = "the port cannot be reached (502), too many relays open (503)")))]
pub async fn open(
    State(st): State<AppState>,
    Path((id, port)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<UdpQuery>,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    let id = sandbox_id(&id)?;
    let port = super::network::port_number(&port)?;
    if let Some(tokens) = &st.tokens {
        tokens.check_csrf_param(&headers, q.csrf.as_deref())?;
    }
    let ws = upgrade(ws, "a UDP relay")?;
    let place = RELAYS.take()?;
    // Opened before answering, so a missing or networkless sandbox gets its status code.
    let socket = st.blocking(move |engine, _| Ok(engine.udp_port(&id, port)?)).await?;
    let socket = socket
        .and_then(|s| {
            s.set_nonblocking(true)?;
            UdpSocket::from_std(s)
        })
        .map_err(|e| {
            ApiError::new(
                StatusCode::BAD_GATEWAY,
                "port_unreachable",
                format!("cannot send UDP to port {port} of the sandbox ({e})"),
            )
        })?;
    Ok(ws.max_message_size(MAX_MESSAGE).max_frame_size(MAX_MESSAGE).on_upgrade(move |ws| async move {
        relay(ws, socket, IDLE).await;
        drop(place);
    }))
}

/// `reason` cut to what a close frame carries, on a character boundary.
fn fitted(reason: &str) -> &str {
    let mut end = reason.len().min(MAX_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason[..end]
}

/// Sends a close frame with `code` and `reason`; the relay ends after it either way.
async fn close(sink: &mut SplitSink<WebSocket, Message>, code: u16, reason: &str) {
    let frame = CloseFrame { code, reason: fitted(reason).into() };
    let _ = sink.send(Message::Close(Some(frame))).await;
}

/// Passes datagrams between the client's WebSocket and `socket` (connected to the sandbox's
/// port) until either side ends, a message is refused, or `idle` passes without a datagram.
/// A datagram refused by the sandbox's host (nothing listens on the port yet: ICMP port
/// unreachable) is lost, as UDP's are; the relay goes on.
pub async fn relay(ws: WebSocket, socket: UdpSocket, idle: Duration) {
    let (mut sink, mut stream) = ws.split();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let quiet = tokio::time::sleep(idle);
    tokio::pin!(quiet);
    loop {
        tokio::select! {
            msg = stream.next() => match msg {
                Some(Ok(Message::Binary(datagram))) => {
                    if datagram.len() > MAX_DATAGRAM {
                        let n = datagram.len();
                        let why = format!("a datagram is at most {MAX_DATAGRAM} bytes; this message had {n}");
                        close(&mut sink, close_code::POLICY, &why).await;
                        return;
                    }
                    match socket.send(&datagram).await {
                        Ok(_) => {}
                        Err(e) if e.kind() == ErrorKind::ConnectionRefused => {}
                        Err(e) => {
                            let why = format!("sending to the sandbox failed: {e}");
                            close(&mut sink, close_code::ERROR, &why).await;
                            return;
                        }
                    }
                    quiet.as_mut().reset(tokio::time::Instant::now() + idle);
                }
                Some(Ok(Message::Text(_))) => {
                    let why = "text messages are refused; send each datagram as a binary message";
                    close(&mut sink, close_code::POLICY, why).await;
                    return;
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                Some(Ok(Message::Close(_))) => {
                    // Sends the answer to the client's close, which the socket has queued.
                    let _ = sink.close().await;
                    return;
                }
                None => return,
                Some(Err(_)) => {
                    let why =
                        format!("unreadable message; send binary messages of at most {MAX_DATAGRAM} bytes");
                    close(&mut sink, close_code::POLICY, &why).await;
                    return;
                }
            },
            got = socket.recv(&mut buf) => match got {
                Ok(n) => {
                    let datagram = axum::body::Bytes::copy_from_slice(&buf[..n]);
                    if sink.send(Message::Binary(datagram)).await.is_err() {
                        return;
                    }
                    quiet.as_mut().reset(tokio::time::Instant::now() + idle);
                }
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => {}
                Err(e) => {
                    let why = format!("receiving from the sandbox failed: {e}");
                    close(&mut sink, close_code::ERROR, &why).await;
                    return;
                }
            },
            () = &mut quiet => {
                let why = format!("no datagram either way for {} s", idle.as_secs_f64());
                close(&mut sink, close_code::NORMAL, &why).await;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use axum::Router;
    use std::net::SocketAddr;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    use tokio_tungstenite::tungstenite::Message as Client;

    /// A UDP socket that sends back every datagram it receives, reversed.
    async fn echo() -> SocketAddr {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65_536];
            while let Ok((n, from)) = socket.recv_from(&mut buf).await {
                buf[..n].reverse();
                let _ = socket.send_to(&buf[..n], from).await;
            }
        });
        addr
    }

    /// A real HTTP server whose one route relays to `to`, closing after `idle` of silence.
    async fn front(to: SocketAddr, idle: Duration) -> String {
        let app = Router::new().route(
            "/udp",
            get(move |ws: WebSocketUpgrade| async move {
                let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
                socket.connect(to).await.unwrap();
                ws.max_message_size(MAX_MESSAGE)
                    .max_frame_size(MAX_MESSAGE)
                    .on_upgrade(move |ws| relay(ws, socket, idle))
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        format!("ws://{addr}/udp")
    }

    type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

    async fn next(ws: &mut Ws) -> Client {
        tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("nothing from the relay within 10 s")
            .expect("the relay's stream ended")
            .expect("the relay's stream failed")
    }

    /// The close frame the relay ends with.
    async fn closed(ws: &mut Ws) -> (CloseCode, String) {
        match next(ws).await {
            Client::Close(Some(f)) => (f.code, f.reason.to_string()),
            other => panic!("not a close frame: {other:?}"),
        }
    }

    #[tokio::test]
    async fn datagrams_cross_both_ways_one_message_each() {
        let url = front(echo().await, IDLE).await;
        let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
        let all: Vec<u8> = (0..=255).collect();
        let big = vec![7u8; MAX_DATAGRAM];
        for datagram in [b"ping".to_vec(), all, Vec::new(), big] {
            ws.send(Client::Binary(datagram.clone().into())).await.unwrap();
            let mut want = datagram.clone();
            want.reverse();
            match next(&mut ws).await {
                Client::Binary(got) => {
                    assert_eq!(got.to_vec(), want, "a datagram of {} bytes", datagram.len())
                }
                other => panic!("not a binary message: {other:?}"),
            }
        }
        ws.close(None).await.unwrap();
        assert!(matches!(next(&mut ws).await, Client::Close(_)), "the relay did not answer the close");
    }

    #[tokio::test]
    async fn an_oversize_message_is_refused_with_a_policy_close() {
        let url = front(echo().await, IDLE).await;
        let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
        ws.send(Client::Binary(vec![0u8; MAX_DATAGRAM + 1].into())).await.unwrap();
        let (code, reason) = closed(&mut ws).await;
        assert_eq!(code, CloseCode::Policy);
        assert!(reason.contains("at most 65507 bytes") && reason.contains("65508"), "{reason}");
        // Past what is read at all, the message is refused unread, the same way.
        let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
        ws.send(Client::Binary(vec![0u8; MAX_MESSAGE + 1].into())).await.unwrap();
        let (code, reason) = closed(&mut ws).await;
        assert_eq!(code, CloseCode::Policy);
        assert!(reason.contains("at most 65507 bytes"), "{reason}");
    }

    #[tokio::test]
    async fn a_text_message_is_refused_with_a_policy_close() {
        let url = front(echo().await, IDLE).await;
        let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
        ws.send(Client::Text("ping".into())).await.unwrap();
        let (code, reason) = closed(&mut ws).await;
        assert_eq!(code, CloseCode::Policy);
        assert!(reason.contains("binary"), "{reason}");
    }

    #[tokio::test]
    async fn a_silent_relay_ends_after_its_idle_time_and_traffic_keeps_it() {
        let idle = Duration::from_millis(600);
        let url = front(echo().await, idle).await;
        let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
        for _ in 0..3 {
            tokio::time::sleep(idle / 3).await;
            ws.send(Client::Binary(b"keep".to_vec().into())).await.unwrap();
            assert!(matches!(next(&mut ws).await, Client::Binary(_)));
        }
        let (code, reason) = closed(&mut ws).await;
        assert_eq!(code, CloseCode::Normal);
        assert!(reason.contains("no datagram either way"), "{reason}");
    }

    #[tokio::test]
    async fn datagrams_to_a_closed_port_are_lost_and_the_relay_goes_on() {
        let gone = {
            let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            s.local_addr().unwrap()
        };
        let url = front(gone, IDLE).await;
        let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
        for _ in 0..3 {
            ws.send(Client::Binary(b"anyone?".to_vec().into())).await.unwrap();
        }
        ws.send(Client::Ping(Vec::new().into())).await.unwrap();
        assert!(matches!(next(&mut ws).await, Client::Pong(_)), "the relay ended after refused datagrams");
    }

    #[test]
    fn reasons_are_cut_to_fit_a_close_frame_on_a_character_boundary() {
        assert_eq!(fitted("short"), "short");
        assert_eq!(fitted(&"x".repeat(200)).len(), MAX_REASON);
        assert_eq!(fitted(&"é".repeat(100)), "é".repeat(61));
    }
}
