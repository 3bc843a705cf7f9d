//! Chains against a flat model of the disk: lookups at depth, freeze, fork, rollback, and the
//! lifecycle (remove, flatten, garbage).

mod common;

use branchbox_disk::{BlockBackend, LayerError, LayeredBackend, Store, CLUSTER_SIZE};
use common::{base_disk, fill_cluster, random_write, read_all, read_at};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CLUSTERS: u64 = 64;

#[test]
fn lookups_at_depth_four_match_a_flat_model_before_and_after_reopening() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (base, mut model) = base_disk(dir.path(), CLUSTERS, 1);
    let store = Store::open(&dir.path().join("store")).expect("store");
    let mut disk = LayeredBackend::create(&store, "vm", &base).expect("create chain");
    let mut rng = StdRng::seed_from_u64(2);
    for round in 0..4 {
        for _ in 0..40 {
            random_write(&mut rng, &mut disk, &mut model);
        }
        // Reads of random ranges, crossing clusters and layers, against the model.
        for _ in 0..40 {
            let len = rng.gen_range(1..=16u64) * 512;
            let at = rng.gen_range(0..=(model.len() as u64 - len) / 512) * 512;
            assert_eq!(
                read_at(&mut disk, at, len as usize),
                model[at as usize..(at + len) as usize],
                "round {round}"
            );
        }
        disk.freeze().expect("freeze");
    }
    for _ in 0..20 {
        random_write(&mut rng, &mut disk, &mut model);
    }
    assert_eq!(disk.frozen().depth(), 4);
    assert!(read_all(&mut disk) == model, "the disk at depth 4 differs from the model");
    // Dropped without a flush: the handle's close writes its pending slots.
    drop(disk);
    let mut disk = LayeredBackend::open(&store, "vm").expect("reopen");
    assert_eq!(disk.frozen().depth(), 4);
    assert!(read_all(&mut disk) == model, "the reopened disk differs from the model");
}

#[test]
fn fork_children_never_see_each_other_or_the_parent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (base, _) = base_disk(dir.path(), CLUSTERS, 3);
    let store = Store::open(&dir.path().join("store")).expect("store");
    let mut parent = LayeredBackend::create(&store, "parent", &base).expect("create");
    fill_cluster(&mut parent, 5, 0xaa);
    let frozen = parent.freeze().expect("freeze");
    let mut children = LayeredBackend::fork(&store, &frozen, &["a", "b"]).expect("fork");
    assert_ne!(children[0].top_id(), children[1].top_id(), "children share a writable layer");
    assert_ne!(children[0].top_id(), parent.top_id());
    let cluster5 = |d: &mut branchbox_disk::LayeredBackend| read_at(d, 5 * CLUSTER_SIZE, 4096);
    fill_cluster(&mut children[0], 5, 0x0a);
    assert_eq!(cluster5(&mut children[0]), vec![0x0a; 4096]);
    assert_eq!(cluster5(&mut children[1]), vec![0xaa; 4096], "a sibling saw child a's write");
    assert_eq!(cluster5(&mut parent), vec![0xaa; 4096], "the parent saw child a's write");
    fill_cluster(&mut children[1], 5, 0x0b);
    fill_cluster(&mut parent, 5, 0x0c);
    assert_eq!(cluster5(&mut children[0]), vec![0x0a; 4096], "child a saw another's write");
    // And the same from the files, reopened.
    drop(children);
    drop(parent);
    for (name, byte) in [("a", 0x0a), ("b", 0x0b), ("parent", 0x0c)] {
        let mut d = LayeredBackend::open(&store, name).expect("reopen");
        assert_eq!(cluster5(&mut d), vec![byte; 4096], "chain {name} after reopening");
    }
}

#[test]
fn rollback_discards_the_top_and_returns_to_the_frozen_disk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (base, base_bytes) = base_disk(dir.path(), CLUSTERS, 4);
    let store = Store::open(&dir.path().join("store")).expect("store");
    let mut disk = LayeredBackend::create(&store, "vm", &base).expect("create");
    fill_cluster(&mut disk, 1, 1);
    let checkpoint = disk.freeze().expect("freeze");
    fill_cluster(&mut disk, 1, 2);
    fill_cluster(&mut disk, 2, 2);
    let discarded = disk.top_id();
    disk.rollback(&checkpoint).expect("rollback");
    assert_eq!(read_at(&mut disk, CLUSTER_SIZE, 4096), vec![1; 4096]);
    assert_eq!(read_at(&mut disk, 2 * CLUSTER_SIZE, 4096), base_bytes[8192..12288]);
    assert!(
        !dir.path().join(format!("store/layers/{discarded:016x}.layer")).exists(),
        "the discarded top is still on disk"
    );
    drop(disk);
    let mut disk = LayeredBackend::open(&store, "vm").expect("reopen");
    assert_eq!(read_at(&mut disk, CLUSTER_SIZE, 4096), vec![1; 4096]);
    assert_eq!(read_at(&mut disk, 2 * CLUSTER_SIZE, 4096), base_bytes[8192..12288]);
}

