//! Checkpoint, rollback, chains and live branches of one VM.

mod common;

use common::{check, fill, ok, PAGE};

use branchbox_vmm::snapshot::format;
use branchbox_vmm::synthetic::testguest::{self, lcg, Command, DATA_BASE};
use branchbox_vmm::synthetic::vcpu::RunOutcome;
use branchbox_vmm::{fork, fork_live, ShellPool, Snapshot, VmConfig};
use std::time::Duration;

#[test]
fn rollback_restores_memory_and_registers_of_any_checkpoint() {
    let Some(hv) = common::kvm_or_skip() else { return };
    let mut vm = common::booted(&hv, common::small());
    let dir = tempfile::tempdir().unwrap();
    ok(&mut vm, fill(0, 64, 1));
    let c1 = vm.checkpoint(dir.path(), "c1").unwrap().wait().unwrap();
    ok(&mut vm, fill(8, 8, 2));
    let c2 = vm.checkpoint(dir.path(), "c2").unwrap().wait().unwrap();
    assert_eq!(c2.chain().layers().len(), 2, "the second checkpoint is a delta");
    let seq_c2 = ok(&mut vm, fill(0, 64, 3));

    vm.rollback(&c2).unwrap();
    ok(&mut vm, check(0, 8, 1));
    ok(&mut vm, check(8, 8, 2));
    let seq = ok(&mut vm, check(16, 48, 1));
    assert_eq!(seq, seq_c2 + 2, "the answer counter (r15) came back from c2");

    vm.rollback(&c1).unwrap();
    let seq = ok(&mut vm, check(0, 64, 1));
    assert_eq!(seq, 3);
    // And forward again, to the later checkpoint.
    vm.rollback(&c2).unwrap();
    ok(&mut vm, check(8, 8, 2));
}

#[test]
fn rollback_resumes_a_computation_from_the_checkpoints_registers() {
    let Some(hv) = common::kvm_or_skip() else { return };
    let mut vm = common::booted(&hv, common::small());
    let dir = tempfile::tempdir().unwrap();
    vm.checkpoint(dir.path(), "base").unwrap().wait().unwrap();
    let (iterations, seed) = (300_000_000, 7);
    testguest::post(&vm, Command::Count { base: DATA_BASE, iterations, mask: 4095, seed }).unwrap();
    let pause = vm.pause_handle().unwrap();
    let runner = std::thread::spawn(move || {
        let outcome = vm.run();
        (vm, outcome)
    });
    std::thread::sleep(Duration::from_millis(20));
    pause.request_pause();
    let (mut vm, outcome) = runner.join().unwrap();
    assert_eq!(outcome.unwrap(), RunOutcome::Paused, "the computation ended before the pause");
    let mid = vm.checkpoint(dir.path(), "mid").unwrap().wait().unwrap();
    let rip = mid.state().vcpus[0].regs.rip;
    // Finish, then scribble over the region and the registers' world.
    let done = testguest::wait_answer(&mut vm).unwrap();
    assert_eq!((done.status, done.a, done.b), (0, lcg(seed, iterations), iterations));
    ok(&mut vm, fill(0, 16, 99));
    vm.rollback(&mid).unwrap();
    assert_eq!(vm.vcpu(0).unwrap().fd().get_regs().unwrap().rip, rip);
    let again = testguest::wait_answer(&mut vm).unwrap();
    assert_eq!((again.status, again.a, again.b, again.seq), (0, lcg(seed, iterations), iterations, done.seq));
}

