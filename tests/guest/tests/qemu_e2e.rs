//! Real Linux drivers on our device back ends: QEMU (software emulation, q35, virtio-pci) boots
//! the project's guest kernel and root disk with its block, vsock and rng devices served by our
//! vhost-user servers, which run branchbox-virtio's device logic.
//!
//! Needs `qemu-system-x86_64` (Debian's qemu-system-x86) and the built guest kernel and disk;
//! fails, naming the command to run, when either is missing.

use std::time::Duration;

use branchbox_guest_tests::artifacts::{guest_files, GuestFiles};
use branchbox_guest_tests::qemu::{agent, one_guest_at_a_time, sh, wait_for, Devices, Disk, Qemu};
use branchbox_virtio::vsock::{RX, TX};

/// Bytes the guest reads from /dev/hwrng.
const HWRNG_READ: u64 = 4096;

/// The cached root disk as a read-only base under a fresh overlay: the cached file is never
/// written.
fn fresh_disk(files: &GuestFiles, dir: &std::path::Path) -> Disk {
    Disk { base: files.rootfs.clone(), overlay: dir.join("overlay.img") }
}

fn base_fingerprint(disk: &Disk) -> (u64, std::time::SystemTime) {
    let m = std::fs::metadata(&disk.base).expect("stat the cached rootfs");
    (m.len(), m.modified().expect("mtime"))
}

#[test]
fn the_agent_answers_over_our_vsock_files_persist_on_our_block_device_and_our_rng_feeds_the_guest() {
    let _one = one_guest_at_a_time();
    let files = guest_files();
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = fresh_disk(&files, dir.path());
    let base_before = base_fingerprint(&disk);

    // First boot: the agent (PID 1) answers through our vsock back end.
    let devices = Devices::start(dir.path(), &disk);
    let mut qemu = Qemu::boot(&files, &devices, &dir.path().join("console-1.log"));
    let (mut guest, first_answer) = agent(&mut qemu, &devices.vsock_host_socket);
    eprintln!("boot to the agent's first answer under TCG: {} ms", first_answer.as_millis());
    // The shell the agent started is its child: the agent answering us is PID 1.
    let uname = sh(&mut guest, "uname -sr; echo parent=$PPID");
    assert!(uname.starts_with("Linux 6."), "the guest is not our Linux kernel: {uname}");
    assert!(uname.ends_with("\nparent=1\n"), "the agent that answered is not PID 1: {uname}");
    assert_eq!(sh(&mut guest, "echo hello from the guest"), "hello from the guest\n");
    // The conversation went through our vsock device's queues: the guest's packets on tx, ours
    // to it on rx.
    assert!(devices.vsock.chains(TX) > 0 && devices.vsock.bytes_to_guest(RX) > 0);
    assert_eq!(devices.vsock.rejected(TX), 0, "the real driver's packets were refused");

    // The rng: the guest's hw_random core uses our device, and the bytes it reads came from us.
    let current = sh(&mut guest, "cat /sys/class/misc/hw_random/rng_current");
    assert!(current.starts_with("virtio_rng"), "the guest's hwrng is {current:?}, not virtio");
    let served_before = devices.rng.bytes_to_guest(0);
    let read = sh(&mut guest, &format!("head -c {HWRNG_READ} /dev/hwrng | wc -c"));
    assert_eq!(read.trim(), HWRNG_READ.to_string(), "short read from /dev/hwrng");
    // The driver may prefetch one buffer ahead, so the read is not all counted after
    // `served_before`; but every byte the guest's hwrng ever had came from our server.
    let served = devices.rng.bytes_to_guest(0);
    assert!(served > served_before, "our rng served nothing while the guest read /dev/hwrng");
    assert!(served >= HWRNG_READ, "our rng served {served} bytes in all; the guest read {HWRNG_READ}");

    // The block device: a file written in the guest reaches our overlay file. The agent's
    // shutdown syncs and powers the guest off (ACPI), which ends QEMU.
    let marker = format!("branchbox-vhost-marker-{:016x}", rand_u64());
    sh(&mut guest, &format!("echo {marker} > /root/marker"));
    guest.shutdown(false).expect("ask the agent to power off");
    let status = qemu.wait_exit(Duration::from_secs(60));
    assert!(status.success(), "QEMU ended with {status} on the guest's power-off");
    let overlay = std::fs::read(&disk.overlay).expect("read the overlay");
    assert!(
        overlay.windows(marker.len()).any(|w| w == marker.as_bytes()),
        "the guest's file did not reach our block back end's overlay"
    );
    assert!(devices.blk.chains(0) > 0);
    assert_eq!(devices.blk.rejected(0), 0, "the real driver's requests were refused");
    devices.finish();
    // The agent's shutdown remounted the root read-only: the journal is closed, the disk clean
    // without any recovery.
    let check = e2fsck(&["-f", "-n"], &disk.flatten(&dir.path().join("flat-1.img")));
    assert_eq!(check, 0, "a clean power-off left a disk that needs recovery (e2fsck -fn exit {check})");

    // Second boot on the same disk: the file is there.
    let devices = Devices::start(dir.path(), &disk);
    let mut qemu = Qemu::boot(&files, &devices, &dir.path().join("console-2.log"));
    let (mut guest, second_answer) = agent(&mut qemu, &devices.vsock_host_socket);
    eprintln!("second boot to the agent's first answer: {} ms", second_answer.as_millis());
    let back = guest.read_file_bytes("/root/marker", 1024).expect("read the marker back");
    assert_eq!(String::from_utf8_lossy(&back), format!("{marker}\n"));
    guest.shutdown(false).expect("power off");
    qemu.wait_exit(Duration::from_secs(60));
    devices.finish();

    assert_eq!(base_fingerprint(&disk), base_before, "the cached rootfs was written");
}

