//! Answers to requests whose body was left unread say `Connection: close`.
//!
//! A handler that does not read the request's body (a GET sent with one, or a request
//! refused before its body is read: 401, 404, 413) leaves the rest of that body on the
//! connection. hyper then closes the connection after the answer, and when the body arrived
//! after the headers it does so without saying `Connection: close`: a client that pools
//! connections sends its next request into a closing socket and sees "server disconnected
//! without sending a response". This layer notes whether the body was read to its end and,
//! when it was not, says so itself, so every client opens a fresh connection instead.

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::header::{HeaderValue, CONNECTION};
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

/// The layer (`axum::middleware::from_fn(close_if_unread)`), outermost.
pub async fn close_if_unread(req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    if body.is_end_stream() {
        return next.run(Request::from_parts(parts, body)).await;
    }
    let read = Arc::new(AtomicBool::new(false));
    let body = Body::new(Tracked { inner: body, read: read.clone() });
    let mut answer = next.run(Request::from_parts(parts, body)).await;
    if !read.load(Ordering::Acquire) {
        answer.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
    }
    answer
}

/// A request body that records when it has been read to its end.
struct Tracked {
    inner: Body,
    read: Arc<AtomicBool>,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        let ended = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => this.inner.is_end_stream(),
            _ => false,
        };
        if ended {
            this.read.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
