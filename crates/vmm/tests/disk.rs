//! A VM's disk in snapshot, fork, checkpoint and rollback: the synthetic guest's VM with a
//! virtio-blk disk over a layer chain, driven through its virtqueue in guest memory by the
//! host-side virtio driver (branchbox-virtio's `testing`), as a guest driver would.

mod common;

use common::{check, fill, ok};

use branchbox_disk::{LayerError, LayeredBackend, Store};
use branchbox_virtio::testing::{handshake, notify, DriverQueue};
use branchbox_vmm::disk::DISK_BASE;
use branchbox_vmm::synthetic::devices::{Action, Bus, BusDevice};
use branchbox_vmm::{fork, fork_paused, Hypervisor, ShellPool, Snapshot, Vm};
use std::path::Path;
use std::sync::Arc;
use vm_memory::{Bytes, GuestAddress};

const T_IN: u32 = 0;
const T_OUT: u32 = 1;
/// VERSION_1 and FLUSH.
const FEATURES: u64 = (1 << 32) | (1 << 9);
/// Guest RAM the driver uses, above the test guest's code and data (8 MiB VMs).
const QUEUE_AT: u64 = 0x50_0000;
const HEADER_AT: u64 = 0x51_0000;
const STATUS_AT: u64 = 0x51_1000;
const DATA_AT: u64 = 0x60_0000;
/// The disk: 1 MiB, 256 clusters of 4 KiB.
const DISK_BYTES: u64 = 1 << 20;
const CLUSTER: usize = 4096;
const SECTORS_PER_CLUSTER: u64 = 8;

/// The device's registers on the VM's MMIO bus, as a `BusDevice` for the driver.
struct Registers<'a>(&'a Bus);

impl BusDevice for Registers<'_> {
    fn read(&mut self, offset: u64, data: &mut [u8]) -> Action {
        self.0.read(DISK_BASE + offset, data)
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Action {
        self.0.write(DISK_BASE + offset, data)
    }
}

/// The guest driver's own state (in a real guest it lives in guest RAM, so a fork or a
/// rollback carries a copy of it taken at the same instant).
#[derive(Clone)]
struct Driver {
    queue: DriverQueue,
}

impl Driver {
    fn start(vm: &Vm) -> Driver {
        let queue = DriverQueue::new(QUEUE_AT, 16);
        let status = handshake(&mut Registers(vm.mmio()), FEATURES, std::slice::from_ref(&queue));
        assert_eq!(status, 0xf, "the handshake reaches DRIVER_OK");
        Driver { queue }
    }

    /// One request through the queue: header, data, status; returns the status byte.
    fn request(&mut self, vm: &Vm, kind: u32, cluster: u64, data: &[u8], device_writes: bool) -> u8 {
        let mem = vm.disk_memory().expect("the VM has a disk");
        let mut header = [0u8; 16];
        header[0..4].copy_from_slice(&kind.to_le_bytes());
        header[8..16].copy_from_slice(&(cluster * SECTORS_PER_CLUSTER).to_le_bytes());
        mem.write_slice(&header, GuestAddress(HEADER_AT)).unwrap();
        mem.write_slice(&[0xff], GuestAddress(STATUS_AT)).unwrap();
        if !device_writes {
            mem.write_slice(data, GuestAddress(DATA_AT)).unwrap();
        }
        let len = u32::try_from(data.len()).unwrap();
        let bufs = [
            (GuestAddress(HEADER_AT), 16, false),
            (GuestAddress(DATA_AT), len, device_writes),
            (GuestAddress(STATUS_AT), 1, true),
        ];
        let head = self.queue.add_chain(&mem, &bufs);
        notify(&mut Registers(vm.mmio()), 0);
        let used = self.queue.take_used(&mem);
        assert_eq!(used.len(), 1, "one request, answered before the notification returns");
        assert_eq!(used[0].0, head);
        let mut status = [0u8];
        mem.read_slice(&mut status, GuestAddress(STATUS_AT)).unwrap();
        status[0]
    }

