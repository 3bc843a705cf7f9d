//! Caps on long-lived WebSockets (terminals, UDP relays): an upgraded socket no longer counts
//! against the connection cap, so each kind bounds how many of it are open at once. Also the
//! one answer to a plain request at a WebSocket route.

use crate::error::{ApiError, ApiResult};
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::WebSocketUpgrade;
use axum::http::StatusCode;
use std::sync::atomic::{AtomicUsize, Ordering};

/// At most `max` of one kind open at once in this service.
pub struct Cap {
    open: AtomicUsize,
    max: usize,
    /// The error code past the cap.
    code: &'static str,
    /// What is counted, plural ("terminals").
    what: &'static str,
}

/// One place under a [`Cap`], given back when dropped.
pub struct Place(&'static Cap);

impl Cap {
    /// A cap of `max`, refused past it with a 503 `code` that names `what`.
    pub const fn new(max: usize, code: &'static str, what: &'static str) -> Cap {
        Cap { open: AtomicUsize::new(0), max, code, what }
    }

    /// A place, or a 503 when `max` are taken.
    pub fn take(&'static self) -> ApiResult<Place> {
        if self.open.fetch_add(1, Ordering::SeqCst) >= self.max {
            self.open.fetch_sub(1, Ordering::SeqCst);
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                self.code,
                format!("{} {} are open; close one and retry", self.max, self.what),
            ));
        }
        Ok(Place(self))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The upgrade, or a 426 `websocket_required` saying that `what` ("a terminal") is a WebSocket.
pub fn upgrade(
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
    what: &str,
) -> ApiResult<WebSocketUpgrade> {
    ws.map_err(|e| {
        ApiError::new(
            StatusCode::UPGRADE_REQUIRED,
            "websocket_required",
            format!("{what} is a WebSocket: open this URL with a WebSocket client ({e})"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    static CAP: Cap = Cap::new(3, "too_many_things", "things");

    #[test]
    fn places_are_given_back_and_the_cap_holds() {
        let held: Vec<Place> = (0..3).map(|_| CAP.take().unwrap()).collect();
        let e = CAP.take().err().expect("a place past the cap");
        assert_eq!((e.status, e.code), (StatusCode::SERVICE_UNAVAILABLE, "too_many_things"));
        assert_eq!(e.message, "3 things are open; close one and retry");
        drop(held);
        assert!(CAP.take().is_ok());
    }
}