#[test]
fn depth_three_chain_children_see_exactly_the_merged_memory() {
    let Some(hv) = common::kvm_or_skip() else { return };
    let config = VmConfig { mem_size: 16 << 20, ..common::small() };
    let mut vm = common::booted(&hv, config);
    let dir = tempfile::tempdir().unwrap();
    ok(&mut vm, fill(0, 256, 10));
    vm.checkpoint(dir.path(), "d0").unwrap().wait().unwrap();
    // Each delta overlaps the one before; the expected map is page -> newest seed.
    let writes = [(16, 64, 11), (48, 64, 12), (0, 8, 13)];
    let mut expect = [10u64; 256];
    for (depth, &(page, pages, seed)) in writes.iter().enumerate() {
        ok(&mut vm, fill(page, pages, seed));
        expect[page as usize..(page + pages) as usize].fill(seed);
        vm.checkpoint(dir.path(), &format!("d{}", depth + 1)).unwrap().wait().unwrap();
    }
    ok(&mut vm, fill(0, 256, 14));
    let snap = Snapshot::open_named(dir.path(), "d3").unwrap();
    assert_eq!(snap.chain().layers().len(), 4);
    snap.verify().unwrap();
    let mut pool = ShellPool::new(&hv, config);
    for mut child in fork(&snap, 2, &mut pool).into_iter().map(Result::unwrap) {
        for (page, &seed) in expect.iter().enumerate() {
            let value = child.ram().read_u64(DATA_BASE + page as u64 * PAGE).unwrap();
            assert_eq!(value, seed ^ (DATA_BASE + page as u64 * PAGE), "page {page}");
        }
        let mut page = 0;
        while page < 256 {
            let seed = expect[page];
            let len = expect[page..].iter().take_while(|&&s| s == seed).count();
            ok(&mut child, check(page as u64, len as u64, seed));
            page += len;
        }
    }
}

#[test]
fn live_branches_fork_children_of_the_moment() {
    let Some(hv) = common::kvm_or_skip() else { return };
    let mut vm = common::booted(&hv, common::small());
    let dir = tempfile::tempdir().unwrap();
    vm.checkpoint(dir.path(), "base").unwrap().wait().unwrap();
    let mut pool = ShellPool::new(&hv, common::small());
    for i in 0..10u64 {
        ok(&mut vm, fill(i, 1, 100 + i));
        let mut branch = fork_live(&mut vm, dir.path(), &format!("b{i}"), 1, &mut pool).unwrap();
        // The source overwrites right away; the branch keeps the moment it was taken.
        ok(&mut vm, fill(0, 16, 7));
        let mut child = branch.children.pop().unwrap().unwrap();
        for j in 0..=i {
            ok(&mut child, check(j, 1, 100 + j));
        }
        if i > 0 {
            ok(&mut child, check(i + 1, 15 - i, 7));
        }
        for j in 0..=i {
            ok(&mut vm, fill(j, 1, 100 + j));
        }
        assert_eq!(branch.snapshot.chain().layers().len() as u64, i + 2);
        branch.checkpoint.wait().unwrap();
    }
    assert_eq!(Snapshot::list(dir.path()).unwrap().len(), 11);
}

#[test]
fn a_rollback_the_vm_cannot_take_leaves_it_as_it_was() {
    let Some(hv) = common::kvm_or_skip() else { return };
    let mut vm = common::booted(&hv, common::small());
    let dir = tempfile::tempdir().unwrap();
    ok(&mut vm, fill(0, 4, 1));
    vm.checkpoint(dir.path(), "good").unwrap().wait().unwrap();
    // A snapshot KVM refuses: paging on without protected mode.
    let path = dir.path().join("good.state");
    let mut state = format::decode(&path, &std::fs::read(&path).unwrap()).unwrap();
    state.vcpus[0].sregs.cr0 = 0x8000_0000;
    std::fs::write(dir.path().join("bad.state"), format::encode(&state).unwrap()).unwrap();
    let bad = Snapshot::open_named(dir.path(), "bad").unwrap();
    // Another shape entirely.
    let other_dir = tempfile::tempdir().unwrap();
    let mut other = common::booted(&hv, VmConfig { mem_size: 4 << 20, ..common::small() });
    other.snapshot(other_dir.path()).unwrap();
    let other = Snapshot::open(other_dir.path()).unwrap();

    let seq = ok(&mut vm, fill(0, 4, 2));
    assert!(vm.rollback(&other).is_err());
    assert!(vm.rollback(&bad).is_err(), "KVM accepted CR0.PG without CR0.PE");
    let after = ok(&mut vm, check(0, 4, 2));
    assert_eq!(after, seq + 1, "registers changed by a failed rollback");
}
