//! Uplink address slots: a sandbox's `/31` out of the pool is reserved by a file
//! `<state>/slots/<n>` created exclusively and holding the sandbox's id.

use crate::{Cidr, Error, Result};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// The two ends of one slot: the uplink side's address and the router's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// The uplink (host or uplink namespace) side.
    pub uplink: Ipv4Addr,
    /// The router namespace side.
    pub router: Ipv4Addr,
}

fn dir(state: &Path) -> PathBuf {
    state.join("slots")
}

/// Slots in `pool`: one `/31` each.
pub fn count(pool: Cidr) -> u32 {
    ((1u64 << (32 - u32::from(pool.prefix_len()))) / 2) as u32
}

fn slot(pool: Cidr, n: u32) -> Slot {
    let base = u32::from(pool.addr()) + 2 * n;
    Slot { uplink: Ipv4Addr::from(base), router: Ipv4Addr::from(base + 1) }
}

/// Reserves a free slot for `id`, starting at a place derived from the id so concurrent
/// creates rarely race for the same file.
pub fn reserve(state: &Path, pool: Cidr, id: &str) -> Result<Slot> {
    let d = dir(state);
    std::fs::create_dir_all(&d).map_err(|e| Error::Io { path: d.clone(), source: e })?;
    let total = count(pool);
    let h = Sha256::digest(id.as_bytes());
    let start = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) % total;
    for i in 0..total {
        let n = (start + i) % total;
        let path = d.join(n.to_string());
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(mut f) => {
                f.write_all(id.as_bytes()).map_err(|e| Error::Io { path: path.clone(), source: e })?;
                return Ok(slot(pool, n));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(Error::Io { path, source: e }),
        }
    }
    Err(Error::Exhausted(format!(
        "all {total} uplink addresses of {pool} are taken; kill sandboxes, run `branchbox gc`, or give a larger pool"
    )))
}

/// The slot `id` holds, if any.
pub fn find(state: &Path, pool: Cidr, id: &str) -> Option<Slot> {
    let entries = std::fs::read_dir(dir(state)).ok()?;
    entries.flatten().find_map(|e| {
        let n: u32 = e.file_name().to_str()?.parse().ok()?;
        (n < count(pool) && std::fs::read(e.path()).is_ok_and(|c| c == id.as_bytes())).then(|| slot(pool, n))
    })
}

/// Frees every slot `id` holds; missing ones are fine.
pub fn release(state: &Path, id: &str) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(dir(state)) else { return Ok(()) };
    for e in entries.flatten() {
        if std::fs::read(e.path()).is_ok_and(|c| c == id.as_bytes()) {
            match std::fs::remove_file(e.path()) {
                Ok(()) => {}
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => return Err(Error::Io { path: e.path(), source: err }),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_exclusive_found_again_and_freed() {
        let state = std::env::temp_dir().join(format!("bbnet-slots-{}", std::process::id()));
        let pool: Cidr = "100.127.0.0/30".parse().unwrap();
        assert_eq!(count(pool), 2);
        let a = reserve(&state, pool, "sbx-a").unwrap();
        let b = reserve(&state, pool, "sbx-b").unwrap();
        assert_ne!(a, b);
        assert_eq!(find(&state, pool, "sbx-b"), Some(b));
        assert_eq!(find(&state, pool, "sbx-x"), None);
        assert_eq!(u32::from(a.router), u32::from(a.uplink) + 1);
        let e = reserve(&state, pool, "sbx-c").unwrap_err().to_string();
        assert!(e.contains("100.127.0.0/30"), "{e}");
        release(&state, "sbx-b").unwrap();
        release(&state, "sbx-b").unwrap();
        assert_eq!(find(&state, pool, "sbx-b"), None);
        assert_eq!(reserve(&state, pool, "sbx-c").unwrap(), b);
        std::fs::remove_dir_all(&state).unwrap();
    }
}
