//! Requests the shim answers itself (they never reach the agent), spoken over the same socket
//! and framing as the agent protocol, with `shim_`-prefixed operation names.

use branchbox_model::{Error, Result};
use branchbox_protocol::frame::{decode, encode_header, read_raw, write_raw};
use serde::{Deserialize, Serialize};
use std::os::unix::net::UnixStream;
use std::path::Path;

/// Control requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ShimRequest {
    /// Checkpoint the sandbox into `image` (an absolute directory) and keep it running.
    ShimCheckpoint {
        /// Directory for runsc's checkpoint image.
        image: String,
        /// Answer as soon as the image is complete, before the sandbox runs again.
        #[serde(default)]
        early: bool,
    },
    /// Replace the running sandbox with the state in checkpoint `image` (same identity); the
    /// current state stays live until the target answers.
    ShimRollback {
        /// Directory of runsc's checkpoint image.
        image: String,
    },
    /// Pause every process.
    ShimPause,
    /// Resume after a pause.
    ShimResume,
    /// Destroy the sandbox and exit.
    ShimStop,
}

/// Control responses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum ShimResponse {
    /// Done.
    ShimDone,
    /// Failed.
    ShimError {
        /// What went wrong.
        message: String,
    },
}

/// Sends one control request on a fresh connection and waits for its answer.
pub fn call(socket: &Path, req: &ShimRequest) -> Result<()> {
    let mut conn = UnixStream::connect(socket).map_err(|e| {
        Error::Backend(format!("the sandbox's shim is not answering at {}: {e}", socket.display()))
    })?;
    write_raw(&mut conn, &encode_header(1, req), &[]).map_err(|e| Error::Backend(e.to_string()))?;
    let raw = read_raw(&mut conn)
        .map_err(|e| Error::Backend(e.to_string()))?
        .ok_or_else(|| Error::Backend("the shim closed the connection without answering".into()))?;
    match decode::<ShimResponse>(raw).map_err(|e| Error::Backend(e.to_string()))?.msg {
        ShimResponse::ShimDone => Ok(()),
        ShimResponse::ShimError { message } => Err(Error::Backend(message)),
    }
}
