//! Framing: `u32 header_len | u32 body_len | header (JSON) | body (bytes)`, lengths big-endian.
//!
//! Both lengths are checked against hard limits before anything is allocated, so a hostile
//! peer cannot make the reader allocate more than [`MAX_HEADER`] + [`MAX_BODY`] bytes.

use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::io::{self, Read, Write};

/// Largest header accepted, in bytes.
pub const MAX_HEADER: usize = 64 * 1024;
/// Largest body accepted in one frame, in bytes.
pub const MAX_BODY: usize = 1024 * 1024;

/// One frame: a request id, a typed message and an optional binary body.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame<T> {
    /// Correlates a request with its responses.
    pub id: u64,
    /// The typed message.
    pub msg: T,
    /// Binary payload (file data, command output, stdin, entropy).
    pub body: Vec<u8>,
}

impl<T> Frame<T> {
    /// A frame with an empty body.
    pub fn new(id: u64, msg: T) -> Self {
        Frame { id, msg, body: Vec::new() }
    }

    /// A frame carrying `body`.
    pub fn with_body(id: u64, msg: T, body: Vec<u8>) -> Self {
        Frame { id, msg, body }
    }
}

/// What can go wrong reading or writing a frame.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The byte stream failed or ended inside a frame.
    #[error("agent connection failed: {0}")]
    Io(#[from] io::Error),
    /// A length field exceeds the protocol's limit.
    #[error("frame {what} of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// Which part was too large.
        what: &'static str,
        /// Announced length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The header is not valid JSON for the expected message type.
    #[error("malformed frame header (request id {id:?}): {source}")]
    BadHeader {
        /// The request id, when it could still be read.
        id: Option<u64>,
        /// The parse error.
        source: serde_json::Error,
    },
}

#[derive(Serialize)]
struct HeaderOut<'a, T> {
    id: u64,
    #[serde(flatten)]
    msg: &'a T,
}

#[derive(Deserialize)]
struct HeaderIn<T> {
    id: u64,
    #[serde(flatten)]
    msg: T,
}

#[derive(Deserialize)]
struct IdOnly {
    id: u64,
}

/// Raw frame parts, before the header is typed.
#[derive(Debug, Clone, PartialEq)]
pub struct RawFrame {
    /// JSON header bytes.
    pub header: Vec<u8>,
    /// Body bytes.
    pub body: Vec<u8>,
}

