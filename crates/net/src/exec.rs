//! Running `ip` and `nft`, in the host namespace or inside a named one.

use crate::{Error, Result};
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

/// Where iproute2 keeps named network namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// Where `ip` and `nft` are (Debian installs both under /usr/sbin, which is not always on a
/// root service's PATH).
fn program(name: &str) -> String {
    for dir in ["/usr/sbin", "/sbin", "/usr/bin", "/bin"] {
        let p = format!("{dir}/{name}");
        if std::path::Path::new(&p).is_file() {
            return p;
        }
    }
    name.to_string()
}

fn fix(name: &str) -> &'static str {
    if name == "nft" {
        "install nftables (scripts/setup.sh does)"
    } else {
        "install iproute2"
    }
}

/// Runs `name args` with `input` on its standard input, inside the namespace `netns` when
/// given (setns before exec). `what` says what it was for in the error.
pub fn run(name: &str, args: &[&str], input: &str, netns: Option<&str>, what: &str) -> Result<String> {
    let mut cmd = Command::new(program(name));
    cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let ns_file = match netns {
        Some(ns) => {
            let path = std::path::Path::new(NETNS_DIR).join(ns);
            Some(std::fs::File::open(&path).map_err(|e| Error::Io { path, source: e })?)
        }
        None => None,
    };
    if let Some(f) = &ns_file {
        let fd = f.as_raw_fd();
        // SAFETY: setns(2) only, between fork and exec; the fd stays open until spawn returns.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::Command(format!("cannot start {name} ({e}) to {what}; {}", fix(name))))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .map_err(|e| Error::Command(format!("{name} did not take its input to {what}: {e}")))?;
    }
    let out = child.wait_with_output().map_err(|e| Error::Command(format!("{name} ({what}): {e}")))?;
    drop(ns_file);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).take(4).collect();
        return Err(Error::Command(format!(
            "{name} failed to {what} ({}): {}; are you root?",
            out.status,
            tail.join(" / ")
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Writes `value` to the sysctl file `path` (under /proc/sys) of namespace `netns`, from a
/// thread of its own that enters the namespace: /proc/sys/net shows the writer's namespace.
pub fn sysctl_in(netns: &str, path: &'static str, value: &'static str) -> Result<()> {
    in_netns(netns, move || std::fs::write(path, value))?
        .map_err(|e| Error::Io { path: std::path::PathBuf::from(path), source: e })
}

/// Runs `f` on a short-lived thread of its own that has entered the network namespace
/// `netns` (under /run/netns): what it opens (a socket, a /proc/sys/net file) belongs to
/// that namespace, and the caller's threads stay where they are.
pub fn in_netns<T: Send + 'static>(netns: &str, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    let ns = std::path::Path::new(NETNS_DIR).join(netns);
    let file = std::fs::File::open(&ns).map_err(|e| Error::Io { path: ns.clone(), source: e })?;
    std::thread::spawn(move || {
        // SAFETY: setns(2) on this short-lived thread only; it exits right after `f`.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(Error::Io { path: ns, source: std::io::Error::last_os_error() });
        }
        Ok(f())
    })
    .join()
    .map_err(|_| Error::Command(format!("a task in network namespace {netns} panicked")))?
}