    /// Writes `pattern` over cluster `cluster`.
    fn write(&mut self, vm: &Vm, cluster: u64, pattern: u8) {
        assert_eq!(
            self.request(vm, T_OUT, cluster, &[pattern; CLUSTER], false),
            0,
            "write of cluster {cluster}"
        );
    }

    /// Reads cluster `cluster` into guest RAM and returns it.
    fn read(&mut self, vm: &Vm, cluster: u64) -> Vec<u8> {
        let mut buf = vec![0u8; CLUSTER];
        assert_eq!(self.request(vm, T_IN, cluster, &buf, true), 0, "read of cluster {cluster}");
        vm.disk_memory().unwrap().read_slice(&mut buf, GuestAddress(DATA_AT)).unwrap();
        buf
    }

    /// Asserts cluster `cluster` holds `pattern` throughout.
    fn expect(&mut self, vm: &Vm, cluster: u64, pattern: u8, what: &str) {
        let got = self.read(vm, cluster);
        assert!(
            got.iter().all(|&b| b == pattern),
            "{what}: cluster {cluster} reads {:#x}.., want {pattern:#x}",
            got[0]
        );
    }
}

/// A store with chain `disk` over a zeroed 1 MiB base.
fn store(dir: &Path) -> std::path::PathBuf {
    let base = dir.join("base.img");
    std::fs::write(&base, vec![0u8; DISK_BYTES as usize]).unwrap();
    let root = dir.join("store");
    drop(LayeredBackend::create(&Store::open(&root).unwrap(), "disk", &base).unwrap());
    root
}

/// The booted test guest with the disk of [`store`] attached and its driver started.
fn vm_with_disk(hv: &Arc<Hypervisor>, dir: &Path) -> (Vm, Driver) {
    let mut vm = common::booted(hv, common::small());
    vm.attach_disk(&store(dir), "disk").unwrap();
    let driver = Driver::start(&vm);
    (vm, driver)
}

/// The top layer each chain of the store writes to, by the chains' manifests.
fn top_of(store: &Path, chain: &str) -> String {
    let text = std::fs::read_to_string(store.join("chains").join(format!("{chain}.json"))).unwrap();
    let manifest: serde_json::Value = serde_json::from_str(&text).unwrap();
    manifest["top"].as_str().expect("a chain with a top").to_string()
}

#[test]
fn forked_children_see_the_snapshots_disk_and_only_their_own_writes() {
    let Some(hv) = common::kvm_or_skip() else { return };
    let work = tempfile::tempdir().unwrap();
    let (mut parent, mut driver) = vm_with_disk(&hv, work.path());
    for cluster in 0..4 {
        driver.write(&parent, cluster, 0xa0 + cluster as u8);
    }
    ok(&mut parent, fill(0, 8, 1));
    let snapdir = tempfile::tempdir().unwrap();
    let mut pool = ShellPool::new(&hv, parent.config());
    let (snapshot, children) = fork_paused(&mut parent, snapdir.path(), 3, &mut pool).unwrap();
    assert!(snapshot.disk_ref().is_some(), "the snapshot records the disk");
    let mut children: Vec<Vm> = children.into_iter().map(Result::unwrap).collect();

    // The parent's writes after the snapshot reach no child.
    for cluster in 0..4 {
        driver.write(&parent, cluster, 0x55);
    }
    driver.write(&parent, 20, 0x56);

    let store = parent.disk_store().unwrap().to_path_buf();
    let mut tops = vec![top_of(&store, parent.disk_chain().unwrap())];
    let mut drivers: Vec<Driver> = (0..3).map(|_| driver.clone()).collect();
    for (i, (child, d)) in children.iter_mut().zip(&mut drivers).enumerate() {
        tops.push(top_of(&store, child.disk_chain().unwrap()));
        d.write(child, 10 + i as u64, 0xb0 + i as u8);
        d.write(child, 0, 0xc0 + i as u8);
    }
    tops.sort();
    tops.dedup();
    assert_eq!(tops.len(), 4, "the parent and each child write to a top of their own");

    for (i, (child, d)) in children.iter_mut().zip(&mut drivers).enumerate() {
        let what = format!("child {i}");
        d.expect(child, 0, 0xc0 + i as u8, &what);
        for cluster in 1..4 {
            d.expect(child, cluster, 0xa0 + cluster as u8, &what);
        }
        for sibling in 0..3u64 {
            let want = if sibling == i as u64 { 0xb0 + i as u8 } else { 0 };
            d.expect(child, 10 + sibling, want, &what);
        }
        d.expect(child, 20, 0, &what);
        ok(child, check(0, 8, 1));
    }
    driver.expect(&parent, 0, 0x55, "the parent");
    driver.expect(&parent, 10, 0, "the parent");

    // A later restore of the same snapshot starts from its disk again, not from a child's.
    let mut again = Vm::restore_from(&hv, snapdir.path()).unwrap();
    let mut d = driver.clone();
    d.expect(&again, 0, 0xa0, "a new restore");
    d.expect(&again, 10, 0, "a new restore");
    ok(&mut again, check(0, 8, 1));
}

