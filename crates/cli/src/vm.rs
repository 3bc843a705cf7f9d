//! `branchbox vm boot`: boots a Linux guest in the microVM engine directly (no sandbox
//! records), for trying kernels and disks by hand; see docs/boot.md.

use crate::args::{BootArgs, VmCmd};
use crate::output::print;
use anyhow::{Context, Result};
use branchbox_vmm::linux::{LinuxVm, LinuxVmConfig, RunEnd, DEFAULT_SERIAL_LOG_CAP};
use branchbox_vmm::Hypervisor;
use serde_json::json;
use std::time::{Duration, Instant};

/// Runs a `vm` subcommand; returns the exit code.
pub fn run(cmd: &VmCmd, json: bool) -> Result<i32> {
    match cmd {
        VmCmd::Boot(args) => boot(args, json),
    }
}

fn boot(args: &BootArgs, json: bool) -> Result<i32> {
    let tmp;
    let work = match &args.work_dir {
        Some(d) => {
            std::fs::create_dir_all(d)
                .with_context(|| format!("cannot create the work directory {}", d.display()))?;
            d.clone()
        }
        None => {
            tmp = tempfile::Builder::new().prefix("branchbox-vm-").tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    let serial_log = work.join("serial.log");
    let mem_size = args.mem_mib.checked_mul(1 << 20).context("--mem-mib is too large")?;
    let config = LinuxVmConfig {
        kernel: args.kernel.clone(),
        cmdline: match &args.disk {
            Some(_) => format!("{} root=/dev/vda rw init=/sbin/init", args.cmdline),
            None => args.cmdline.clone(),
        },
        mem_size,
        vcpus: args.vcpus,
        serial_log: serial_log.clone(),
        serial_log_cap: DEFAULT_SERIAL_LOG_CAP,
    };
    let hv = Hypervisor::open()?;
    let start = Instant::now();
    let mut vm = LinuxVm::new(&hv, config)?;
    if let Some(disk) = &args.disk {
        vm.add_block(disk, &work.join("overlay.img"), "rootfs")?;
        vm.add_vsock(3, &work.join("vsock.sock"))?;
        vm.add_rng()?;
    }
    let cmdline = vm.boot()?.cmdline.clone();
    let stop = vm.stop_handle();
    let timeout = Duration::from_secs(args.timeout);
    let timer = std::thread::spawn(move || {
        std::thread::sleep(timeout);
        stop.stop();
    });
    let end = vm.run()?;
    let took = start.elapsed().as_secs_f64();
    drop(timer);
    let ok = matches!(end, RunEnd::PowerOff { .. } | RunEnd::Reset { .. });
    let v = json!({
        "end": end.to_string(),
        "seconds": took,
        "cmdline": cmdline,
        "serial_log": serial_log,
    });
    print(json, &v, || format!("{end} after {took:.2} s; serial log: {}", serial_log.display()));
    if args.work_dir.is_none() {
        // The log would go with the temporary directory: show it before it does.
        if !json {
            print!("{}", std::fs::read_to_string(&serial_log).unwrap_or_default());
        }
    }
    Ok(if ok { 0 } else { 1 })
}
