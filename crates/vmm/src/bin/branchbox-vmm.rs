//! `branchbox-vmm`: one VMM process serving one VM over the control socket it inherits.
//!
//! Started by the engine (`branchbox_vmm::process::spawn`), not by hand:
//! `branchbox-vmm --fd 3 --mem-bytes N --vcpus V [--irqchip]`. It builds the VM shell, then
//! serves requests until told to shut down or until the socket closes.

use branchbox_vmm::process::serve;
use branchbox_vmm::{Hypervisor, VmConfig};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::process::ExitCode;

struct Args {
    fd: i32,
    config: VmConfig,
}

fn parse() -> Result<Args, String> {
    let mut fd = None;
    let mut mem = None;
    let mut vcpus = None;
    let mut irqchip = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--fd" => fd = Some(value("--fd")?.parse::<i32>().map_err(|e| format!("--fd: {e}"))?),
            "--mem-bytes" => {
                mem = Some(value("--mem-bytes")?.parse::<u64>().map_err(|e| format!("--mem-bytes: {e}"))?)
            }
            "--vcpus" => vcpus = Some(value("--vcpus")?.parse::<u8>().map_err(|e| format!("--vcpus: {e}"))?),
            "--irqchip" => irqchip = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let missing = |n: &str| format!("{n} is required");
    Ok(Args {
        fd: fd.ok_or_else(|| missing("--fd"))?,
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

fn main() -> ExitCode {
    let run = || -> Result<(), String> {
        let args = parse()
            .map_err(|e| format!("{e}; usage: branchbox-vmm --fd N --mem-bytes N --vcpus N [--irqchip]"))?;
        let stream = control_socket(args.fd)?;
        let hv = Hypervisor::open().map_err(|e| e.to_string())?;
        serve(stream, hv, args.config).map_err(|e| e.to_string())
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("branchbox-vmm: {e}");
            ExitCode::FAILURE
        }
    }
}
