//! E2B's envd wire as far as branchboxd serves it (`docs/e2b.md`): the Connect protocol over
//! HTTP/1.1 ([`connect`]: envelopes, codecs, errors, timeouts) and the messages of envd's
//! `process` and `filesystem` services ([`pb`]). Pure code: everything it parses comes from a
//! client and is treated as hostile; `fuzz/fuzz_targets/connect_requests.rs` fuzzes it.

pub mod connect;
pub mod pb;
