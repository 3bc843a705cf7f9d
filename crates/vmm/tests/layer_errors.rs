//! Damaged delta layers give typed errors, and a checkpoint killed mid-write never leaves a
//! snapshot that looks complete.

mod common;

use branchbox_vmm::synthetic::testguest::{self, Command, DATA_BASE};
use branchbox_vmm::{Error, Snapshot, Vm, VmConfig};
use std::io::BufRead;
use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

const PAGE: u64 = 4096;
const STORE_ENV: &str = "BRANCHBOX_VMM_TEST_CRASH_STORE";

fn fill(pages: u64, seed: u64) -> Command {
    Command::Fill { base: DATA_BASE, count: pages, stride: PAGE, seed }
}

/// A store with a base checkpoint `c0` and a delta checkpoint `c1`; returns the delta's path.
fn store() -> Option<(tempfile::TempDir, PathBuf)> {
    let hv = common::kvm_or_skip()?;
    let mut vm = common::booted(&hv, common::small());
    let dir = tempfile::tempdir().unwrap();
    vm.checkpoint(dir.path(), "c0").unwrap().wait().unwrap();
    testguest::call(&mut vm, fill(16, 3)).unwrap();
    let snap = vm.checkpoint(dir.path(), "c1").unwrap().wait().unwrap();
    let delta = dir.path().join(&snap.chain().layers()[1].name);
    Some((dir, delta))
}

fn open_c1(dir: &Path) -> Error {
    match Snapshot::open_named(dir, "c1") {
        Ok(_) => panic!("a damaged chain opened"),
        Err(e) => e,
    }
}

fn flip(path: &Path, at: u64) {
    let f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x5a], at).unwrap();
}

#[test]
fn truncated_delta_layer_is_refused_with_its_sizes() {
    let Some((dir, delta)) = store() else { return };
    let len = std::fs::metadata(&delta).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&delta).unwrap().set_len(len - 100).unwrap();
    let err = open_c1(dir.path());
    assert!(
        matches!(err, Error::LayerSize { found, expected, .. } if found == len - 100 && expected == len),
        "{err:?}"
    );
    std::fs::OpenOptions::new().write(true).open(&delta).unwrap().set_len(10).unwrap();
    assert!(matches!(open_c1(dir.path()), Error::LayerSize { .. }));
    assert_eq!(Snapshot::list(dir.path()).unwrap(), vec!["c0".to_string()]);
}

#[test]
fn corrupt_delta_header_or_index_is_refused_on_open() {
    let Some((dir, delta)) = store() else { return };
    for at in [0, 20, 30, 70] {
        flip(&delta, at);
        let err = open_c1(dir.path());
        assert!(matches!(err, Error::LayerCorrupt { .. }), "byte {at}: {err:?}");
        assert!(err.to_string().contains("take the snapshot again"));
        flip(&delta, at);
    }
    Snapshot::open_named(dir.path(), "c1").unwrap().verify().unwrap();
}

#[test]
fn corrupt_delta_page_data_is_found_by_verify() {
    let Some((dir, delta)) = store() else { return };
    let len = std::fs::metadata(&delta).unwrap().len();
    flip(&delta, len - 1);
    let snap = Snapshot::open_named(dir.path(), "c1").unwrap();
    let err = snap.verify().unwrap_err();
    assert!(
        matches!(&err, Error::LayerCorrupt { reason, .. } if reason.contains("page data checksum")),
        "{err:?}"
    );
}

#[test]
fn a_delta_replaced_by_another_is_refused() {
    let Some((dir, delta)) = store() else { return };
    let Some((_other_dir, other)) = store() else { return };
    std::fs::copy(&other, &delta).unwrap();
    let err = open_c1(dir.path());
    assert!(matches!(&err, Error::LayerCorrupt { reason, .. } if reason.contains("replaced")), "{err:?}");
}

/// Checkpoints `c<i>` in a loop, each with 1024 pages of seed `i`, forever; prints each
/// completed name. Runs in the re-executed test binary.
fn checkpoint_forever(dir: &Path) {
    let hv = branchbox_vmm::Hypervisor::open().unwrap();
    let mut vm = Vm::boot(&hv, VmConfig { mem_size: 16 << 20, vcpus: 1, irqchip: false }).unwrap();
    testguest::install(&mut vm).unwrap();
    testguest::call(&mut vm, fill(1024, 0)).unwrap();
    vm.checkpoint(dir, "c0").unwrap().wait().unwrap();
    println!("done c0");
    for i in 1.. {
        testguest::call(&mut vm, fill(1024, i)).unwrap();
        let name = format!("c{i}");
        vm.checkpoint(dir, &name).unwrap().wait().unwrap();
        println!("done {name}");
    }
}

#[test]
fn a_checkpoint_killed_mid_write_never_looks_complete() {
    if let Ok(dir) = std::env::var(STORE_ENV) {
        checkpoint_forever(Path::new(&dir));
        return;
    }
    let Some(hv) = common::kvm_or_skip() else { return };
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    for round in 0..3u64 {
        let mut child = std::process::Command::new(&exe)
            .args([
                "--exact",
                "a_checkpoint_killed_mid_write_never_looks_complete",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(STORE_ENV, dir.path())
            .stdout(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let mut done = 0;
        while done < 3 {
            if lines.next().unwrap().unwrap().starts_with("done") {
                done += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(3 + 7 * round));
        // The VMM and its writer processes die together.
        // SAFETY: signals the process group of the child just spawned.
        unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
        child.wait().unwrap();
    }
    let cut: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    println!("writes cut short by the kills: {cut:?}");
    // Leftovers of a write cut short: never listed.
    std::fs::write(dir.path().join(".mem-x.delta.tmp"), b"half").unwrap();
    std::fs::write(dir.path().join(".c99.state.tmp"), b"half").unwrap();
    let names = Snapshot::list(dir.path()).unwrap();
    assert!(names.len() >= 3, "{names:?}");
    for name in names {
        let seed: u64 = name.trim_start_matches('c').parse().unwrap();
        let snap = Snapshot::open_named(dir.path(), &name).unwrap();
        let mut vm = Vm::restore_into(Vm::shell(&hv, snap.state().config).unwrap(), &snap).unwrap();
        let check = Command::Check { base: DATA_BASE, count: 1024, stride: PAGE, seed };
        let a = testguest::call(&mut vm, check).unwrap();
        assert_eq!(a.status, 0, "snapshot {name} restored with the wrong memory: {a:?}");
    }
}