/// Reads one raw frame; `Ok(None)` on a clean end of stream at a frame boundary.
pub fn read_raw<R: Read>(r: &mut R) -> Result<Option<RawFrame>, FrameError> {
    let mut lens = [0u8; 8];
    let mut got = 0;
    while got < lens.len() {
        match r.read(&mut lens[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let header_len = u32::from_be_bytes([lens[0], lens[1], lens[2], lens[3]]) as usize;
    let body_len = u32::from_be_bytes([lens[4], lens[5], lens[6], lens[7]]) as usize;
    if header_len > MAX_HEADER {
        return Err(FrameError::TooLarge { what: "header", len: header_len, limit: MAX_HEADER });
    }
    if body_len > MAX_BODY {
        return Err(FrameError::TooLarge { what: "body", len: body_len, limit: MAX_BODY });
    }
    let mut header = vec![0u8; header_len];
    r.read_exact(&mut header)?;
    let mut body = vec![0u8; body_len];
    r.read_exact(&mut body)?;
    Ok(Some(RawFrame { header, body }))
}

/// Writes one raw frame and flushes.
pub fn write_raw<W: Write>(w: &mut W, header: &[u8], body: &[u8]) -> Result<(), FrameError> {
    if header.len() > MAX_HEADER {
        return Err(FrameError::TooLarge { what: "header", len: header.len(), limit: MAX_HEADER });
    }
    if body.len() > MAX_BODY {
        return Err(FrameError::TooLarge { what: "body", len: body.len(), limit: MAX_BODY });
    }
    let mut buf = Vec::with_capacity(8 + header.len() + body.len());
    buf.extend_from_slice(&(header.len() as u32).to_be_bytes());
    buf.extend_from_slice(&(body.len() as u32).to_be_bytes());
    buf.extend_from_slice(header);
    buf.extend_from_slice(body);
    w.write_all(&buf)?;
    w.flush()?;
    Ok(())
}

/// Types a raw frame's header.
pub fn decode<T: DeserializeOwned>(raw: RawFrame) -> Result<Frame<T>, FrameError> {
    match serde_json::from_slice::<HeaderIn<T>>(&raw.header) {
        Ok(h) => Ok(Frame { id: h.id, msg: h.msg, body: raw.body }),
        Err(source) => {
            let id = serde_json::from_slice::<IdOnly>(&raw.header).ok().map(|i| i.id);
            Err(FrameError::BadHeader { id, source })
        }
    }
}

/// Serialises a frame's header.
pub fn encode_header<T: Serialize>(id: u64, msg: &T) -> Vec<u8> {
    // Serialising our own message types to JSON cannot fail: they hold no maps with
    // non-string keys and no types with failing Serialize impls.
    serde_json::to_vec(&HeaderOut { id, msg }).unwrap_or_default()
}

/// Reads and types one frame; `Ok(None)` on a clean end of stream.
pub fn read_frame<T: DeserializeOwned, R: Read>(r: &mut R) -> Result<Option<Frame<T>>, FrameError> {
    match read_raw(r)? {
        Some(raw) => decode(raw).map(Some),
        None => Ok(None),
    }
}

/// Writes one typed frame and flushes.
pub fn write_frame<T: Serialize, W: Write>(w: &mut W, frame: &Frame<T>) -> Result<(), FrameError> {
    write_raw(w, &encode_header(frame.id, &frame.msg), &frame.body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Request, Response};
    use proptest::prelude::*;

    #[test]
    fn frames_round_trip_with_binary_bodies() {
        let body: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
        let f = Frame::with_body(7, Request::Ping, body);
        let mut buf = Vec::new();
        write_frame(&mut buf, &f).unwrap();
        let back: Frame<Request> = read_frame(&mut buf.as_slice()).unwrap().unwrap();
        assert_eq!(back, f);
    }

    #[test]
    fn oversized_lengths_are_refused_before_allocating() {
        let mut buf = Vec::new();
        buf.extend_from_slice(&(u32::MAX).to_be_bytes());
        buf.extend_from_slice(&0u32.to_be_bytes());
        let err = read_frame::<Request, _>(&mut buf.as_slice()).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { what: "header", .. }), "{err}");
    }

    #[test]
    fn truncated_frame_is_an_error_not_a_clean_end() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &Frame::new(1, Request::Ping)).unwrap();
        buf.truncate(buf.len() - 1);
        assert!(read_frame::<Request, _>(&mut buf.as_slice()).is_err());
        assert!(read_frame::<Request, _>(&mut [0u8; 3].as_slice()).is_err());
        assert!(read_frame::<Request, _>(&mut [].as_slice()).unwrap().is_none());
    }

    #[test]
    fn unknown_operation_keeps_the_request_id_for_the_error_reply() {
        let header = br#"{"id":42,"op":"format_disk"}"#;
        let mut buf = Vec::new();
        write_raw(&mut buf, header, b"").unwrap();
        match read_frame::<Request, _>(&mut buf.as_slice()) {
            Err(FrameError::BadHeader { id, .. }) => assert_eq!(id, Some(42)),
            other => panic!("expected a header error, got {other:?}"),
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_the_reader(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut r = bytes.as_slice();
            for _ in 0..4 {
                match read_frame::<Request, _>(&mut r) {
                    Ok(Some(_)) | Err(FrameError::BadHeader { .. }) => continue,
                    _ => break,
                }
            }
            let mut r = bytes.as_slice();
            let _ = read_frame::<Response, _>(&mut r);
        }

        #[test]
        fn arbitrary_json_headers_never_panic_the_decoder(s in "\\PC{0,200}") {
            let mut buf = Vec::new();
            write_raw(&mut buf, s.as_bytes(), b"").unwrap();
            let _ = read_frame::<Request, _>(&mut buf.as_slice());
        }
    }
}

#[cfg(test)]
mod every_message {
    use super::*;
    use crate::message::*;

    fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug + Clone>(msg: T) {
        let mut buf = Vec::new();
        write_frame(&mut buf, &Frame::new(3, msg.clone())).unwrap();
        let back: Frame<T> = read_frame(&mut buf.as_slice()).unwrap().unwrap();
        assert_eq!(back.msg, msg);
    }

    #[test]
    fn an_exit_status_from_an_older_agent_reads_as_not_oom_killed() {
        let old = r#"{"code":null,"signal":9,"timed_out":false,"truncated":false,"duration_ms":3}"#;
        let status: ExitStatus = serde_json::from_str(old).unwrap();
        assert!(!status.oom_killed);
        assert_eq!(status.signal, Some(9));
    }

    #[test]
    fn every_response_shape_survives_the_wire() {
        let stat = FileStat {
            name: "/a".into(),
            kind: FileKind::File,
            size: 1,
            mode: 0o644,
            mtime_ns: 5,
            owner: None,
            group: None,
        };
        let status = ExitStatus {
            code: Some(0),
            signal: None,
            timed_out: false,
            truncated: true,
            duration_ms: 2,
            oom_killed: true,
        };
        let hook = HookReport {
            entropy: StepOutcome::Applied,
            clock: StepOutcome::Unsupported("x".into()),
            hostname: StepOutcome::Failed("y".into()),
            machine_id: StepOutcome::Applied,
            duration_us: 7,
        };
        for r in [
            Response::Stat(stat.clone()),
            Response::Entries { entries: vec![stat], truncated: false },
            Response::Exited(status.clone()),
            Response::Procs {
                procs: vec![ProcInfo { pid: 4, cmd: Command::Shell("x".into()), exit: Some(status) }],
            },
            Response::Thawed { hook: Some(hook) },
            Response::Error { code: ErrorCode::NotFound, message: "m".into() },
        ] {
            round_trip(r);
        }
        round_trip(Request::Exec(ExecSpec::new(Command::Argv(vec!["true".into()]))));
    }
}
