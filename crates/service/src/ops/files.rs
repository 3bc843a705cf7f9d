//! Reading a sandbox's file as a streamed answer: the native API's download and envd's
//! `GET /files` both answer with this, so their limits and statuses are the same.

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use branchbox_protocol::FileKind;
use std::io::Write;
use std::time::Duration;

/// The answer's head: sent once the agent has sent the first bytes or ended the read, so
/// that a refusal (a FIFO or device, a path the account may not read) is an error status, not
/// a 200 with an empty body.
type Head = tokio::sync::oneshot::Sender<ApiResult<()>>;

/// A `Write` that hands file data to the response body as it arrives, up to a limit. A client
/// that stops reading for longer than `stall` ends the download, freeing the worker.
struct ChannelSink {
    tx: tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
    head: Option<Head>,
    left: u64,
    stall: Duration,
    rt: tokio::runtime::Handle,
}

impl ChannelSink {
    /// Ends the read: the head gets `outcome` if it has not gone yet; otherwise an error can
    /// only cut the body short (the client sees a truncated transfer).
    fn finish(mut self, outcome: ApiResult<()>) {
        match (self.head.take(), outcome) {
            (Some(head), outcome) => {
                let _ = head.send(outcome);
            }
            (None, Err(e)) => {
                let _ = self.tx.blocking_send(Err(std::io::Error::other(e.message)));
            }
            (None, Ok(())) => {}
        }
    }
}

impl Write for ChannelSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.len() as u64 > self.left {
            return Err(std::io::Error::other("the file grew past the download limit while it was read"));
        }
        self.left -= buf.len() as u64;
        if let Some(head) = self.head.take() {
            let _ = head.send(Ok(()));
        }
        let (tx, stall, chunk) = (&self.tx, self.stall, Bytes::copy_from_slice(buf));
        // The timer is made inside the runtime, whichever thread this runs on.
        let sent = self.rt.block_on(async move { tokio::time::timeout(stall, tx.send(Ok(chunk))).await });
        match sent {
            Ok(Ok(())) => Ok(buf.len()),
            Ok(Err(_)) => Err(std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away")),
            Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the client stopped reading")),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Streams the file at `path` of sandbox `id`, read as the image's account `user` (root when
/// `None`).
pub async fn read_as(
    st: &AppState,
    id: branchbox_model::SandboxId,
    path: String,
    user: Option<String>,
) -> ApiResult<Response> {
    let limit = st.cfg.max_download_bytes;
    // Stat first, so a missing file, a directory or an oversized file gets its status code
    // before the body starts.
    let u2 = user.clone();
    let (mut conn, size, path) = st
        .blocking(move |engine, st| {
            let mut conn = st.agent(engine, &id, Duration::ZERO)?;
            let s = conn.stat_as(&path, u2.as_deref())?;
            if s.kind == FileKind::Dir {
                return Err(ApiError::invalid(format!("{path} is a directory; list it with GET .../files/list")));
            }
            if s.size > limit {
                return Err(ApiError::too_large(format!(
                    "{path} has {} bytes, over the download limit of {limit}; read it in parts with a command (e.g. split)",
                    s.size
                )));
            }
            Ok((conn, s.size, path))
        })
        .await?;
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let (head_tx, head_rx) = tokio::sync::oneshot::channel();
    let (stall, rt) = (st.cfg.agent_stall, tokio::runtime::Handle::current());
    tokio::task::spawn_blocking(move || {
        let mut sink = ChannelSink { tx, head: Some(head_tx), left: limit, stall, rt };
        let r = conn.read_file_as(&path, &mut sink, limit, user.as_deref());
        sink.finish(r.map(|_| ()).map_err(ApiError::from));
    });
    head_rx.await.map_err(|_| ApiError::internal("the file's reader ended without an answer"))??;
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    let mut r = (StatusCode::OK, [(header::CONTENT_TYPE, "application/octet-stream")], body).into_response();
    r.headers_mut().insert("x-file-size", size.into());
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_download_whose_client_stops_reading_frees_its_worker() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_time().build().unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::channel(2);
        let mut sink = ChannelSink {
            tx,
            head: None,
            left: 1 << 20,
            stall: Duration::from_millis(50),
            rt: rt.handle().clone(),
        };
        // Nobody reads `rx`: two chunks fill the channel, the third waits out the stall limit.
        let mut written = 0;
        let e = loop {
            match sink.write(b"chunk") {
                Ok(n) => written += n,
                Err(e) => break e,
            }
        };
        assert_eq!((written, e.kind()), (10, std::io::ErrorKind::TimedOut));
        assert!(rx.try_recv().is_ok());
    }
}
