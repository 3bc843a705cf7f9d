//! The microvm backend's failure paths, with the cached guest: a missing kernel or root disk
//! is named with what builds it, and a guest that ends before its agent answers fails
//! `create` with the guest's end reason and its serial log, leaving no VMM process behind.
//! On the PVM hosts we build on that last case is what really happens (the kernel stops at
//! its first unsupported instruction), so it runs here; on hardware KVM the guest reaches its
//! agent instead, which `linux_kvm.rs` covers.

use branchbox_guest_tests::kvm::hardware_kvm;
use branchbox_guest_tests::microvm::{cached_guest, process_alive, CachedGuest};
use branchbox_microvm::MicrovmBackend;
use branchbox_model::{Backend, Error};
use std::io::Write;
use std::path::Path;
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
    assert!(text.contains("build it with `branchbox guest disk`"), "{text}");
    assert!(vmm_pid(&dir).is_none(), "no VMM is started without a disk");
}

#[test]
fn snapshot_rollback_restore_and_fork_say_what_is_missing() {
    let g = guest();
    let work = tempfile::tempdir().unwrap();
    let backend: MicrovmBackend = g.backend(PATIENCE);
    let plan = g.plan(&work.path().join("child"), MEMORY_MIB).unwrap();
    let d = work.path();
    let errors = [
        backend.snapshot(d, d).map(drop).unwrap_err(),
        backend.rollback(d, d).unwrap_err(),
        backend.restore(d, &plan).map(drop).unwrap_err(),
        backend.fork(d, d, std::slice::from_ref(&plan)).map(drop).unwrap_err(),
    ];
    for e in errors {
        assert!(
            matches!(&e, Error::Unavailable(m) if m.contains("Linux guest snapshots are not built yet")),
            "{e:?}"
        );
    }
}
