//! A Linux guest in a `branchbox-vmm` process: `BootLinux` through the control protocol
//! reaches the kernel (its serial log carries our command line), `Pause` holds its vCPU out
//! of the guest and `Resume` lets it back in, `Status` reports the guest's end and why, and
//! a snapshot of a running guest is refused by name. Also the listening
//! mode the microvm backend uses: the process outlives its connections.
//!
//! On the PVM hosts we build on the kernel stops at its first unsupported instruction some
//! seconds in (see `linux_boot.rs`): that end is exactly what `Status` must report. On
//! hardware KVM the guest goes on to its agent; the test stops it once the command line is in.

use branchbox_guest_tests::kvm::hardware_kvm;
use branchbox_guest_tests::microvm::process_alive;
use branchbox_guest_tests::vmm::{config, start_vmm, VmmGuest};
use branchbox_vmm::process::protocol::{BootLinux, ErrorKind, Request, VmState};
use branchbox_vmm::process::{default_program, spawn_listening, VmmProcess};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// A safety net, not a measurement: a guest neither ended nor printed its command line by
/// then is stuck.
const SAFETY_NET: Duration = Duration::from_secs(180);
const HOSTNAME_ARG: &str = "branchbox.hostname=vmm-linux-test";

fn boot_request(guest: &VmmGuest, work: &Path) -> BootLinux {
    guest.boot_request(work, "root", HOSTNAME_ARG)
}

/// CPU time (user + system, in clock ticks) of the process's `vcpu0` threads: the Linux
/// guest's, and the idle test-guest thread's, which never runs.
fn guest_cpu_ticks(pid: u32) -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != "vcpu0" {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // Fields after the `(comm)`: state is the first, utime and stime the 12th and 13th.
        let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
        total += fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    }
    total
}

fn command_line(log: &str) -> Option<&str> {
    log.lines().find_map(|l| l.split_once("Command line: ").map(|(_, c)| c))
}

#[test]
fn boot_linux_reaches_the_kernel_and_status_reports_the_guest_end() {
    let guest = VmmGuest::cached();
    let hardware = hardware_kvm().is_ok();
    let work = tempfile::tempdir().unwrap();
    let mut p = start_vmm();
    p.boot_linux(boot_request(&guest, work.path())).expect("boot the Linux guest");

    // A running guest cannot be snapshotted: the request names the state to be in.
    let snap = p.request(&Request::Snapshot { dir: work.path().into() }).unwrap_err();
    assert_eq!(snap.remote().map(|r| r.kind), Some(ErrorKind::State), "{snap}");
    assert!(snap.to_string().contains("pause the guest first"), "{snap}");
    let again = p.boot_linux(boot_request(&guest, work.path())).unwrap_err();
    assert_eq!(again.remote().map(|r| r.kind), Some(ErrorKind::State), "{again}");

    // Paused, the guest's vCPU takes no CPU time at all (running, it is busy in KVM_RUN,
    // emulated under PVM); resumed, it goes on to its end below.
    p.pause().expect("pause the guest");
    assert_eq!(p.status().unwrap().state, VmState::Paused);
    let before = guest_cpu_ticks(p.pid());
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(guest_cpu_ticks(p.pid()), before, "a paused guest's vCPU ran");
    p.resume().expect("resume the guest");

    let log_path = work.path().join("serial.log");
    let start = Instant::now();
    let reason = loop {
        let status = p.status().expect("status");
        if let VmState::GuestExited { reason } = status.state {
            break Some(reason);
        }
        assert_eq!(status.state, VmState::Running);
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if hardware && command_line(&log).is_some() {
            break None;
        }
        assert!(start.elapsed() < SAFETY_NET, "the guest neither ended nor printed its command line:\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let cmdline =
        command_line(&log).unwrap_or_else(|| panic!("no `Command line:` in the serial log:\n{log}"));
    assert!(cmdline.starts_with("root=/dev/vda rw console=ttyS0"), "{cmdline}");
    assert!(cmdline.contains(HOSTNAME_ARG), "{cmdline}");
    // The devices are described in the DSDT (a command-line device has no interrupt on a
    // hardware-reduced ACPI platform, and its probe fails with -EINVAL: docs/boot.md).
    assert!(!cmdline.contains("virtio_mmio.device="), "devices on the command line: {cmdline}");
    if let Some(reason) = reason {
        // Under PVM: the kernel's first unsupported instruction, as the in-process boot sees it.
        assert!(reason.starts_with("vCPU 0:"), "{reason}");
        let _ = writeln!(std::io::stderr(), "guest ended: {reason}");
    }
    assert!(p.shutdown().expect("shut down").is_some_and(|s| s.success()));
}

#[test]
fn a_boot_that_cannot_start_names_the_file_and_leaves_the_process_idle() {
    let guest = VmmGuest::cached();
    let work = tempfile::tempdir().unwrap();
    let mut p = start_vmm();

    let missing = work.path().join("no-such-vmlinux");
    let e = p.boot_linux(BootLinux { kernel: missing.clone(), ..boot_request(&guest, work.path()) });
    let e = e.unwrap_err();
    assert_eq!(e.remote().map(|r| r.kind), Some(ErrorKind::Boot), "{e}");
    assert!(e.to_string().contains(&format!("the kernel {} does not exist", missing.display())), "{e}");
    assert_eq!(p.status().unwrap().state, VmState::Idle);

    let no_disk = work.path().join("no-such-disk.ext4");
    let e = p.boot_linux(BootLinux { disk: no_disk.clone(), ..boot_request(&guest, work.path()) });
    let e = e.unwrap_err();
    assert!(e.to_string().contains(&format!("the root disk {} does not exist", no_disk.display())), "{e}");
    assert!(e.to_string().contains("branchbox guest disk"), "{e}");

    let relative =
        p.boot_linux(BootLinux { serial_log: "serial.log".into(), ..boot_request(&guest, work.path()) });
    assert_eq!(relative.unwrap_err().remote().map(|r| r.kind), Some(ErrorKind::Argument));
    assert_eq!(p.status().unwrap().state, VmState::Idle);
}

#[test]
fn a_listening_vmm_outlives_its_connections_until_shut_down() {
    if !Path::new("/dev/kvm").exists() {
        let _ = writeln!(std::io::stderr(), "SKIP vmm_linux: no /dev/kvm");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let socket = work.path().join("vmm.sock");
    let pid =
        spawn_listening(&default_program(), config(), &socket, &work.path().join("vmm.log"), SAFETY_NET)
            .expect("start a listening VMM");
    let mode = std::fs::metadata(&socket).map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()));
    assert_eq!(mode.unwrap() & 0o777, 0o600, "only the owner may drive the VM");
    for _ in 0..2 {
        let mut p = VmmProcess::connect(&socket).expect("connect");
        assert_eq!(p.pid(), pid);
        assert_eq!(p.status().unwrap().state, VmState::Idle);
        drop(p);
        assert!(process_alive(pid as i32), "closing a connection must not end the process");
    }
    let p = VmmProcess::connect(&socket).expect("connect");
    assert_eq!(p.shutdown().expect("shut down"), None, "a connected process is not ours to wait for");
    let start = Instant::now();
    while process_alive(pid as i32) {
        assert!(start.elapsed() < SAFETY_NET, "the VMM did not end after Shutdown");
        std::thread::sleep(Duration::from_millis(10));
    }
}
