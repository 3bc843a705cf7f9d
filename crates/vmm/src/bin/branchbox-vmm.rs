//! `branchbox-vmm`: one VMM process serving one VM over the control socket it inherits.
//!
//! Started by the engine, not by hand: `branchbox-vmm --fd 3 --mem-bytes N --vcpus V
//! [--irqchip]` (`branchbox_vmm::process::spawn`) serves the inherited socket until told to
//! shut down or until it closes; `--listen PATH` instead of `--fd`
//! (`branchbox_vmm::process::spawn_listening`) listens on a Unix socket at PATH and serves one
//! connection after another until told to shut down, outliving the engine that started it.

use branchbox_vmm::process::{serve, serve_listener};
use branchbox_vmm::{Hypervisor, VmConfig};
use std::os::fd::FromRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::ExitCode;

/// Where the control connection comes from.
enum Control {
    Fd(i32),
    Listen(PathBuf),
}

struct Args {
    control: Control,
    config: VmConfig,
}

fn parse() -> Result<Args, String> {
    let mut fd = None;
    let mut listen = None;
    let mut mem = None;
    let mut vcpus = None;
    let mut irqchip = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--fd" => fd = Some(value("--fd")?.parse::<i32>().map_err(|e| format!("--fd: {e}"))?),
            "--listen" => listen = Some(PathBuf::from(value("--listen")?)),
            "--mem-bytes" => {
                mem = Some(value("--mem-bytes")?.parse::<u64>().map_err(|e| format!("--mem-bytes: {e}"))?)
            }
            "--vcpus" => vcpus = Some(value("--vcpus")?.parse::<u8>().map_err(|e| format!("--vcpus: {e}"))?),
            "--irqchip" => irqchip = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let missing = |n: &str| format!("{n} is required");
    let control = match (fd, listen) {
        (Some(fd), None) => Control::Fd(fd),
        (None, Some(path)) => Control::Listen(path),
        (Some(_), Some(_)) => return Err("give --fd or --listen, not both".into()),
        (None, None) => return Err(missing("--fd or --listen")),
    };
    Ok(Args {
        control,
        config: VmConfig {
            mem_size: mem.ok_or_else(|| missing("--mem-bytes"))?,
            vcpus: vcpus.ok_or_else(|| missing("--vcpus"))?,
            irqchip,
        },
    })
}

/// Takes ownership of `fd` if it is an open socket.
fn control_socket(fd: i32) -> Result<UnixStream, String> {
    // SAFETY: fstat on a descriptor number only reads its metadata.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(format!(
            "descriptor {fd} is not a socket; this program is started by the branchbox engine"
        ));
    }
    // SAFETY: the descriptor is open, a socket, and nothing else in this process owns it.
    Ok(unsafe { UnixStream::from_raw_fd(fd) })
}

/// Listens at `path`, owner-only: whoever connects drives the VM.
fn listen(path: &std::path::Path) -> Result<UnixListener, String> {
    let listener =
        UnixListener::bind(path).map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("cannot make {} owner-only: {e}", path.display()))?;
    Ok(listener)
}

fn main() -> ExitCode {
    let run = || -> Result<(), String> {
        let args = parse().map_err(|e| {
            format!("{e}; usage: branchbox-vmm (--fd N | --listen PATH) --mem-bytes N --vcpus N [--irqchip]")
        })?;
        match args.control {
            Control::Fd(fd) => {
                let stream = control_socket(fd)?;
                let hv = Hypervisor::open().map_err(|e| e.to_string())?;
                serve(stream, hv, args.config).map_err(|e| e.to_string())
            }
            Control::Listen(path) => {
                let hv = Hypervisor::open().map_err(|e| e.to_string())?;
                let listener = listen(&path)?;
                serve_listener(listener, hv, args.config).map_err(|e| e.to_string())
            }
        }
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("branchbox-vmm: {e}");
            ExitCode::FAILURE
        }
    }
}