#[test]
fn layers_in_use_are_not_removed_and_flatten_leaves_garbage_to_collect() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (base, mut model) = base_disk(dir.path(), CLUSTERS, 5);
    let store = Store::open(&dir.path().join("store")).expect("store");
    let mut disk = LayeredBackend::create(&store, "vm", &base).expect("create");
    let mut rng = StdRng::seed_from_u64(6);
    for _ in 0..5 {
        for _ in 0..10 {
            random_write(&mut rng, &mut disk, &mut model);
        }
        disk.freeze().expect("freeze");
    }
    let frozen = disk.frozen().clone();
    store.save_frozen("snap", &frozen).expect("save");
    let oldest = frozen.layer_ids()[0];
    match store.remove_layer(oldest) {
        Err(LayerError::LayerInUse { chains, .. }) => assert_eq!(chains, vec!["snap", "vm"]),
        other => panic!("removing a layer in use: {other:?}"),
    }
    assert!(store.unreferenced_layers().expect("garbage").is_empty());

    // An open chain cannot be flattened (its handle reads the old deltas).
    assert!(matches!(store.flatten("vm"), Err(LayerError::TopInUse { .. })));
    store.flatten("snap").expect("flatten the snapshot");
    let flat = store.open_frozen("snap").expect("open flattened");
    assert_eq!(flat.depth(), 1);
    // Still referenced by the live chain: nothing to collect yet.
    assert!(store.unreferenced_layers().expect("garbage").is_empty());
    drop(disk);
    store.flatten("vm").expect("flatten the closed chain");
    let garbage = store.unreferenced_layers().expect("garbage");
    assert_eq!(garbage.len(), 5, "the five old deltas: {garbage:?}");
    for path in &garbage {
        let id = u64::from_str_radix(&path.file_stem().expect("name").to_string_lossy(), 16).expect("id");
        store.remove_layer(id).expect("collect");
    }
    let mut disk = LayeredBackend::open(&store, "vm").expect("reopen");
    assert_eq!(disk.frozen().depth(), 1);
    assert!(read_all(&mut disk) == model, "flattening changed the disk");

    // Fork from the flattened snapshot, then remove the chain: its top goes with it.
    let mut child = LayeredBackend::fork(&store, &flat, &["child"]).expect("fork").remove(0);
    assert!(read_all(&mut child) == model);
    assert!(matches!(store.remove_chain("child"), Err(LayerError::TopInUse { .. })));
    drop(child);
    store.remove_chain("child").expect("remove the child");
    assert!(store.unreferenced_layers().expect("garbage").is_empty());
}

#[test]
fn one_top_is_open_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (base, _) = base_disk(dir.path(), CLUSTERS, 7);
    let store = Store::open(&dir.path().join("store")).expect("store");
    let disk = LayeredBackend::create(&store, "vm", &base).expect("create");
    assert!(matches!(LayeredBackend::open(&store, "vm"), Err(LayerError::TopInUse { .. })));
    assert!(matches!(LayeredBackend::create(&store, "vm", &base), Err(LayerError::ChainExists { .. })));
    assert!(matches!(LayeredBackend::open(&store, "../vm"), Err(LayerError::ChainName { .. })));
    drop(disk);
    LayeredBackend::open(&store, "vm").expect("open after close");
}

#[test]
fn requests_past_the_end_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (base, _) = base_disk(dir.path(), CLUSTERS, 8);
    let store = Store::open(&dir.path().join("store")).expect("store");
    let mut disk = LayeredBackend::create(&store, "vm", &base).expect("create");
    let last = disk.sectors() - 1;
    assert!(disk.write(last, &[0u8; 1024]).is_err());
    assert!(disk.read(u64::MAX / 2, &mut [0u8; 512]).is_err());
    assert!(disk.write(last, &[7u8; 512]).is_ok());
}

#[test]
fn a_fork_makes_every_child_or_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (base, _) = base_disk(dir.path(), CLUSTERS, 9);
    let store = Store::open(&dir.path().join("store")).expect("store");
    let mut disk = LayeredBackend::create(&store, "vm", &base).expect("create");
    let frozen = disk.freeze().expect("freeze");
    for names in [&["x", "vm"][..], &["y", "y"][..], &["z", "bad/name"][..]] {
        assert!(LayeredBackend::fork(&store, &frozen, names).is_err(), "fork {names:?} succeeded");
        for name in ["x", "y", "z"] {
            assert!(!store.has_chain(name).expect("has_chain"), "fork {names:?} left chain {name}");
        }
        assert!(store.unreferenced_layers().expect("garbage").is_empty(), "fork {names:?} left a top");
    }
    let children = LayeredBackend::fork(&store, &frozen, &["x", "y", "z"]).expect("fork");
    assert_eq!(children.len(), 3);
}
