//! Fork: children of one snapshot are independent VMs that share clean memory.

mod common;

use branchbox_vmm::synthetic::testguest::{self, Command, DATA_BASE};
use branchbox_vmm::{fork, fork_paused, ShellPool, Snapshot, VmConfig};

const PAGE: u64 = 4096;

fn fill(base: u64, pages: u64, seed: u64) -> Command {
    Command::Fill { base, count: pages, stride: PAGE, seed }
}

fn check(base: u64, pages: u64, seed: u64) -> Command {
    Command::Check { base, count: pages, stride: PAGE, seed }
}

#[test]
fn forked_children_do_not_see_each_others_or_the_parents_writes() {
    let Some(hv) = common::kvm_or_skip() else {
        return;
    };
    let config = VmConfig { mem_size: 16 << 20, ..common::small() };
    let mut parent = common::booted(&hv, config);
    let shared = DATA_BASE;
    let own = DATA_BASE + (1 << 20);
    testguest::call(&mut parent, fill(shared, 16, 1)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut pool = ShellPool::new(&hv, config);
    pool.fill(100).unwrap();
    let (_snapshot, children) = fork_paused(&mut parent, dir.path(), 100, &mut pool).unwrap();
    let mut children: Vec<_> = children.into_iter().map(Result::unwrap).collect();
    assert_eq!(children.len(), 100);

    for (i, child) in children.iter_mut().enumerate() {
        let a = testguest::call(child, fill(own, 16, 1000 + i as u64)).unwrap();
        assert_eq!(a.status, 0);
    }
    // The parent writes over the shared range after the fork.
    testguest::call(&mut parent, fill(shared, 16, 2)).unwrap();
    testguest::call(&mut parent, fill(own, 16, 3)).unwrap();

    for (i, child) in children.iter_mut().enumerate() {
        let mine = testguest::call(child, check(own, 16, 1000 + i as u64)).unwrap();
        assert_eq!(mine.status, 0, "child {i} lost its own writes: {mine:?}");
        let before = testguest::call(child, check(shared, 16, 1)).unwrap();
        assert_eq!(before.status, 0, "child {i} saw the parent's later writes");
        // Registers are per child too: each has answered exactly its own calls.
        assert_eq!(before.seq, 5);
    }
    let a = testguest::call(&mut parent, check(shared, 16, 2)).unwrap();
    assert_eq!(a.status, 0);
}

#[test]
fn child_dirtying_k_pages_adds_about_k_pages() {
    let Some(hv) = common::kvm_or_skip() else {
        return;
    };
    let config = VmConfig { mem_size: 64 << 20, ..common::small() };
    let mut parent = common::booted(&hv, config);
    // Touch every data page so the layer really holds 62 MiB.
    let pages = (config.mem_size - DATA_BASE) / PAGE;
    testguest::call(&mut parent, fill(DATA_BASE, pages, 5)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    parent.snapshot(dir.path()).unwrap();
    let snapshot = Snapshot::open(dir.path()).unwrap();
    let mut pool = ShellPool::new(&hv, config);
    let mut child = fork(&snapshot, 1, &mut pool).pop().unwrap().unwrap();

    // Reading every page shares it; only the mailbox and the page tables' A/D bits copy.
    let a = testguest::call(&mut child, check(DATA_BASE, pages, 5)).unwrap();
    assert_eq!(a.status, 0);
    let base = child.ram().private_bytes().unwrap() / PAGE;
    assert!(base <= 16, "a child that only read added {base} pages");

    let k = 300;
    testguest::call(&mut child, fill(DATA_BASE, k, 6)).unwrap();
    let added = child.ram().private_bytes().unwrap() / PAGE - base;
    assert!((k..=k + 16).contains(&added), "dirtying {k} pages added {added} pages (RAM is {pages} pages)");
}

#[test]
fn fork_from_a_snapshot_directory_restores_independent_children() {
    let Some(hv) = common::kvm_or_skip() else {
        return;
    };
    let mut parent = common::booted(&hv, common::small());
    testguest::call(&mut parent, fill(DATA_BASE, 4, 9)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    parent.snapshot(dir.path()).unwrap();
    drop(parent);
    let snapshot = Snapshot::open(dir.path()).unwrap();
    let mut pool = ShellPool::new(&hv, common::small());
    for child in fork(&snapshot, 3, &mut pool) {
        let mut child = child.unwrap();
        let a = testguest::call(&mut child, check(DATA_BASE, 4, 9)).unwrap();
        assert_eq!((a.status, a.seq), (0, 3));
    }
}

#[test]
fn fork_into_shells_of_another_shape_fails_each_child_with_a_clear_error() {
    let Some(hv) = common::kvm_or_skip() else {
        return;
    };
    let mut parent = common::booted(&hv, common::small());
    let dir = tempfile::tempdir().unwrap();
    parent.snapshot(dir.path()).unwrap();
    let snapshot = Snapshot::open(dir.path()).unwrap();
    let other = VmConfig { mem_size: 4 << 20, ..common::small() };
    let mut pool = ShellPool::new(&hv, other);
    let children = fork(&snapshot, 3, &mut pool);
    assert_eq!(children.len(), 3);
    for child in children {
        let err = child.err().expect("a child restored into a shell of the wrong shape");
        assert!(err.to_string().contains("snapshot is for a VM shaped"), "{err}");
    }
}