#[test]
fn a_guest_killed_mid_write_leaves_a_disk_that_mounts() {
    let _one = one_guest_at_a_time();
    let files = guest_files();
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = fresh_disk(&files, dir.path());

    let devices = Devices::start(dir.path(), &disk);
    let mut qemu = Qemu::boot(&files, &devices, &dir.path().join("console-1.log"));
    let (mut guest, _) = agent(&mut qemu, &devices.vsock_host_socket);
    sh(&mut guest, "echo kept > /root/before && sync");
    // Files created, written and synced in a loop: data and journal writes in flight.
    let writer = "i=0; while true; do dd if=/dev/zero of=/root/f$i bs=64k count=16 conv=fsync 2>/dev/null; i=$((i+1)); done";
    guest
        .spawn(branchbox_protocol::message::ExecSpec::new(branchbox_protocol::message::Command::Shell(
            writer.into(),
        )))
        .expect("start the writer");
    let start = devices.blk.chains(0);
    wait_for(&mut qemu, Duration::from_secs(60), "the guest's writes to reach our block device", || {
        devices.blk.chains(0) > start + 200
    });
    qemu.kill();
    devices.finish();

    // The disk as left: the journal replays and the result checks clean.
    assert_clean_after_replay(&disk.flatten(&dir.path().join("flat.img")));

    // And the guest boots on it again: the kernel replays the journal and mounts it read-write.
    let devices = Devices::start(dir.path(), &disk);
    let mut qemu = Qemu::boot(&files, &devices, &dir.path().join("console-2.log"));
    let (mut guest, recovered) = agent(&mut qemu, &devices.vsock_host_socket);
    eprintln!(
        "boot after the kill (journal replay) to the agent's first answer: {} ms",
        recovered.as_millis()
    );
    assert_eq!(sh(&mut guest, "cat /root/before"), "kept\n");
    let root = sh(&mut guest, "grep ' / ' /proc/mounts");
    assert!(
        root.starts_with("/dev/root / ext4 rw") || root.starts_with("/dev/vda / ext4 rw"),
        "root mount: {root}"
    );
    sh(&mut guest, "echo after > /root/after");
    guest.shutdown(false).expect("power off");
    qemu.wait_exit(Duration::from_secs(60));
    devices.finish();

    // After the recovered boot and a clean power-off, the disk is clean again with no replay.
    let check = e2fsck(&["-f", "-n"], &disk.flatten(&dir.path().join("flat-2.img")));
    assert_eq!(
        check, 0,
        "the disk is not clean after the recovered boot's power-off (e2fsck -fn exit {check})"
    );
}

/// Replays `image`'s journal (what the kernel does at mount) and checks the result with
/// `e2fsck -fn`: exit 0 means no error at all.
fn assert_clean_after_replay(image: &std::path::Path) {
    let replay = e2fsck(&["-E", "journal_only", "-p"], image);
    assert!(replay < 4, "replaying the journal left errors (e2fsck exit {replay})");
    let check = e2fsck(&["-f", "-n"], image);
    assert_eq!(check, 0, "the disk is not clean after its journal replayed (e2fsck -fn exit {check})");
}

fn e2fsck(args: &[&str], image: &std::path::Path) -> i32 {
    let out = std::process::Command::new("e2fsck")
        .args(args)
        .arg(image)
        .output()
        .expect("run e2fsck (Debian's e2fsprogs)");
    eprintln!(
        "e2fsck {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out.status.code().unwrap_or(-1)
}

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .expect("read /dev/urandom");
    u64::from_le_bytes(b)
}
