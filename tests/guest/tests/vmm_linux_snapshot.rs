//! Snapshots of a Linux guest in a `branchbox-vmm` process, restored into another process.
//!
//! The kernel is paused mid-boot (once its serial log shows an early line), snapshotted, and
//! both the source (resumed) and a restore in a second VMM process run on. Under PVM each
//! then reaches the kernel's first unsupported instruction: the restored guest must get
//! there from the snapshot's instant (its serial log continues the source's: no second
//! `Linux version` banner, and the same lines as the source printed after the snapshot) and
//! end at the same instruction, at the same `rip`. On hardware KVM the guests run on to
//! their agents; the test stops them once the restored log shows the boot went on.
//!
//! Also: the disk is frozen into the snapshot (a frozen chain in the store, the restore's
//! own top over it), and damaged snapshots (missing, corrupt, truncated, of another format
//! version) are refused by name with the process left idle.

use branchbox_disk::Store;
use branchbox_guest_tests::kvm::hardware_kvm;
use branchbox_guest_tests::vmm::{start_vmm, VmmGuest, MEM};
use branchbox_vmm::linux::state::{self, LINUX_FORMAT_VERSION, LINUX_MEMORY_FILE, LINUX_STATE_FILE};
use branchbox_vmm::linux::SNAPSHOT_DISK_STORE;
use branchbox_vmm::process::protocol::{ErrorKind, RestoreLinux, VmState};
use branchbox_vmm::process::VmmProcess;
use std::path::Path;
use std::time::{Duration, Instant};

/// A safety net, not a measurement.
const SAFETY_NET: Duration = Duration::from_secs(240);

fn restore_request(snap: &Path, work: &Path, name: &str, resume: bool) -> RestoreLinux {
    RestoreLinux {
        dir: snap.to_path_buf(),
        serial_log: work.join(format!("{name}.log")),
        vsock_socket: work.join(format!("{name}.sock")),
        disk_store: work.join(format!("{name}-disk")),
        disk_chain: "root".into(),
        resume,
        net: None,
    }
}

fn read(path: &Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
}

