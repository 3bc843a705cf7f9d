//! The branchbox agent protocol, shared by the host and the in-sandbox agent.
//!
//! A connection carries frames (see [`frame`]); each frame holds a typed JSON header and an
//! optional binary body. Requests ([`Request`]) and responses ([`Response`]) are correlated by
//! a request id; every request ends with exactly one terminal response. The full specification
//! is `docs/agent-protocol.md`.
//!
//! This crate does no process or file work of its own: the agent executes requests, the host
//! builds and reads them.

pub mod client;
pub mod follow;
pub mod frame;
pub mod limits;
pub mod message;
pub mod pty;

pub use client::{AgentClient, ClientError, ExecOutput, OutStream, Transport, ViolationHook};
pub use frame::{read_frame, write_frame, Frame, FrameError, MAX_BODY, MAX_HEADER};
pub use limits::Limits;
pub use message::*;
pub use pty::{PtyEvent, PtyInput, PtyOutput};

/// Protocol version spoken by this build; peers with another version are refused.
pub const PROTOCOL_VERSION: u32 = 1;

/// The AF_VSOCK port the agent listens on when it is PID 1 of a Linux microVM; each
/// connection speaks this protocol, exactly as the stdin/stdout pipes do under gVisor.
pub const AGENT_VSOCK_PORT: u32 = 1024;

/// Largest body a sender puts in one frame of a stream (file data, command output).
pub const CHUNK: usize = 256 * 1024;
/// Most output bytes one command returns, through the CLI or the service (docs/limits.md).
pub const MAX_EXEC_OUTPUT: u64 = 16 * 1024 * 1024;