#[test]
fn rollback_returns_disk_and_memory_to_each_checkpoint() {
    let Some(hv) = common::kvm_or_skip() else { return };
    let work = tempfile::tempdir().unwrap();
    let (mut vm, mut driver) = vm_with_disk(&hv, work.path());
    let dir = tempfile::tempdir().unwrap();
    driver.write(&vm, 0, 0xa1);
    ok(&mut vm, fill(0, 8, 1));
    let c1 = vm.checkpoint(dir.path(), "c1").unwrap().wait().unwrap();
    let at_c1 = driver.clone();

    driver.write(&vm, 0, 0xb2);
    driver.write(&vm, 1, 0xb3);
    ok(&mut vm, fill(0, 8, 2));
    let c2 = vm.checkpoint(dir.path(), "c2").unwrap().wait().unwrap();
    assert_eq!(c2.chain().layers().len(), 2, "c2 is a memory delta");
    let at_c2 = driver.clone();

    driver.write(&vm, 0, 0xcc);
    driver.write(&vm, 2, 0xcd);
    ok(&mut vm, fill(0, 8, 3));

    vm.rollback(&c2).unwrap();
    driver = at_c2.clone();
    driver.expect(&vm, 0, 0xb2, "at c2");
    driver.expect(&vm, 1, 0xb3, "at c2");
    driver.expect(&vm, 2, 0, "at c2");
    ok(&mut vm, check(0, 8, 2));

    vm.rollback(&c1).unwrap();
    driver = at_c1.clone();
    driver.expect(&vm, 0, 0xa1, "at c1");
    driver.expect(&vm, 1, 0, "at c1");
    ok(&mut vm, check(0, 8, 1));

    // Forward again to the later checkpoint, then a write after the rollback stays.
    vm.rollback(&c2).unwrap();
    driver = at_c2;
    driver.expect(&vm, 1, 0xb3, "at c2 again");
    driver.write(&vm, 3, 0xd4);
    driver.expect(&vm, 3, 0xd4, "after the rollback");
}

