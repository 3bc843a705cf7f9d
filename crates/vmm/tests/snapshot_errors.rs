//! Damaged, foreign and incomplete snapshots give a clear, typed error, never a panic.

mod common;

use branchbox_vmm::snapshot::STATE_FILE;
use branchbox_vmm::{Error, Snapshot, Vm};
use std::path::Path;

/// A snapshot directory of a booted test guest.
fn snapshot_dir() -> Option<tempfile::TempDir> {
    let hv = common::kvm_or_skip()?;
    let mut vm = common::booted(&hv, common::small());
    let dir = tempfile::tempdir().unwrap();
    vm.snapshot(dir.path()).unwrap();
    Some(dir)
}

fn layer_of(dir: &Path) -> std::path::PathBuf {
    let snap = Snapshot::open(dir).unwrap();
    dir.join(&snap.state().memory.layers[0].name)
}

fn open_err(dir: &Path) -> Error {
    match Snapshot::open(dir) {
        Ok(_) => panic!("a damaged snapshot opened"),
        Err(e) => e,
    }
}

#[test]
fn truncated_state_file_is_reported_as_truncated() {
    let Some(dir) = snapshot_dir() else { return };
    let path = dir.path().join(STATE_FILE);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let err = open_err(dir.path());
    assert!(matches!(err, Error::SnapshotTruncated { .. }), "{err:?}");
    assert!(err.to_string().contains("take the snapshot again"));
}

#[test]
fn corrupt_state_file_fails_its_checksum() {
    let Some(dir) = snapshot_dir() else { return };
    let path = dir.path().join(STATE_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 100;
    bytes[last] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let err = open_err(dir.path());
    assert!(matches!(&err, Error::SnapshotCorrupt { reason, .. } if reason.contains("checksum")), "{err:?}");
}

#[test]
fn snapshot_from_another_format_version_is_refused() {
    let Some(dir) = snapshot_dir() else { return };
    let path = dir.path().join(STATE_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[8..12].copy_from_slice(&7u32.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let err = open_err(dir.path());
    assert!(matches!(err, Error::SnapshotVersion { found: 7, supported: 4, .. }), "{err:?}");
    assert!(err.to_string().contains("format version 7"));
}

#[test]
fn missing_memory_layer_is_named_in_the_error() {
    let Some(dir) = snapshot_dir() else { return };
    let layer = layer_of(dir.path());
    std::fs::remove_file(&layer).unwrap();
    let err = open_err(dir.path());
    assert!(matches!(err, Error::LayerMissing { .. }), "{err:?}");
    assert!(err.to_string().contains("copy the whole snapshot directory"));
}

#[test]
fn cut_short_memory_layer_is_refused() {
    let Some(dir) = snapshot_dir() else { return };
    let layer = layer_of(dir.path());
    let f = std::fs::OpenOptions::new().write(true).open(&layer).unwrap();
    f.set_len(4096).unwrap();
    let err = open_err(dir.path());
    assert!(matches!(err, Error::LayerSize { found: 4096, .. }), "{err:?}");
}

#[test]
fn restoring_from_a_directory_without_a_snapshot_says_so() {
    let Some(hv) = common::kvm_or_skip() else { return };
    let dir = tempfile::tempdir().unwrap();
    let err = match Vm::restore_from(&hv, dir.path()) {
        Ok(_) => panic!("restored from an empty directory"),
        Err(e) => e,
    };
    assert!(matches!(err, Error::SnapshotIo { op: "open", .. }), "{err:?}");
}
