//! Bounds on envd uploads (`POST /files`), so that a client holding one sandbox's access token
//! cannot make branchboxd hold much memory: the multipart parser keeps a part's headers (and
//! anything before the first boundary) in memory until they end, so those are cut at
//! [`MAX_PART_HEADERS`] bytes ([`HeaderCap`]) before the parser sees them; and only so many
//! uploads run at once per sandbox and per token ([`Uploads`]), each past the bound refused with
//! `resource_exhausted` instead of queued.

use super::connect::RpcError;
use branchbox_model::SandboxId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Most bytes of one multipart part's headers, and of the preamble before the first part.
pub const MAX_PART_HEADERS: usize = 16 << 10;
/// Most uploads running at once into one sandbox.
pub const PER_SANDBOX: usize = 8;
/// Most uploads running at once with one token (a sandbox's access token counts as the token
/// it derives from), across its sandboxes.
pub const PER_TOKEN: usize = 32;

/// Where a multipart body is, as far as the cap cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Before the first boundary.
    Preamble,
    /// After a boundary, before the blank line that ends the part's headers.
    Headers,
    /// A part's contents, streamed on by the parser (not held).
    Body,
}

/// Follows a multipart body chunk by chunk and says when a part's headers (or the preamble)
/// pass [`MAX_PART_HEADERS`] bytes. It looks for the same delimiters as the parser: a stray
/// delimiter inside a part's contents only makes it count sooner.
pub struct HeaderCap {
    first: Vec<u8>,
    next: Vec<u8>,
    stage: Stage,
    /// Bytes of the current preamble or header block seen so far.
    seen: usize,
    /// The end of the last chunk, where a delimiter may begin.
    carry: Vec<u8>,
}

/// The preamble or one part's headers passed [`MAX_PART_HEADERS`] bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a multipart part's headers (or the bytes before the first part) are over {MAX_PART_HEADERS} bytes; send each file as a part with short headers")]
pub struct HeadersTooLong;

impl From<HeadersTooLong> for RpcError {
    fn from(e: HeadersTooLong) -> RpcError {
        RpcError::invalid(e.to_string())
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let (&first, rest) = needle.split_first()?;
    let mut from = 0;
    while let Some(i) = hay.get(from..)?.iter().position(|&b| b == first) {
        let at = from + i;
        match hay.get(at + 1..at + needle.len()) {
            Some(r) if r == rest => return Some(at),
            Some(_) => from = at + 1,
            // Too close to the end for a whole delimiter here or later.
            None => return None,
        }
    }
    None
}

impl HeaderCap {
    /// A cap for a body whose parts are delimited by `boundary`.
    pub fn new(boundary: &str) -> HeaderCap {
        HeaderCap {
            first: format!("--{boundary}").into_bytes(),
            next: format!("\r\n--{boundary}").into_bytes(),
            stage: Stage::Preamble,
            seen: 0,
            carry: Vec::new(),
        }
    }

    /// Takes the next chunk of the body.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<(), HeadersTooLong> {
        let mut win = std::mem::take(&mut self.carry);
        // The carried bytes were counted with the chunk they came in.
        let carried = win.len();
        win.extend_from_slice(chunk);
        let mut pos = 0;
        loop {
            let delim: &[u8] = match self.stage {
                Stage::Preamble => &self.first,
                Stage::Headers => b"\r\n\r\n",
                Stage::Body => &self.next,
            };
            let found = win.get(pos..).and_then(|rest| find(rest, delim)).map(|i| pos + i + delim.len());
            let end = found.unwrap_or(win.len());
            if self.stage != Stage::Body {
                self.seen += end.saturating_sub(pos.max(carried));
                if self.seen > MAX_PART_HEADERS {
                    return Err(HeadersTooLong);
                }
            }
            let Some(end) = found else {
                let keep = (delim.len() - 1).min(win.len() - pos);
                self.carry = win.split_off(win.len() - keep);
                return Ok(());
            };
            self.stage = match self.stage {
                Stage::Preamble | Stage::Body => Stage::Headers,
                Stage::Headers => Stage::Body,
            };
            self.seen = 0;
            pos = end;
        }
    }
}

#[derive(Default)]
struct Counts {
    sandbox: HashMap<String, usize>,
    token: HashMap<String, usize>,
}

/// The uploads running now, counted per sandbox and per token.
#[derive(Default)]
pub struct Uploads {
    counts: Arc<Mutex<Counts>>,
}