#[test]
fn what_the_device_writes_into_guest_ram_is_in_the_next_delta_checkpoint() {
    let Some(hv) = common::kvm_or_skip() else { return };
    let work = tempfile::tempdir().unwrap();
    let (mut vm, mut driver) = vm_with_disk(&hv, work.path());
    let dir = tempfile::tempdir().unwrap();
    driver.write(&vm, 5, 0x77);
    // The write's data buffer held the pattern; the checkpoints before the read hold zeros.
    vm.ram().write(DATA_AT, &[0u8; CLUSTER]).unwrap();
    vm.checkpoint(dir.path(), "c1").unwrap().wait().unwrap();
    // The second checkpoint turns KVM's dirty log on: from then on only the log and the
    // host's own record say which pages changed.
    ok(&mut vm, fill(0, 1, 1));
    vm.checkpoint(dir.path(), "c2").unwrap().wait().unwrap();
    // The device writes the cluster's bytes into the data buffer (no guest instruction does).
    assert!(driver.read(&vm, 5).iter().all(|&b| b == 0x77));
    let c3 = vm.checkpoint(dir.path(), "c3").unwrap().wait().unwrap();
    vm.ram().write(DATA_AT, &[0u8; CLUSTER]).unwrap();

    vm.rollback(&c3).unwrap();
    let mut buf = vec![0u8; CLUSTER];
    vm.ram().read(DATA_AT, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0x77), "the read's data is part of c3's memory");
    // And a child of c3 has it too.
    let mut pool = ShellPool::new(&hv, vm.config());
    let child = fork(&c3, 1, &mut pool).pop().unwrap().unwrap();
    child.ram().read(DATA_AT, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0x77), "the read's data is in c3's children");
}

#[test]
fn layers_a_snapshot_needs_are_not_removed_or_collected() {
    let Some(hv) = common::kvm_or_skip() else { return };
    let work = tempfile::tempdir().unwrap();
    let (mut vm, mut driver) = vm_with_disk(&hv, work.path());
    driver.write(&vm, 0, 0xa1);
    let dir = tempfile::tempdir().unwrap();
    let snap = vm.checkpoint(dir.path(), "s").unwrap().wait().unwrap();
    let disk = snap.disk_ref().unwrap().clone();
    let store = Store::open(&disk.store).unwrap();
    let deltas = store.open_frozen(&disk.frozen).unwrap().layer_ids();
    assert_eq!(deltas.len(), 1, "the snapshot froze the top into one delta");
    let parent_chain = vm.disk_chain().unwrap().to_string();

    let refused = store.remove_layer(deltas[0]).unwrap_err();
    match &refused {
        LayerError::LayerInUse { chains, .. } => assert!(chains.contains(&disk.frozen), "{chains:?}"),
        other => panic!("removing the snapshot's layer: {other}"),
    }
    let garbage = store.unreferenced_layers().unwrap();
    assert!(garbage.is_empty(), "nothing is garbage while the snapshot and the VM name it: {garbage:?}");

    // Removing the snapshot removes its frozen chain; the VM's chain still names the delta.
    Snapshot::remove(dir.path(), "s").unwrap();
    assert!(!store.has_chain(&disk.frozen).unwrap(), "the snapshot's frozen chain went with it");
    assert!(matches!(store.remove_layer(deltas[0]), Err(LayerError::LayerInUse { .. })));
    // Once the VM is gone and its chain removed, the delta is garbage.
    drop(vm);
    store.remove_chain(&parent_chain).unwrap();
    let garbage = store.unreferenced_layers().unwrap();
    assert!(
        garbage.iter().any(|p| p.to_string_lossy().contains(&format!("{:016x}", deltas[0]))),
        "the delta no chain names is listed: {garbage:?}"
    );
}

#[test]
fn a_snapshot_whose_disk_is_gone_is_refused_with_its_names() {
    let Some(hv) = common::kvm_or_skip() else { return };
    let work = tempfile::tempdir().unwrap();
    let (mut vm, mut driver) = vm_with_disk(&hv, work.path());
    driver.write(&vm, 0, 0xa1);
    let dir = tempfile::tempdir().unwrap();
    let snap = vm.checkpoint(dir.path(), "s").unwrap().wait().unwrap();
    let disk = snap.disk_ref().unwrap().clone();
    Store::open(&disk.store).unwrap().remove_chain(&disk.frozen).unwrap();
    let err = Snapshot::open_named(dir.path(), "s").err().expect("the snapshot's disk is gone");
    let text = err.to_string();
    assert!(text.contains(&disk.frozen) && text.contains("no chain named"), "{text}");

    // A VM has one disk.
    let err = vm.attach_disk(&disk.store, "disk").unwrap_err();
    assert!(err.to_string().contains("has a disk already"), "{err}");
}

