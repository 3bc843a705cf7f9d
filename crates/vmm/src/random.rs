//! Random ids (delta layers, disk chains), from the kernel's generator.

use crate::error::{Error, Result};

/// A random 64-bit id.
pub(crate) fn random_id() -> Result<u64> {
    let mut b = [0u8; 8];
    // SAFETY: fills the 8-byte buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != 8 {
        return Err(Error::Memory { op: "getrandom", source: std::io::Error::last_os_error() });
    }
    Ok(u64::from_le_bytes(b))
}
