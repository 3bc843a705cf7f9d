//! Requests the shim answers itself (they never reach the agent), spoken over the same socket
//! and framing as the agent protocol, with `shim_`-prefixed operation names.

use branchbox_model::{Error, Result};
use branchbox_protocol::frame::{decode, encode_header, read_raw, write_raw};
use serde::{Deserialize, Serialize};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// Control requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ShimRequest {
    /// Checkpoint the sandbox into `image` (an absolute directory); it keeps running.
    ShimCheckpoint {
        /// Directory for runsc's checkpoint image.
        image: String,
    },
    /// Replace the running sandbox with the state in checkpoint `image` (same identity); the
    /// current state stays live until the target answers.
    ShimRollback {
        /// Directory of runsc's checkpoint image.
        image: String,
    },
    /// Restore the checkpoint in `image` (an absolute directory) into this shell, whose
    /// container was created empty; refused by a sandbox that runs already.
    ShimRestore {
        /// Directory of runsc's checkpoint image.
        image: String,
    },
    /// Pause every process.
    ShimPause,
    /// Resume after a pause.
    ShimResume,
    /// Destroy the sandbox and exit.
    ShimStop,
}

/// Control responses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum ShimResponse {
    /// Done.
    ShimDone,
    /// Failed.
    ShimError {
        /// What went wrong.
        message: String,
    },
}

/// Sends one control request on a fresh connection and waits for its answer.
pub fn call(socket: &Path, req: &ShimRequest) -> Result<()> {
    call_within(socket, req, None)
}

/// [`call`], giving up when no answer came within `wait` (`None`: no limit).
pub fn call_within(socket: &Path, req: &ShimRequest, wait: Option<std::time::Duration>) -> Result<()> {
    let mut conn = UnixStream::connect(socket).map_err(|e| {
        Error::Backend(format!("the sandbox's shim is not answering at {}: {e}", socket.display()))
    })?;
    conn.set_read_timeout(wait).map_err(|e| Error::Backend(e.to_string()))?;
    write_raw(&mut conn, &encode_header(1, req), &[]).map_err(|e| Error::Backend(e.to_string()))?;
    let raw = read_raw(&mut conn)
        .map_err(|e| Error::Backend(e.to_string()))?
        .ok_or_else(|| Error::Backend("the shim closed the connection without answering".into()))?;
    match decode::<ShimResponse>(raw).map_err(|e| Error::Backend(e.to_string()))?.msg {
        ShimResponse::ShimDone => Ok(()),
        ShimResponse::ShimError { message } => Err(Error::Backend(message)),
    }
}

/// Admits a client of the shim's socket only when it runs as the shim's own effective user
/// or as root (who could reach the sandbox anyway): the socket drives the agent and
/// checkpoints, so a mode that a umask or a later chmod widened must not open it to others.
pub fn peer_allowed(conn: &UnixStream) -> std::result::Result<(), String> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred { pid: 0, uid: u32::MAX, gid: u32::MAX };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED fills a ucred of the given length on a socket we own.
    let rc = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(format!("cannot read the peer's credentials: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if cred.uid == me || cred.uid == 0 {
        Ok(())
    } else {
        Err(format!("uid {} (pid {}) is neither the shim's uid {me} nor root", cred.uid, cred.pid))
    }
}

/// Checks an image path from a control request: it must name an existing directory under the
/// data directory's `snapshots/`, found from the shim's sandbox directory
/// (`<data>/sandboxes/<id>`). Any local process that reaches the socket could otherwise make
/// the shim (often root) write a checkpoint wherever it likes. Symlinks are resolved first, so
/// one inside `snapshots/` cannot point out of it.
pub fn confine_image(sandbox_dir: &Path, image: &str) -> std::result::Result<PathBuf, String> {
    let root =
        sandbox_dir.parent().and_then(Path::parent).map(|data| data.join("snapshots")).ok_or_else(|| {
            format!("the sandbox directory {} is not under a data directory", sandbox_dir.display())
        })?;
    let refuse =
        |why: String| format!("image path {image:?} refused: {why}; images live under {}", root.display());
    let root =
        root.canonicalize().map_err(|e| refuse(format!("cannot resolve the snapshots directory: {e}")))?;
    let path = Path::new(image).canonicalize().map_err(|e| refuse(e.to_string()))?;
    if path == root || !path.starts_with(&root) || !path.is_dir() {
        return Err(refuse("not a directory inside the snapshots directory".into()));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_outside_the_snapshots_directory_are_refused() {
        let data = tempfile::tempdir().unwrap();
        let sandbox = data.path().join("sandboxes/sbx-0123456789abcdef");
        let image = data.path().join("snapshots/snap-0123456789abcdef/checkpoint");
        std::fs::create_dir_all(&sandbox).unwrap();
        std::fs::create_dir_all(&image).unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), data.path().join("snapshots/escape")).unwrap();
        assert_eq!(confine_image(&sandbox, image.to_str().unwrap()).unwrap(), image.canonicalize().unwrap());
        let dotdot = format!("{}/snapshots/../sandboxes", data.path().display());
        for bad in [
            outside.path().to_str().unwrap(),
            &dotdot,
            &format!("{}/snapshots/escape", data.path().display()),
            &format!("{}/snapshots", data.path().display()),
            &format!("{}/snapshots/missing", data.path().display()),
            "relative/path",
        ] {
            assert!(confine_image(&sandbox, bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn only_the_shims_own_user_or_root_may_connect() {
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let (me, _) = UnixStream::pair().unwrap();
        assert_eq!(peer_allowed(&me), Ok(()));
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("not root: cannot connect as another user; only the same-user case ran");
            return;
        }
        // A socket another user can reach, as a widened mode would leave it.
        for p in [dir.path(), path.as_path()] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        let script = format!(
            "import socket,time; s=socket.socket(socket.AF_UNIX); s.connect({:?}); time.sleep(2)",
            path
        );
        let mut other =
            std::process::Command::new("python3").args(["-c", &script]).uid(65534).spawn().unwrap();
        let (conn, _) = listener.accept().unwrap();
        let refused = peer_allowed(&conn).unwrap_err();
        assert!(refused.contains("uid 65534"), "{refused}");
        let _ = other.kill();
        let _ = other.wait();
    }
}