/// The chains of the store at `store`, by name.
fn chains(store: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(store.join("chains"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().trim_end_matches(".json").to_string())
        .collect();
    names.sort();
    names
}

#[test]
fn a_failed_restore_or_fork_leaves_no_chain_behind() {
    let Some(hv) = common::kvm_or_skip() else { return };
    let work = tempfile::tempdir().unwrap();
    let (mut vm, mut driver) = vm_with_disk(&hv, work.path());
    driver.write(&vm, 0, 0xa1);
    let dir = tempfile::tempdir().unwrap();
    let snap = vm.checkpoint(dir.path(), "s").unwrap().wait().unwrap();
    let store = vm.disk_store().unwrap().to_path_buf();
    let before = chains(&store);
    assert_eq!(before.len(), 2, "the VM's chain and the snapshot's frozen chain: {before:?}");

    // A shell of another shape refuses the state after its disk's chain was made.
    let mut other = vm.config();
    other.mem_size *= 2;
    let err = Vm::restore_into(Vm::shell(&hv, other).unwrap(), &snap).err().expect("another shape");
    assert!(err.to_string().contains("shaped"), "{err}");
    assert_eq!(chains(&store), before, "the refused restore's chain was removed");

    // A store that cannot take new tops fails every child of a fork, and makes none.
    std::fs::rename(store.join("layers"), work.path().join("layers-away")).unwrap();
    let mut pool = ShellPool::new(&hv, vm.config());
    let children = fork(&snap, 3, &mut pool);
    std::fs::rename(work.path().join("layers-away"), store.join("layers")).unwrap();
    assert_eq!(children.len(), 3);
    let errors: Vec<String> = children.into_iter().map(|c| c.err().expect("no child").to_string()).collect();
    assert!(
        errors[0].contains(&store.display().to_string()),
        "the first child names the store: {}",
        errors[0]
    );
    assert!(errors[1].contains("first child's error"), "{}", errors[1]);
    assert_eq!(chains(&store), before, "a failed fork makes no chain");
    // With the store back, the same snapshot forks.
    let child = fork(&snap, 1, &mut pool).pop().unwrap().unwrap();
    driver.clone().expect(&child, 0, 0xa1, "a child after the failed fork");
}

#[test]
fn a_snapshot_taken_again_under_its_name_releases_the_old_disk() {
    let Some(hv) = common::kvm_or_skip() else { return };
    let work = tempfile::tempdir().unwrap();
    let (mut vm, mut driver) = vm_with_disk(&hv, work.path());
    let dir = tempfile::tempdir().unwrap();
    driver.write(&vm, 0, 0xa1);
    vm.snapshot(dir.path()).unwrap();
    let first = Snapshot::open(dir.path()).unwrap().disk_ref().unwrap().clone();
    driver.write(&vm, 0, 0xb2);
    vm.snapshot(dir.path()).unwrap();
    let second = Snapshot::open(dir.path()).unwrap();
    let store = vm.disk_store().unwrap().to_path_buf();
    assert_eq!(
        chains(&store),
        {
            let mut want =
                vec![vm.disk_chain().unwrap().to_string(), second.disk_ref().unwrap().frozen.clone()];
            want.sort();
            want
        },
        "the replaced snapshot's frozen chain {} is gone",
        first.frozen
    );
    let mut pool = ShellPool::new(&hv, vm.config());
    let child = fork(&second, 1, &mut pool).pop().unwrap().unwrap();
    driver.clone().expect(&child, 0, 0xb2, "a child of the second snapshot");
}
