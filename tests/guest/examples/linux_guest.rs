//! Boots the project's Linux guest under hardware KVM to its agent, N times, and prints the
//! time from VM creation to the agent's first answer, plus one Python run through the agent.
//! `scripts/kvm-e2e.sh` builds everything and runs this.
//!
//! ```text
//! linux_guest [--kernel VMLINUX] [--disk ROOTFS.ext4] [--runs N] [--cmdline-extra "quiet"]
//! ```
//! Without `--kernel`/`--disk`: `$BRANCHBOX_KERNEL`/`$BRANCHBOX_GUEST_DISK`, else the newest
//! cached ones under `$BRANCHBOX_IMAGES`.

use branchbox_guest_tests::{artifacts, kvm};
use branchbox_protocol::{Command, ExecSpec};
use branchbox_vmm::Hypervisor;
use std::path::PathBuf;
use std::time::Duration;

struct Args {
    kernel: Option<PathBuf>,
    disk: Option<PathBuf>,
    runs: usize,
    extra: String,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args { kernel: None, disk: None, runs: 10, extra: String::new() };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--kernel" => args.kernel = Some(value()?.into()),
            "--disk" => args.disk = Some(value()?.into()),
            "--runs" => {
                let v = value()?;
                args.runs = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or(format!("--runs {v}: give 1 to 1000"))?;
            }
            "--cmdline-extra" => args.extra = value()?,
            other => {
                return Err(format!("unknown argument {other}; see the usage at the top of linux_guest.rs"))
            }
        }
    }
    Ok(args)
}

fn main() {
    if let Err(e) = run() {
        eprintln!("linux_guest: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let args = parse_args()?;
    kvm::hardware_kvm().map_err(|why| format!("needs hardware KVM: {why}"))?;
    let kernel = args.kernel.map_or_else(artifacts::vmlinux, Ok)?;
    let disk = args.disk.map_or_else(artifacts::root_disk, Ok)?;
    let hv = Hypervisor::open().map_err(|e| e.to_string())?;
    println!("kernel {}\ndisk {}", kernel.display(), disk.display());

    let mut times = Vec::with_capacity(args.runs);
    for i in 0..args.runs {
        let work = tempfile::tempdir().map_err(|e| e.to_string())?;
        let mut booted =
            kvm::boot_to_agent(&hv, &kernel, &disk, work.path(), &args.extra, Duration::from_secs(30))?;
        times.push(booted.to_first_answer);
        println!(
            "run {i}: boot to the agent's first answer {:.1} ms",
            booted.to_first_answer.as_secs_f64() * 1e3
        );
        if i == 0 {
            let spec = ExecSpec::new(Command::Argv(vec![
                "python3".into(),
                "-c".into(),
                "import sys; print('python', sys.version.split()[0], 6 * 7)".into(),
            ]));
            let out = booted.agent.exec(spec, None).map_err(|e| format!("python3 through the agent: {e}"))?;
            println!("python3 -c ...: {:?} {}", out.status.code, String::from_utf8_lossy(&out.stdout).trim());
        }
        booted.shutdown()?;
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "boot to first answer over {} runs: min {:.1} ms, median {:.1} ms, max {:.1} ms (target <= 100 ms)",
        times.len(),
        ms(times[0]),
        ms(times[times.len() / 2]),
        ms(times[times.len() - 1])
    );
    Ok(())
}
