//! `branchbox files get`: copying a file out of a sandbox without trusting the sandbox. The
//! guest chooses the bytes, and may lie about the size or serve an endless device, so the copy
//! is capped at the size its stat reported and lands through a temporary file that nobody can
//! plant in advance.

use anyhow::{anyhow, bail, Context, Result};
use branchbox_model::AgentConn;
use branchbox_protocol::FileKind;
use std::io::Write;
use std::path::Path;

/// Largest file `files get` copies, whatever the sandbox reports.
pub const MAX_DOWNLOAD: u64 = 4 << 30;

/// A `Write` that refuses to pass more than `left` bytes on.
struct Capped<W> {
    inner: W,
    left: u64,
    cap: u64,
}

impl<W: Write> Write for Capped<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.len() as u64 > self.left {
            return Err(std::io::Error::other(format!(
                "the sandbox sent more than the {} bytes the file had when it was looked at; the copy was stopped",
                self.cap
            )));
        }
        let n = self.inner.write(buf)?;
        self.left -= n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// How many bytes a copy of `path` may take: its size as the sandbox states it, when it is a
/// regular file (a symlink's target size is not known here, so it gets the maximum).
fn cap_for(conn: &mut AgentConn, path: &str) -> Result<u64> {
    let st = conn.stat(path)?;
    let cap = match st.kind {
        FileKind::File => st.size,
        FileKind::Symlink => MAX_DOWNLOAD,
        FileKind::Dir => bail!("{path} is a directory; `branchbox files ls` lists it"),
        FileKind::Other => {
            bail!("{path} is not a regular file (a device, fifo or socket); only files can be copied")
        }
    };
    if cap > MAX_DOWNLOAD {
        bail!(
            "{path} has {cap} bytes, more than `files get` copies ({MAX_DOWNLOAD}); split it in the sandbox first \
             (e.g. `split -b 1G`)"
        );
    }
    Ok(cap)
}

/// Copies `path` from the sandbox to `local` (`None`: standard output); returns the bytes copied.
pub fn get(conn: &mut AgentConn, path: &str, local: Option<&Path>) -> Result<u64> {
    let cap = cap_for(conn, path)?;
    let Some(local) = local else {
        let mut out = Capped { inner: std::io::stdout().lock(), left: cap, cap };
        return Ok(conn.read_file_max(path, &mut out, cap)?);
    };
    let name = local.file_name().ok_or_else(|| anyhow!("{} does not name a file", local.display()))?;
    let dir = match local.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    // A fresh random name created exclusively (O_EXCL, mode 0600) in the target directory:
    // nothing planted there beforehand, a symlink included, can receive the bytes. The rename
    // then replaces `local` itself, never a file a symlink at `local` points to.
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.", name.to_string_lossy()))
        .suffix(".branchbox-part")
        .tempfile_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    let mut sink = Capped { inner: tmp.as_file(), left: cap, cap };
    // On failure `tmp` is dropped, which removes it: no partial file is left.
    let n = conn.read_file_max(path, &mut sink, cap)?;
    tmp.persist(local).map_err(|e| anyhow!("writing {}: {}", local.display(), e.error))?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_stops_a_sandbox_that_sends_more_than_it_said() {
        let mut out = Vec::new();
        let mut w = Capped { inner: &mut out, left: 5, cap: 5 };
        w.write_all(b"abc").unwrap();
        w.write_all(b"de").unwrap();
        let e = w.write_all(b"f").unwrap_err();
        assert!(e.to_string().contains("more than the 5 bytes"), "{e}");
        assert_eq!(out, b"abcde");
    }
}
