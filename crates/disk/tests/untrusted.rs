//! Layer files and manifests are untrusted: damaged, truncated, foreign or torn ones are
//! refused with a reason (or, for a top's torn tail, ignored), never a panic.

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use branchbox_disk::format::{slot_offset, HEADER_LEN};
use branchbox_disk::{BlockBackend, FormatError, LayerError, LayeredBackend, Store, CLUSTER_SIZE};
use common::{base_disk, fill_cluster, read_at};

const CLUSTERS: u64 = 32;

fn layer_file(store: &Path, id: u64) -> PathBuf {
    store.join(format!("layers/{id:016x}.layer"))
}

/// A store with chain "vm" of one frozen delta holding clusters 0..4; returns the delta's id.
fn one_delta(dir: &Path) -> (Store, u64) {
    let (base, _) = base_disk(dir, CLUSTERS, 11);
    let store = Store::open(&dir.join("store")).expect("store");
    let mut disk = LayeredBackend::create(&store, "vm", &base).expect("create");
    for c in 0..4 {
        fill_cluster(&mut disk, c, c as u8 + 1);
    }
    let frozen = disk.freeze().expect("freeze");
    (store, frozen.layer_ids()[0])
}

fn open_err(store: &Store) -> LayerError {
    match LayeredBackend::open(store, "vm") {
        Ok(_) => panic!("a damaged chain opened"),
        Err(e) => e,
    }
}

#[test]
fn a_damaged_delta_header_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, delta) = one_delta(dir.path());
    let file = std::fs::OpenOptions::new().write(true).open(layer_file(store.root(), delta)).expect("open");
    file.write_all_at(&[0xff], 20).expect("damage");
    drop(file);
    let err = open_err(&store);
    assert!(matches!(err, LayerError::Format { source: FormatError::HeaderChecksum, .. }), "{err}");
}

#[test]
fn a_truncated_or_extended_delta_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, delta) = one_delta(dir.path());
    let path = layer_file(store.root(), delta);
    let len = std::fs::metadata(&path).expect("stat").len();
    let file = std::fs::OpenOptions::new().write(true).open(&path).expect("open");
    file.set_len(len - 1).expect("truncate");
    assert!(matches!(open_err(&store), LayerError::LayerSize { .. }));
    file.set_len(len + CLUSTER_SIZE).expect("extend");
    assert!(matches!(open_err(&store), LayerError::LayerSize { .. }));
    file.set_len(len).expect("restore");
    // A damaged slot of a frozen delta: refused, not silently read from below.
    file.write_all_at(&[0xee], slot_offset(2) + 3).expect("damage a slot");
    let err = open_err(&store);
    assert!(
        matches!(err, LayerError::Format { source: FormatError::MissingEntry { slot: 2, .. }, .. }),
        "{err}"
    );
}

#[test]
fn garbage_in_place_of_a_layer_or_manifest_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, delta) = one_delta(dir.path());
    let path = layer_file(store.root(), delta);
    for garbage in [vec![], vec![0u8; 10], vec![0x5a; HEADER_LEN as usize * 3]] {
        std::fs::write(&path, &garbage).expect("write garbage");
        assert!(matches!(open_err(&store), LayerError::Format { .. }));
    }
    let manifest = store.root().join("chains/vm.json");
    for text in ["", "{", "[]", "{\"version\":1}", &"x".repeat(300 << 10)] {
        std::fs::write(&manifest, text).expect("write manifest");
        assert!(matches!(open_err(&store), LayerError::Manifest { .. }), "{text:.20}");
    }
    // A manifest that cannot be read stops garbage collection: its layers are not garbage.
    assert!(store.unreferenced_layers().is_err());
}

#[test]
fn a_chain_whose_layers_disagree_on_the_disk_size_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = one_delta(dir.path());
    // A delta of a disk twice as large, from another store, named in this chain's manifest.
    let other_dir = dir.path().join("other");
    std::fs::create_dir(&other_dir).expect("mkdir");
    let (other_base, _) = base_disk(&other_dir, CLUSTERS * 2, 12);
    let other = Store::open(&other_dir.join("store")).expect("store");
    let mut big = LayeredBackend::create(&other, "big", &other_base).expect("create");
    fill_cluster(&mut big, 40, 9);
    let foreign = big.freeze().expect("freeze").layer_ids()[0];
    std::fs::copy(layer_file(other.root(), foreign), layer_file(store.root(), foreign)).expect("copy");
    let manifest_path = store.root().join("chains/vm.json");
    let text = std::fs::read_to_string(&manifest_path).expect("read");
    let text = text.replacen(
        "\"deltas\": [",
        &format!("\"deltas\": [{{\"id\": \"{foreign:016x}\", \"clusters\": 1}},"),
        1,
    );
    std::fs::write(&manifest_path, text).expect("write");
    let err = open_err(&store);
    assert!(matches!(err, LayerError::DiskSizeDisagrees { .. }), "{err}");
    // And a base that is not the chain's size.
    std::fs::write(dir.path().join("base-11.img"), vec![0u8; 4096]).expect("shrink base");
    assert!(matches!(open_err(&store), LayerError::BaseSize { .. }));
}

#[test]
fn a_torn_slot_in_a_top_ends_its_valid_prefix_and_stale_slots_after_it_are_cleared() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (base, base_bytes) = base_disk(dir.path(), CLUSTERS, 13);
    let store = Store::open(&dir.path().join("store")).expect("store");
    let mut disk = LayeredBackend::create(&store, "vm", &base).expect("create");
    let top = disk.top_id();
    for c in 0..3 {
        fill_cluster(&mut disk, c, 0x10 + c as u8);
    }
    disk.flush().expect("flush");
    fill_cluster(&mut disk, 10, 0x1a);
    fill_cluster(&mut disk, 11, 0x1b);
    disk.flush().expect("flush");
    drop(disk);
    // Slot 3 (cluster 10) torn, as a crash mid-write of the slots could leave it; slot 4
    // (cluster 11) whole.
    let file = std::fs::OpenOptions::new().write(true).open(layer_file(store.root(), top)).expect("open");
    file.write_all_at(&[0, 0, 0, 0], slot_offset(3) + 12).expect("tear");
    drop(file);

    let original =
        |c: u64| base_bytes[(c * CLUSTER_SIZE) as usize..((c + 1) * CLUSTER_SIZE) as usize].to_vec();
    let mut disk = LayeredBackend::open(&store, "vm").expect("reopen");
    assert_eq!(disk.top_clusters(), 3);
    assert_eq!(read_at(&mut disk, 2 * CLUSTER_SIZE, 4096), vec![0x12; 4096]);
    assert_eq!(read_at(&mut disk, 10 * CLUSTER_SIZE, 4096), original(10));
    assert_eq!(
        read_at(&mut disk, 11 * CLUSTER_SIZE, 4096),
        original(11),
        "a slot after the torn one was used"
    );
    // A new cluster reuses slot 3; the stale slot 4 must not come back to describe anything.
    fill_cluster(&mut disk, 20, 0x20);
    disk.flush().expect("flush");
    drop(disk);
    let mut disk = LayeredBackend::open(&store, "vm").expect("reopen again");
    assert_eq!(disk.top_clusters(), 4);
    assert_eq!(read_at(&mut disk, 20 * CLUSTER_SIZE, 4096), vec![0x20; 4096]);
    assert_eq!(read_at(&mut disk, 11 * CLUSTER_SIZE, 4096), original(11));
}
