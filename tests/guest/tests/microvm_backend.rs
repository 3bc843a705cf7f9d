//! The microvm backend's failure paths, with the cached guest: a missing kernel or root disk
//! is named with what builds it, and a guest that ends before its agent answers fails
//! `create` with the guest's end reason and its serial log, leaving no VMM process behind.
//! Snapshot and restore through the backend: a mid-boot guest's snapshot restores into a new
//! sandbox whose guest continues the boot (under PVM up to the kernel's end, which the restore
//! reports instead of the agent's after-fork hook).
//! On the PVM hosts we build on that last case is what really happens (the kernel stops at
//! its first unsupported instruction), so it runs here; on hardware KVM the guest reaches its
//! agent instead, which `linux_kvm.rs` covers.

use branchbox_guest_tests::kvm::hardware_kvm;
use branchbox_guest_tests::microvm::{cached_guest, process_alive, CachedGuest};
use branchbox_microvm::MicrovmBackend;
use branchbox_model::{Backend, Error};
use branchbox_vmm::process::protocol::{BootLinux, VmState};
use branchbox_vmm::process::{default_program, spawn_listening, VmmProcess};
use branchbox_vmm::VmConfig;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Under PVM less RAM reaches the kernel's end sooner.
const MEMORY_MIB: u64 = 64;
/// A safety net, not a measurement: the guest ends by itself long before.
const PATIENCE: Duration = Duration::from_secs(180);

/// The cached kernel and disk; panics naming the command that builds them. No silent skip:
/// CI builds them before these tests, and a skip would hide a missing install step.
fn guest() -> CachedGuest {
    cached_guest().unwrap_or_else(|why| panic!("the guest is not cached: {why}"))
}

/// The VMM the sandbox in `dir` had, from its pid file.
fn vmm_pid(dir: &Path) -> Option<i32> {
    std::fs::read_to_string(dir.join("vmm.pid")).ok()?.trim().parse().ok()
}

#[test]
fn a_guest_that_ends_before_its_agent_answers_fails_create_with_its_end_reason() {
    let g = guest();
    if hardware_kvm().is_ok() {
        let _ =
            writeln!(std::io::stderr(), "SKIP microvm_backend: on hardware KVM the guest reaches its agent");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("sandbox");
    let plan = g.plan(&dir, MEMORY_MIB).unwrap();
    let backend = g.backend(PATIENCE);
    let e = backend.create(&plan).unwrap_err();
    let text = e.to_string();
    let _ = writeln!(std::io::stderr(), "create failed as it must here: {text}");
    assert!(matches!(e, Error::Backend(_)), "{e:?}");
    assert!(text.contains("the guest ended: vCPU 0: KVM internal error 1 (emulation failure)"), "{text}");
    assert!(text.contains("serial log"), "{text}");
    assert!(!text.contains("is empty"), "the kernel wrote to the console before it ended: {text}");
    let pid = vmm_pid(&dir).expect("the VMM's pid file");
    assert!(!process_alive(pid), "create left the VMM {pid} running");
    assert!(!backend.is_alive(&dir));
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&dir).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o700, "the sandbox directory holds its VM's sockets: owner only");
    backend.destroy(&plan.id, &dir).unwrap();
    assert!(!dir.exists());
}

#[test]
fn a_missing_kernel_is_named_and_leaves_no_vmm() {
    let g = guest();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("sandbox");
    let missing = work.path().join("no-such-vmlinux");
    let g = CachedGuest { kernel: missing.clone(), ..g };
    let plan = g.plan(&dir, MEMORY_MIB).unwrap();
    let e = g.backend(PATIENCE).create(&plan).unwrap_err().to_string();
    assert!(e.contains(&format!("the kernel {} does not exist", missing.display())), "{e}");
    assert!(e.contains("branchbox guest kernel"), "{e}");
    let pid = vmm_pid(&dir).expect("the VMM's pid file");
    assert!(!process_alive(pid), "create left the VMM {pid} running");
}

#[test]
fn a_missing_root_disk_is_named_with_the_command_that_builds_it() {
    let g = guest();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("sandbox");
    let mut plan = g.plan(&dir, MEMORY_MIB).unwrap();
    plan.rootfs = g.images.join("img-0000000000000000").join("rootfs");
    let e = g.backend(PATIENCE).create(&plan).unwrap_err();
    assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("the root disk of image img-0000000000000000"), "{text}");
    assert!(text.contains("build it with `branchbox guest disk --image NAME`"), "{text}");
    assert!(vmm_pid(&dir).is_none(), "no VMM is started without a disk");
}

