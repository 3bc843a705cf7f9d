//! branchbox-shim: keeps one gVisor sandbox's agent reachable on a Unix socket.
//! Started by the gvisor backend; not meant to be run by hand.

use branchbox_gvisor::runsc::Runsc;
use branchbox_gvisor::shim::{run, Shell, ShimConfig, Start};
use std::path::PathBuf;
use std::time::Duration;

fn parse() -> Result<ShimConfig, String> {
    let mut args = std::env::args().skip(1);
    let (mut dir, mut id, mut bin, mut root, mut restore) = (None, None, None, None, None);
    let (mut shell, mut idle) = (None, None);
    let mut network = false;
    while let Some(flag) = args.next() {
        if flag == "--network" {
            network = true;
            continue;
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--dir" => dir = Some(PathBuf::from(value)),
            "--id" => id = Some(value),
            "--runsc" => bin = Some(PathBuf::from(value)),
            "--runsc-root" => root = Some(PathBuf::from(value)),
            "--restore" => restore = Some(PathBuf::from(value)),
            "--shell" => shell = Some(PathBuf::from(value)),
            "--shell-idle-s" => {
                idle = Some(Duration::from_secs(
                    value.parse().map_err(|e| format!("--shell-idle-s {value}: {e}"))?,
                ))
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    let runsc = Runsc::new(bin.ok_or("--runsc is required")?, root.ok_or("--runsc-root is required")?);
    Ok(ShimConfig {
        dir: dir.ok_or("--dir is required")?,
        id: id.ok_or("--id is required")?,
        runsc: if network { runsc.networked() } else { runsc },
        start: match (restore, shell) {
            (Some(_), Some(_)) => return Err("--restore and --shell exclude each other".into()),
            (Some(image), None) => Start::Restore(image),
            (None, Some(marker)) => {
                Start::Shell(Shell { marker, idle: idle.ok_or("--shell needs --shell-idle-s")? })
            }
            (None, None) => Start::Fresh,
        },
    })
}

fn main() {
    // The shim writes sockets, bundles and (through runsc) checkpoint images holding the
    // sandbox's memory: nothing it creates is for other users.
    // SAFETY: umask has no preconditions.
    unsafe { libc::umask(0o077) };
    let result = parse().and_then(run);
    if let Err(e) = result {
        eprintln!("branchbox-shim: {e}");
        branchbox_gvisor::shimlog::flush();
        std::process::exit(1);
    }
}
