//! E2B's wire as far as branchboxd serves it (`docs/e2b.md`): the Connect protocol over
//! HTTP/1.1 ([`connect`]: envelopes, codecs, errors, timeouts), the messages of envd's
//! `process` and `filesystem` services ([`pb`]), and template builds: the build start's steps
//! read into a plan ([`template`]), the COPY uploads' archives read within limits and their
//! files hash ([`template_files`]). Pure code: everything it parses comes from a client and is
//! treated as hostile; `fuzz/fuzz_targets/connect_requests.rs`, `e2b_template_steps.rs` and
//! `e2b_template_archive.rs` fuzz it.

pub mod connect;
pub mod pb;
pub mod template;
pub mod template_files;