#[test]
fn bad_snapshots_and_missing_sandboxes_are_named() {
    let g = guest();
    let work = tempfile::tempdir().unwrap();
    let backend: MicrovmBackend = g.backend(PATIENCE);
    let plan = g.plan(&work.path().join("child"), MEMORY_MIB).unwrap();
    let d = work.path();
    let e = backend.rollback(d, d).unwrap_err();
    assert!(matches!(&e, Error::InvalidInput(m) if m.contains("is not a microvm snapshot")), "{e:?}");
    let e = backend.restore(d, &plan).map(drop).unwrap_err();
    assert!(matches!(&e, Error::InvalidInput(m) if m.contains("is not a microvm snapshot")), "{e:?}");
    assert!(vmm_pid(&plan.dir).is_none(), "no VMM is started for a directory that is no snapshot");
    let e = backend.snapshot(&d.join("no-sandbox"), &d.join("dest")).unwrap_err();
    assert!(matches!(e, Error::Backend(_)), "{e:?}");
    assert!(backend.fork(&d.join("no-sandbox"), &d.join("dest"), &[plan]).is_err());
}

/// Boots the guest in a listening VMM in `dir` as `create` would (without waiting for an
/// agent, which never answers under PVM), and waits for its command line on the console.
fn boot_mid_way(g: &CachedGuest, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let config = VmConfig { mem_size: MEMORY_MIB << 20, vcpus: 1, irqchip: false };
    let pid =
        spawn_listening(&default_program(), config, &dir.join("vmm.sock"), &dir.join("vmm.log"), PATIENCE)
            .expect("start a listening VMM");
    std::fs::write(dir.join("vmm.pid"), pid.to_string()).unwrap();
    let mut vmm = VmmProcess::connect(&dir.join("vmm.sock")).unwrap();
    let disk = branchbox_guest_tests::artifacts::root_disk().expect("the cached root disk");
    vmm.boot_linux(BootLinux {
        kernel: g.kernel.clone(),
        disk,
        disk_store: dir.join("disk"),
        disk_chain: "root".into(),
        cmdline_extra: "earlyprintk=serial,ttyS0,115200".into(),
        mem_size: MEMORY_MIB << 20,
        vcpus: 1,
        vsock_socket: dir.join("vsock.sock"),
        serial_log: dir.join("serial.log"),
        net: None,
    })
    .expect("boot");
    let start = std::time::Instant::now();
    while !std::fs::read_to_string(dir.join("serial.log")).unwrap_or_default().contains("Command line:") {
        assert!(start.elapsed() < PATIENCE, "the guest printed no command line");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A sandbox booted mid-way in `work/source` and snapshotted through the backend into
/// `work/snap`; returns both directories and the bytes the snapshot takes.
fn snapshotted_source(g: &CachedGuest, backend: &MicrovmBackend, work: &Path) -> (PathBuf, PathBuf, u64) {
    let source = work.join("source");
    boot_mid_way(g, &source);
    let dest = work.join("snap");
    std::fs::create_dir(&dest).unwrap();
    let bytes = backend.snapshot(&source, &dest).expect("snapshot through the backend");
    (source, dest, bytes)
}

#[test]
fn a_snapshot_restores_through_the_backend_up_to_the_agent() {
    let g = guest();
    let work = tempfile::tempdir().unwrap();
    let backend: MicrovmBackend = g.backend(PATIENCE);
    let (source, dest, bytes) = snapshotted_source(&g, &backend, work.path());
    assert!(bytes > 0, "the snapshot holds the guest's memory");
    let status = VmmProcess::connect(&source.join("vmm.sock")).unwrap().status().unwrap();
    assert!(
        matches!(status.state, VmState::Running | VmState::GuestExited { .. }),
        "the source runs on after its snapshot: {status:?}"
    );

    let child = work.path().join("child");
    let plan = g.plan(&child, MEMORY_MIB).unwrap();
    let restored = backend.restore(&dest, &plan);
    if hardware_kvm().is_ok() {
        // On hardware KVM the restored kernel boots on to its agent, which runs the hook.
        let report = restored.expect("restore to the agent");
        let _ = writeln!(std::io::stderr(), "after-fork hook: {report:?}");
        backend.destroy(&plan.id, &child).unwrap();
    } else {
        // Under PVM the restored guest continues the boot and ends at the kernel's first
        // unsupported instruction: the restore path is taken up to waiting for the agent.
        let e = restored.unwrap_err();
        let text = e.to_string();
        let _ = writeln!(std::io::stderr(), "restore failed as it must here: {text}");
        assert!(text.contains("the guest ended: vCPU 0: KVM internal error 1 (emulation failure)"), "{text}");
        let log = std::fs::read_to_string(child.join("serial.log")).unwrap();
        assert!(!log.contains("Linux version"), "the restored guest booted again:\n{log}");
        let pid = vmm_pid(&child).expect("the child's VMM pid file");
        assert!(!process_alive(pid), "a failed restore left the VMM {pid} running");
        let store = branchbox_disk::Store::open(&child.join("disk")).unwrap();
        assert!(store.has_chain("root").unwrap(), "the child's own disk chain");
    }
    backend.destroy(&plan.id, &source).unwrap();
    assert!(!source.exists());
}

/// Processes whose command line names `dir`'s control socket: the sandbox's VMMs.
fn vmms_of(dir: &Path) -> Vec<i32> {
    let control = dir.join("vmm.sock");
    let Ok(procs) = std::fs::read_dir("/proc") else { return Vec::new() };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == control.as_os_str().as_encoded_bytes()))
        })
        .filter(|pid| process_alive(*pid))
        .collect()
}

