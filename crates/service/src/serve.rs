//! The HTTP server loop: HTTP/1.1 connections with a header-read timeout and a cap on open
//! connections. `axum::serve` has neither, so a client could hold any number of connections
//! open by never finishing its headers.

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

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
