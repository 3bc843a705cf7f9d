//! The Connect protocol over HTTP/1.1, as far as envd's clients use it: unary calls
//! (`application/json` or `application/proto` bodies) and server-streaming calls
//! (`application/connect+json` or `application/connect+proto`: one enveloped request message,
//! answered by enveloped messages and an end-of-stream message). Everything here is pure, so
//! it can be tested and fuzzed without a server; every input is treated as hostile.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Largest request message accepted (envelope or unary body). envd's requests are small: a
/// command line, its environment and a path; the agent's own limit on a command is 48 KiB.
pub const MAX_MESSAGE: usize = 256 * 1024;

/// Envelope flag: the message is compressed (never accepted: no compression is negotiated).
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Envelope flag: the end-of-stream message.
pub const FLAG_END_STREAM: u8 = 0x02;

/// How messages are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// Protobuf binary.
    Proto,
    /// The proto3 JSON mapping.
    Json,
}

/// The kind of call a request's content type announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `application/proto` or `application/json`.
    Unary(Codec),
    /// `application/connect+proto` or `application/connect+json`.
    Stream(Codec),
}

impl Kind {
    /// From a `Content-Type` (parameters such as `charset` ignored); `None` when it is not one
    /// Connect uses.
    pub fn from_content_type(ct: &str) -> Option<Kind> {
        let essence = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        Some(match essence.as_str() {
            "application/proto" => Kind::Unary(Codec::Proto),
            "application/json" => Kind::Unary(Codec::Json),
            "application/connect+proto" => Kind::Stream(Codec::Proto),
            "application/connect+json" => Kind::Stream(Codec::Json),
            _ => return None,
        })
    }

    /// The `Content-Type` of the answer.
    pub fn content_type(self) -> &'static str {
        match self {
            Kind::Unary(Codec::Proto) => "application/proto",
            Kind::Unary(Codec::Json) => "application/json",
            Kind::Stream(Codec::Proto) => "application/connect+proto",
            Kind::Stream(Codec::Json) => "application/connect+json",
        }
    }
}

/// A Connect error: one of the protocol's codes and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcError {
    /// The code (`invalid_argument`, `not_found`, ...).
    pub code: &'static str,
    /// What went wrong and what to do.
    pub message: String,
}

impl RpcError {
    /// An error with this code.
    pub fn new(code: &'static str, message: impl Into<String>) -> RpcError {
        RpcError { code, message: message.into() }
    }

    /// `invalid_argument`.
    pub fn invalid(message: impl Into<String>) -> RpcError {
        RpcError::new("invalid_argument", message)
    }

    /// `unimplemented`.
    pub fn unimplemented(message: impl Into<String>) -> RpcError {
        RpcError::new("unimplemented", message)
    }

    /// The HTTP status a unary answer with this error carries (the Connect protocol's table).
    pub fn http_status(&self) -> u16 {
        match self.code {
            "canceled" => 499,
            "invalid_argument" | "failed_precondition" | "out_of_range" => 400,
            "unauthenticated" => 401,
            "permission_denied" => 403,
            "not_found" => 404,
            "already_exists" | "aborted" => 409,
            "resource_exhausted" => 429,
            "unimplemented" => 501,
            "unavailable" => 503,
            "deadline_exceeded" => 504,
            _ => 500,
        }
    }

    /// The JSON error object: `{"code": ..., "message": ...}`.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({ "code": self.code, "message": self.message })
    }
}

/// Decodes one message.
pub fn decode<M: prost::Message + Default + DeserializeOwned>(
    codec: Codec,
    bytes: &[u8],
) -> Result<M, RpcError> {
    if bytes.len() > MAX_MESSAGE {
        return Err(RpcError::new(
            "resource_exhausted",
            format!("the request message has {} bytes, over the limit of {MAX_MESSAGE}", bytes.len()),
        ));
    }
    match codec {
        Codec::Proto => {
            M::decode(bytes).map_err(|e| RpcError::invalid(format!("the request is not valid protobuf: {e}")))
        }
        Codec::Json => {
            // An empty body is the empty message.
            if bytes.iter().all(u8::is_ascii_whitespace) {
                return Ok(M::default());
            }
            serde_json::from_slice(bytes)
                .map_err(|e| RpcError::invalid(format!("the request is not valid JSON for this method: {e}")))
        }
    }
}

/// Encodes one message.
pub fn encode<M: prost::Message + Serialize>(codec: Codec, m: &M) -> Vec<u8> {
    match codec {
        Codec::Proto => m.encode_to_vec(),
        // Serializing these plain structs cannot fail; an empty object is the fallback anyway.
        Codec::Json => serde_json::to_vec(m).unwrap_or_else(|_| b"{}".to_vec()),
    }
}