/// The names in a directory, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn a_rollback_swaps_in_a_restored_vmm_or_leaves_the_sandbox_as_it_was() {
    let g = guest();
    let work = tempfile::tempdir().unwrap();
    let backend: MicrovmBackend = g.backend(PATIENCE);
    let (source, dest, _) = snapshotted_source(&g, &backend, work.path());
    let pid = vmm_pid(&source).expect("the source's pid file");
    let files_before = names(&source);
    let chains = || names(&source.join("disk").join("chains"));
    let chains_before = chains();
    assert_eq!(chains_before, ["root.json"], "the booted chain only");

    for attempt in 1..=2 {
        let rolled = backend.rollback(&source, &dest);
        if hardware_kvm().is_ok() {
            // On hardware KVM the restored guest reaches its agent: the new VMM takes over.
            rolled.unwrap_or_else(|e| panic!("rollback {attempt}: {e}"));
            let now = vmm_pid(&source).expect("the pid file names the new VMM");
            assert_ne!(now, pid, "rollback {attempt} kept the old VMM");
            assert!(!process_alive(pid), "the old VMM {pid} still runs");
            assert_eq!(vmms_of(&source), [now], "one VMM serves the sandbox");
            let chain = format!("root-{attempt}");
            assert_eq!(std::fs::read_to_string(source.join("disk.chain")).unwrap(), chain);
            assert_eq!(
                chains(),
                [format!("{chain}.json")],
                "the old chain and the snapshot's record are gone"
            );
            assert!(backend.is_alive(&source));
            continue;
        }
        // Under PVM the restored guest ends at the kernel's first unsupported instruction, so
        // its agent never answers: the rollback must fail and leave the sandbox as it was,
        // the second time too (the snapshot's frozen disk is recorded again, not refused).
        let text = rolled.expect_err("under PVM no agent answers").to_string();
        let _ = writeln!(std::io::stderr(), "rollback {attempt} failed as it must here: {text}");
        assert!(text.contains("the sandbox runs on as it was"), "{text}");
        assert!(text.contains("KVM internal error 1 (emulation failure)"), "{text}");
        assert_eq!(vmm_pid(&source), Some(pid), "the pid file still names the old VMM");
        assert_eq!(vmms_of(&source), [pid], "only the old VMM is left, and it runs");
        let status = VmmProcess::connect(&source.join("vmm.sock")).unwrap().status().unwrap();
        assert!(
            matches!(status.state, VmState::Running | VmState::GuestExited { .. }),
            "the old guest is not left paused: {status:?}"
        );
        assert_eq!(names(&source), files_before, "staged files are left, or the sockets are gone");
        assert_eq!(chains(), chains_before, "the new chain or the snapshot's record is left");
    }
    backend.destroy(&g.plan(&source, MEMORY_MIB).unwrap().id, &source).unwrap();
    assert!(!process_alive(pid));
}
