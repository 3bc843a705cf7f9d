//! Fuzz target: envd's Connect requests as branchboxd reads them (`branchbox-e2b-wire`). The
//! first byte picks a content type, a message type and whether the rest is also read as a
//! `Connect-Timeout-Ms` value; the rest is the request body, any bytes a client may send. Every
//! body must decode or be refused with a typed error, never panic; a message that decodes must
//! encode again and decode to itself, in both codecs.
#![no_main]

use branchbox_e2b_wire::connect::{self, Codec, Kind};
use branchbox_e2b_wire::pb;
use libfuzzer_sys::fuzz_target;

const CONTENT_TYPES: [&str; 5] = [
    "application/proto",
    "application/json",
    "application/connect+proto",
    "application/connect+json; charset=utf-8",
    "text/plain",
];

/// Decodes `body` as an `M`; what decodes round-trips through both codecs.
fn check<M>(kind: Kind, body: &[u8])
where
    M: prost::Message + Default + serde::de::DeserializeOwned + serde::Serialize + PartialEq + std::fmt::Debug,
{
    let Ok(m) = connect::decode_request::<M>(kind, body) else { return };
    for codec in [Codec::Proto, Codec::Json] {
        let bytes = connect::encode(codec, &m);
        let back: M = connect::decode(codec, &bytes).expect("an encoded message decodes");
        assert_eq!(back, m, "{codec:?} round trip");
        let framed = connect::envelope(0, &bytes);
        let again: M = connect::decode_request(Kind::Stream(codec), &framed).expect("an envelope decodes");
        assert_eq!(again, m);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else { return };
    if pick & 0x80 != 0 {
        let _ = connect::timeout_ms(std::str::from_utf8(body).ok());
    }
    let Some(kind) = Kind::from_content_type(CONTENT_TYPES[(pick as usize) % CONTENT_TYPES.len()]) else {
        return;
    };
    match (pick >> 3) % 10 {
        0 => check::<pb::StartRequest>(kind, body),
        1 => check::<pb::SendSignalRequest>(kind, body),
        2 => check::<pb::PathRequest>(kind, body),
        3 => check::<pb::ListDirRequest>(kind, body),
        4 => check::<pb::MoveRequest>(kind, body),
        5 => check::<pb::SendInputRequest>(kind, body),
        6 => check::<pb::UpdateRequest>(kind, body),
        7 => check::<pb::StreamInputRequest>(kind, body),
        8 => check::<pb::WatchRequest>(kind, body),
        _ => check::<pb::SelectRequest>(kind, body),
    }
});