/// Boots the guest in a new VMM process and pauses it once its serial log has `line`.
fn boot_and_pause_at(guest: &VmmGuest, work: &Path, line: &str) -> VmmProcess {
    let mut p = start_vmm();
    p.boot_linux(guest.boot_request(work, "source", "")).expect("boot the Linux guest");
    let start = Instant::now();
    while !read(&work.join("serial.log")).contains(line) {
        assert!(
            start.elapsed() < SAFETY_NET,
            "no {line:?} in the serial log:\n{}",
            read(&work.join("serial.log"))
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    p.pause().expect("pause the guest");
    p
}

/// Waits for the guest to end (under PVM) and returns why; on hardware KVM returns `None`
/// once `enough` says its log shows the boot went on.
fn run_to_end(p: &mut VmmProcess, log: &Path, enough: impl Fn(&str) -> bool) -> Option<String> {
    let hardware = hardware_kvm().is_ok();
    let start = Instant::now();
    loop {
        if let VmState::GuestExited { reason } = p.status().expect("status").state {
            return Some(reason);
        }
        if hardware && enough(&read(log)) {
            return None;
        }
        assert!(start.elapsed() < SAFETY_NET, "the guest neither ended nor went on:\n{}", read(log));
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The log with what the guest read from its clock masked: printk timestamps
/// (`[    1.234567]`) and kvm-clock's "sched offset of N cycles" (the TSC when it probed).
/// The restored guest's TSC and clock resume from the snapshot's values; the source's ran on
/// while it was paused, so these differ and nothing else may.
fn untimed(log: &str) -> String {
    let masked: Vec<String> = log
        .split_inclusive('\n')
        .map(|line| match line.split_once("sched offset of ") {
            Some((head, tail)) => {
                let rest = tail.trim_start_matches(|c: char| c.is_ascii_digit());
                format!("{head}sched offset of N{rest}")
            }
            None => line.to_string(),
        })
        .collect();
    let log = masked.concat();
    let mut out = String::with_capacity(log.len());
    let mut rest = log.as_str();
    while let Some(at) = rest.find('[') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        match tail.find(']') {
            Some(end) if tail[1..end].trim().chars().all(|c| c.is_ascii_digit() || c == '.') && end > 1 => {
                out.push_str("[T]");
                rest = &tail[end + 1..];
            }
            _ => {
                out.push('[');
                rest = &tail[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[test]
fn a_mid_boot_snapshot_restored_in_another_process_continues_to_the_same_end() {
    let guest = VmmGuest::cached();
    let work = tempfile::tempdir().unwrap();
    let snap = work.path().join("snap");
    std::fs::create_dir(&snap).unwrap();
    let mut source = boot_and_pause_at(&guest, work.path(), "Command line:");
    source.snapshot(&snap).expect("snapshot the paused guest");
    let at_snapshot = read(&work.path().join("serial.log"));

    let mut restored = start_vmm();
    restored.restore_linux(restore_request(&snap, work.path(), "restored", false)).expect("restore");
    assert_eq!(restored.status().unwrap().state, VmState::Paused, "restored paused as asked");
    source.resume().expect("resume the source");
    restored.resume().expect("resume the restored guest");

    let restored_log = work.path().join("restored.log");
    let went_on = |log: &str| log.contains("x86/fpu") || log.lines().count() > 20;
    let end_restored = run_to_end(&mut restored, &restored_log, went_on);
    let end_source = run_to_end(&mut source, &work.path().join("serial.log"), |_| true);
    let source_log = read(&work.path().join("serial.log"));
    let after = read(&restored_log);

    assert!(!after.trim().is_empty(), "the restored guest printed nothing");
    assert!(!after.contains("Linux version"), "the restored guest booted again:\n{after}");
    assert!(!after.contains("Command line:"), "the restored guest booted again:\n{after}");
    assert!(source_log.starts_with(&at_snapshot), "the source's log was rewritten");
    if let (Some(a), Some(b)) = (&end_source, &end_restored) {
        // Under PVM: both reach the same instruction, and the restored guest printed what
        // the source printed after the snapshot, line for line.
        assert_eq!(a, b, "the source and the restored guest ended differently");
        assert!(b.contains("emulation failure"), "{b}");
        assert!(
            untimed(&source_log).ends_with(&untimed(&after)),
            "the restored guest's output is not the source's continuation:\n--- source\n{source_log}\n--- restored\n{after}"
        );
        eprintln!("both ended: {b}");
    }

    // The disk: the snapshot owns its frozen chain (its own store, layers hard-linked), the
    // restore recorded it in its own store with its own top over it, and the source goes on
    // on its chain, whose deltas now end with the frozen top.
    let state = state::read(&snap.join(LINUX_STATE_FILE)).expect("read the state file");
    let disk_ref = state.disk.expect("the snapshot names its disk");
    assert_eq!(disk_ref.store, snap.join(SNAPSHOT_DISK_STORE));
    let frozen =
        Store::open(&disk_ref.store).unwrap().open_frozen(&disk_ref.frozen).expect("the frozen chain opens");
    let mine = Store::open(&work.path().join("restored-disk")).unwrap();
    assert_eq!(mine.open_frozen(&disk_ref.frozen).unwrap().layer_ids(), frozen.layer_ids());
    assert!(mine.has_chain("root").unwrap(), "the restore's own chain");
    let source_store = Store::open(&work.path().join("disk")).unwrap();
    assert!(source_store.has_chain("source").unwrap(), "the source goes on on its chain");
    assert!(!source_store.has_chain(&disk_ref.frozen).unwrap(), "the source's store keeps no second record");

    assert!(restored.shutdown().expect("shut down").is_some_and(|s| s.success()));
    assert!(source.shutdown().expect("shut down").is_some_and(|s| s.success()));
}

/// Copies the snapshot directory's files into a new directory, for damaging.
fn copy_snapshot(from: &Path, to: &Path) {
    std::fs::create_dir(to).unwrap();
    for name in [LINUX_STATE_FILE, LINUX_MEMORY_FILE] {
        std::fs::copy(from.join(name), to.join(name)).unwrap();
    }
    // The state file names the original's disk store; the damaged copies never reach it.
}

#[test]
fn damaged_snapshots_are_refused_by_name_and_leave_the_process_idle() {
    let guest = VmmGuest::cached();
    let work = tempfile::tempdir().unwrap();
    let snap = work.path().join("snap");
    std::fs::create_dir(&snap).unwrap();
    let mut source = boot_and_pause_at(&guest, work.path(), "Linux version");
    source.snapshot(&snap).expect("snapshot");
    source.shutdown().expect("shut down the source");

    let mut p = start_vmm();
    let mut attempt = |dir: &Path, name: &str, wanted: &str| {
        let e = p.restore_linux(restore_request(dir, work.path(), name, false)).unwrap_err();
        assert_eq!(e.remote().map(|r| r.kind), Some(ErrorKind::Snapshot), "{name}: {e}");
        assert!(e.to_string().contains(wanted), "{name}: {e}");
        assert_eq!(p.status().unwrap().state, VmState::Idle, "{name}: the process is idle again");
    };

    let missing = work.path().join("missing");
    std::fs::create_dir(&missing).unwrap();
    attempt(&missing, "missing", &missing.join(LINUX_STATE_FILE).display().to_string());

    let corrupt = work.path().join("corrupt");
    copy_snapshot(&snap, &corrupt);
    let mut bytes = std::fs::read(corrupt.join(LINUX_STATE_FILE)).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(corrupt.join(LINUX_STATE_FILE), &bytes).unwrap();
    attempt(&corrupt, "corrupt", "checksum");

    let version = work.path().join("version");
    copy_snapshot(&snap, &version);
    let mut bytes = std::fs::read(version.join(LINUX_STATE_FILE)).unwrap();
    bytes[8..12].copy_from_slice(&(LINUX_FORMAT_VERSION + 1).to_le_bytes());
    std::fs::write(version.join(LINUX_STATE_FILE), &bytes).unwrap();
    attempt(&version, "version", &format!("version {}", LINUX_FORMAT_VERSION + 1));

    let short_state = work.path().join("short-state");
    copy_snapshot(&snap, &short_state);
    let bytes = std::fs::read(short_state.join(LINUX_STATE_FILE)).unwrap();
    std::fs::write(short_state.join(LINUX_STATE_FILE), &bytes[..bytes.len() / 2]).unwrap();
    attempt(&short_state, "short-state", "truncated");

    let short_memory = work.path().join("short-memory");
    copy_snapshot(&snap, &short_memory);
    let f = std::fs::OpenOptions::new().write(true).open(short_memory.join(LINUX_MEMORY_FILE)).unwrap();
    f.set_len(MEM / 2).unwrap();
    attempt(&short_memory, "short-memory", "truncated");

    // The disk store is taken: a second restore into it is refused.
    p.restore_linux(restore_request(&snap, work.path(), "twice", false)).expect("a good restore");
    p.shutdown().unwrap();
    let mut again = start_vmm();
    let e = again.restore_linux(restore_request(&snap, work.path(), "twice", false)).unwrap_err();
    assert!(e.to_string().contains("exists already"), "{e}");
    assert_eq!(again.status().unwrap().state, VmState::Idle);
}
