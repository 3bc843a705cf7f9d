//! The after-fork hook: a forked or restored copy must not share randomness or identity with
//! its siblings. The host sends fresh entropy, the wall clock and a new identity; this applies
//! each and reports what the sandbox kernel allowed.

use branchbox_protocol::{AfterFork, HookReport, StepOutcome};
use std::time::Instant;

/// `RNDADDENTROPY` from `<linux/random.h>`.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
/// `RNDRESEEDCRNG` from `<linux/random.h>`.
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;
/// Most entropy bytes accepted.
pub const MAX_ENTROPY: usize = 4096;

fn outcome(rc: libc::c_int, what: &str, unsupported_why: &str) -> StepOutcome {
    if rc == 0 {
        return StepOutcome::Applied;
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::ENOTTY) | Some(libc::ENOSYS) | Some(libc::EINVAL) | Some(libc::EPERM) => {
            StepOutcome::Unsupported(format!("{what}: {err}; {unsupported_why}"))
        }
        _ => StepOutcome::Failed(format!("{what}: {err}")),
    }
}

fn add_entropy(bytes: &[u8]) -> StepOutcome {
    if bytes.is_empty() {
        return StepOutcome::Failed("the host sent no entropy".into());
    }
    let bytes = &bytes[..bytes.len().min(MAX_ENTROPY)];
    let why = "this sandbox kernel draws its randomness from the host, so no state is duplicated";
    let Ok(f) = std::fs::OpenOptions::new().write(true).open("/dev/urandom") else {
        return StepOutcome::Unsupported(format!("/dev/urandom cannot be opened; {why}"));
    };
    use std::os::fd::AsRawFd;
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    let mut info: Vec<u8> = Vec::with_capacity(8 + bytes.len());
    info.extend_from_slice(&((bytes.len() * 8) as i32).to_ne_bytes());
    info.extend_from_slice(&(bytes.len() as i32).to_ne_bytes());
    info.extend_from_slice(bytes);
    while !info.len().is_multiple_of(4) {
        info.push(0);
    }
    // SAFETY: info is laid out as rand_pool_info and outlives the call.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), RNDADDENTROPY as _, info.as_ptr()) };
    let added = outcome(rc, "RNDADDENTROPY", why);
    if added != StepOutcome::Applied {
        return added;
    }
    // SAFETY: argument-less ioctl.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), RNDRESEEDCRNG as _) };
    outcome(rc, "RNDRESEEDCRNG", why)
}

fn set_clock(ns: u64) -> StepOutcome {
    let ts =
        libc::timespec { tv_sec: (ns / 1_000_000_000) as libc::time_t, tv_nsec: (ns % 1_000_000_000) as _ };
    // SAFETY: valid timespec.
    let rc = unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) };
    outcome(rc, "clock_settime", "this sandbox kernel follows the host clock, which is already current")
}

fn set_hostname(name: &str) -> StepOutcome {
    if name.is_empty() || name.len() > 64 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return StepOutcome::Failed(format!("invalid hostname {name:?}"));
    }
    // SAFETY: pointer and length of a valid byte string.
    let rc = unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) };
    let set = outcome(rc, "sethostname", "the hostname is fixed by the sandbox runtime");
    if set != StepOutcome::Applied {
        return set;
    }
    // `/etc/hostname` follows, or tools reading it would see the source's name.
    match crate::guest::write_etc_hostname(name) {
        Ok(()) => StepOutcome::Applied,
        Err(e) => StepOutcome::Failed(format!("/etc/hostname: {e}")),
    }
}

fn write_machine_id(id: &str) -> StepOutcome {
    if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return StepOutcome::Failed(format!("invalid machine-id {id:?}"));
    }
    match std::fs::write("/etc/machine-id", format!("{id}\n")) {
        Ok(()) => StepOutcome::Applied,
        Err(e) => StepOutcome::Failed(format!("/etc/machine-id: {e}")),
    }
}

/// Applies the hook; `entropy` is the frame body.
pub fn apply(a: &AfterFork, entropy: &[u8]) -> HookReport {
    let t = Instant::now();
    let entropy = add_entropy(entropy);
    let clock = set_clock(a.wall_clock_ns);
    let hostname = set_hostname(&a.hostname);
    let machine_id = write_machine_id(&a.machine_id);
    let _ = std::fs::create_dir_all("/run/branchbox")
        .and_then(|()| std::fs::write("/run/branchbox/sandbox-id", &a.sandbox_id));
    HookReport { entropy, clock, hostname, machine_id, duration_us: t.elapsed().as_micros() as u64 }
}