/// Wraps a message in an envelope: flags, big-endian length, the message.
pub fn envelope(flags: u8, message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(flags);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// The end-of-stream envelope: `{}` after success, `{"error": {...}}` after a failure.
pub fn end_stream(error: Option<&RpcError>) -> Vec<u8> {
    let body = match error {
        None => serde_json::json!({}),
        Some(e) => serde_json::json!({ "error": e.json() }),
    };
    envelope(FLAG_END_STREAM, body.to_string().as_bytes())
}

/// Reads the one message of a server-streaming request's body: exactly one uncompressed
/// data envelope, whose length matches what follows.
pub fn single_envelope(body: &[u8]) -> Result<&[u8], RpcError> {
    if body.len() < 5 {
        return Err(RpcError::invalid(format!(
            "a streaming request's body must be one envelope (5-byte prefix and a message); it has {} bytes",
            body.len()
        )));
    }
    let flags = body[0];
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if flags & FLAG_COMPRESSED != 0 {
        return Err(RpcError::unimplemented("compressed messages are not accepted; send them uncompressed"));
    }
    if flags != 0 {
        return Err(RpcError::invalid(format!(
            "the request envelope has flags {flags:#04x}; a request message has none"
        )));
    }
    if len > MAX_MESSAGE {
        return Err(RpcError::new(
            "resource_exhausted",
            format!("the request envelope announces {len} bytes, over the limit of {MAX_MESSAGE}"),
        ));
    }
    let rest = &body[5..];
    if rest.len() != len {
        return Err(RpcError::invalid(format!(
            "the request envelope announces {len} bytes but {} follow; send exactly one message",
            rest.len()
        )));
    }
    Ok(rest)
}

/// Decodes a whole request body of a call of `kind`.
pub fn decode_request<M: prost::Message + Default + DeserializeOwned>(
    kind: Kind,
    body: &[u8],
) -> Result<M, RpcError> {
    match kind {
        Kind::Unary(codec) => decode(codec, body),
        Kind::Stream(codec) => decode(codec, single_envelope(body)?),
    }
}

/// A `Connect-Timeout-Ms` header's value, when it is a valid one (1 to 10 digits).
pub fn timeout_ms(header: Option<&str>) -> Result<Option<u64>, RpcError> {
    let Some(v) = header else { return Ok(None) };
    let ok = !v.is_empty() && v.len() <= 10 && v.bytes().all(|b| b.is_ascii_digit());
    if !ok {
        return Err(RpcError::invalid(format!(
            "Connect-Timeout-Ms {:?} is not 1 to 10 digits",
            v.chars().take(20).collect::<String>()
        )));
    }
    Ok(v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb;

    #[test]
    fn content_types_select_the_kind_and_codec() {
        assert_eq!(
            Kind::from_content_type("application/json; charset=utf-8"),
            Some(Kind::Unary(Codec::Json))
        );
        assert_eq!(Kind::from_content_type("Application/Proto"), Some(Kind::Unary(Codec::Proto)));
        assert_eq!(Kind::from_content_type("application/connect+json"), Some(Kind::Stream(Codec::Json)));
        assert_eq!(Kind::from_content_type("application/connect+proto"), Some(Kind::Stream(Codec::Proto)));
        for bad in ["", "text/plain", "application/grpc", "multipart/form-data; boundary=x"] {
            assert_eq!(Kind::from_content_type(bad), None, "{bad}");
        }
    }

    #[test]
    fn envelopes_round_trip_and_hostile_ones_are_typed_errors() {
        let msg = br#"{"path":"/tmp"}"#;
        let env = envelope(0, msg);
        assert_eq!(single_envelope(&env).unwrap(), msg);
        let r: pb::PathRequest = decode_request(Kind::Stream(Codec::Json), &env).unwrap();
        assert_eq!(r.path, "/tmp");

        // Too short, compressed, end-stream from a client, lengths that lie, oversize.
        assert_eq!(single_envelope(&[0, 0, 0]).unwrap_err().code, "invalid_argument");
        assert_eq!(single_envelope(&envelope(FLAG_COMPRESSED, msg)).unwrap_err().code, "unimplemented");
        assert_eq!(single_envelope(&envelope(FLAG_END_STREAM, msg)).unwrap_err().code, "invalid_argument");
        let mut short = envelope(0, msg);
        short.pop();
        assert_eq!(single_envelope(&short).unwrap_err().code, "invalid_argument");
        let mut two = envelope(0, msg);
        two.extend(envelope(0, msg));
        assert_eq!(single_envelope(&two).unwrap_err().code, "invalid_argument");
        let huge = [0u8, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(single_envelope(&huge).unwrap_err().code, "resource_exhausted");
        let big = vec![b' '; MAX_MESSAGE + 1];
        assert_eq!(decode::<pb::PathRequest>(Codec::Json, &big).unwrap_err().code, "resource_exhausted");
    }

    #[test]
    fn bad_messages_are_invalid_arguments() {
        let e = decode::<pb::StartRequest>(Codec::Proto, &[0x0a, 0xff]).unwrap_err();
        assert_eq!(e.code, "invalid_argument");
        let e = decode::<pb::StartRequest>(Codec::Json, b"{\"process\": 5}").unwrap_err();
        assert_eq!(e.code, "invalid_argument");
        let e = decode::<pb::StartRequest>(Codec::Json, b"\xff\xfe").unwrap_err();
        assert_eq!(e.code, "invalid_argument");
        let empty: pb::ListRequest = decode(Codec::Json, b"").unwrap();
        assert_eq!(empty, pb::ListRequest {});
        let empty: pb::ListRequest = decode(Codec::Proto, b"").unwrap();
        assert_eq!(empty, pb::ListRequest {});
    }

    #[test]
    fn end_of_stream_carries_the_error() {
        let e = RpcError::new("not_found", "no such sandbox");
        let env = end_stream(Some(&e));
        assert_eq!(env[0], FLAG_END_STREAM);
        let v: serde_json::Value = serde_json::from_slice(&env[5..]).unwrap();
        assert_eq!(v, serde_json::json!({"error": {"code": "not_found", "message": "no such sandbox"}}));
        assert_eq!(&end_stream(None)[5..], b"{}");
    }

    #[test]
    fn timeouts_are_digits_only() {
        assert_eq!(timeout_ms(Some("60000")).unwrap(), Some(60000));
        assert_eq!(timeout_ms(None).unwrap(), None);
        for bad in ["", "-1", "1.5", "12345678901", "1e3"] {
            assert!(timeout_ms(Some(bad)).is_err(), "{bad}");
        }
    }
}