fn lock(m: &Mutex<Counts>) -> MutexGuard<'_, Counts> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn down(map: &mut HashMap<String, usize>, key: &str) {
    if let Some(n) = map.get_mut(key) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            map.remove(key);
        }
    }
}

/// One running upload's place, given back when dropped.
pub struct Slot {
    counts: Arc<Mutex<Counts>>,
    sandbox: String,
    token: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = lock(&self.counts);
        down(&mut c.sandbox, &self.sandbox);
        down(&mut c.token, &self.token);
    }
}

impl Uploads {
    /// A place for an upload into `sandbox` sent with `token` (the caller's token id), or
    /// `resource_exhausted` naming the bound it would pass.
    pub fn take(&self, sandbox: &SandboxId, token: &str) -> Result<Slot, RpcError> {
        let mut c = lock(&self.counts);
        let (sandbox, token) = (sandbox.to_string(), token.to_string());
        for (open, max, scope) in [
            (c.sandbox.get(&sandbox), PER_SANDBOX, "into this sandbox"),
            (c.token.get(&token), PER_TOKEN, "with this token"),
        ] {
            if open.copied().unwrap_or(0) >= max {
                return Err(RpcError::new(
                    "resource_exhausted",
                    format!("{max} uploads are running {scope}; wait for one to end and retry"),
                ));
            }
        }
        *c.sandbox.entry(sandbox.clone()).or_default() += 1;
        *c.token.entry(token.clone()).or_default() += 1;
        Ok(Slot { counts: self.counts.clone(), sandbox, token })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(headers: &str, data: &[u8]) -> Vec<u8> {
        let mut b = format!("--B\r\n{headers}\r\n\r\n").into_bytes();
        b.extend_from_slice(data);
        b.extend_from_slice(b"\r\n--B--\r\n");
        b
    }

    /// Feeds `b` in chunks of `n` bytes.
    fn feed(b: &[u8], n: usize) -> Result<(), HeadersTooLong> {
        let mut cap = HeaderCap::new("B");
        b.chunks(n).try_for_each(|c| cap.feed(c))
    }

    #[test]
    fn a_part_with_huge_contents_and_short_headers_passes_in_any_chunking() {
        let b = body("Content-Disposition: form-data; name=\"file\"; filename=\"f\"", &vec![b'\r'; 1 << 20]);
        for n in [1, 3, 7, 4096, b.len()] {
            assert_eq!(feed(&b, n), Ok(()), "chunks of {n}");
        }
    }

    #[test]
    fn headers_over_the_cap_are_refused_however_they_arrive() {
        let long = format!("X-Pad: {}", "a".repeat(MAX_PART_HEADERS));
        let b = body(&long, b"data");
        for n in [1, 5, 4096, b.len()] {
            assert_eq!(feed(&b, n), Err(HeadersTooLong), "chunks of {n}");
        }
        // A second part's headers count on their own, and are cut too.
        let mut two = body("Content-Disposition: form-data; name=\"file\"", b"x");
        two.truncate(two.len() - 4);
        two.extend_from_slice(format!("\r\n{long}\r\n\r\nx\r\n--B--\r\n").as_bytes());
        assert_eq!(feed(&two, 1000), Err(HeadersTooLong));
        // Just under the cap is fine.
        let fits = format!("X-Pad: {}", "a".repeat(MAX_PART_HEADERS - 100));
        assert_eq!(feed(&body(&fits, b"x"), 777), Ok(()));
    }

    #[test]
    fn a_preamble_that_never_reaches_a_boundary_is_refused() {
        let b = vec![b'-'; 4 * MAX_PART_HEADERS];
        assert_eq!(feed(&b, 4096), Err(HeadersTooLong));
    }

    #[test]
    fn uploads_past_the_sandbox_or_token_bound_are_refused_until_one_ends() {
        let u = Uploads::default();
        let one = SandboxId::generate();
        let held: Vec<Slot> = (0..PER_SANDBOX).map(|_| u.take(&one, "a").unwrap()).collect();
        let e = u.take(&one, "b").err().expect("a slot past the sandbox's bound");
        assert_eq!(e.code, "resource_exhausted");
        assert!(e.message.contains("into this sandbox"), "{}", e.message);
        let mut others = Vec::new();
        for _ in PER_SANDBOX..PER_TOKEN {
            others.push(u.take(&SandboxId::generate(), "a").unwrap());
        }
        let e = u.take(&SandboxId::generate(), "a").err().expect("a slot past the token's bound");
        assert!(e.message.contains("with this token"), "{}", e.message);
        drop(held);
        assert!(u.take(&one, "a").is_ok());
    }
}
