//! The runtime processes of a sandbox that has no record (what a crash left running), found by
//! their command lines: its shim, and runsc with the sandbox and gofer processes it started.
//! [`GvisorBackend::reap`](crate::GvisorBackend::reap) kills them around its `destroy`.

use branchbox_model::SandboxId;
use std::io::Read;

/// The most of one process's command line read: every process on the host is scanned, and
/// none of them is trusted to keep its arguments short.
const MAX_CMDLINE_BYTES: u64 = 64 * 1024;

/// SIGKILLs every runtime process of sandbox `id` (its shim, runsc and runsc's sandbox and
/// gofer; only its shim when `shim_only`), found by their command lines; returns how many were
/// signalled.
pub(crate) fn kill_runtime(id: &SandboxId, shim_only: bool) -> usize {
    let me = std::process::id().to_string();
    let mut pids: Vec<String> = std::fs::read_dir("/proc")
        .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    pids.sort();
    let mut n = 0;
    for pid in pids.into_iter().filter(|p| p.bytes().all(|b| b.is_ascii_digit())) {
        if pid == me {
            continue;
        }
        let mut cmd = Vec::new();
        let read = std::fs::File::open(format!("/proc/{pid}/cmdline"))
            .and_then(|f| f.take(MAX_CMDLINE_BYTES).read_to_end(&mut cmd));
        if read.is_err() {
            continue;
        }
        let argv0 = cmd.split(|b| *b == 0).next().unwrap_or_default();
        let prog = argv0.rsplit(|b| *b == b'/').next().unwrap_or_default();
        let is_shim = prog.starts_with(b"branchbox-shim");
        let ours = if shim_only { is_shim } else { is_shim || prog.starts_with(b"runsc") };
        let names_it = cmd.windows(id.as_str().len()).any(|w| w == id.as_str().as_bytes());
        if ours && names_it {
            if let Ok(p) = pid.parse::<i32>() {
                // SAFETY: a runtime process of this sandbox only (checked by its command line).
                unsafe { libc::kill(p, libc::SIGKILL) };
                n += 1;
            }
        }
    }
    n
}
