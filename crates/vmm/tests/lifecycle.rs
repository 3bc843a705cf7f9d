//! The life of a snapshot directory: removing snapshots, flattening chains, collecting the
//! layers nobody names, and checkpoints that never name a missing layer.

mod common;

use branchbox_vmm::synthetic::testguest::Command;
use branchbox_vmm::{collect_garbage, fork, ShellPool, Snapshot, Vm, VmConfig};
use common::{check, fill, ok, PAGE};
use std::path::Path;
use std::sync::Arc;

fn layers(s: &Snapshot) -> Vec<String> {
    s.chain().layers().iter().map(|l| l.name.clone()).collect()
}

/// A child of snapshot `name` (reopened from disk) passes every check; returns its answer
/// counter after the first.
fn child_sees(hv: &Arc<branchbox_vmm::Hypervisor>, dir: &Path, name: &str, checks: &[Command]) -> u64 {
    let snap = Snapshot::open_named(dir, name).unwrap_or_else(|e| panic!("snapshot {name}: {e}"));
    let mut kid = fork(&snap, 1, &mut ShellPool::new(hv, snap.state().config)).pop().unwrap().unwrap();
    let seq = ok(&mut kid, checks[0]);
    for c in &checks[1..] {
        ok(&mut kid, *c);
    }
    seq
}

fn config() -> VmConfig {
    VmConfig { mem_size: 16 << 20, ..common::small() }
}

/// A VM with checkpoints `a` (base: 64 pages of seed 1), `b` (+ pages 8..16 of seed 2) and
/// `c` (+ pages 16..24 of seed 3) in `d`; returns the VM, `b` and `c`.
fn three_checkpoints(hv: &Arc<branchbox_vmm::Hypervisor>, d: &Path) -> (Vm, Snapshot, Snapshot) {
    let mut vm = common::booted(hv, config());
    ok(&mut vm, fill(0, 64, 1));
    vm.checkpoint(d, "a").unwrap().wait().unwrap();
    ok(&mut vm, fill(8, 8, 2));
    let b = vm.checkpoint(d, "b").unwrap().wait().unwrap();
    ok(&mut vm, fill(16, 8, 3));
    let c = vm.checkpoint(d, "c").unwrap().wait().unwrap();
    (vm, b, c)
}

#[test]
fn removed_snapshots_free_only_the_layers_nobody_else_names() {
    let Some(hv) = common::kvm_or_skip() else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut vm, b, c) = three_checkpoints(&hv, d);
    let (base, d1, d2) = (layers(&c)[0].clone(), layers(&c)[1].clone(), layers(&c)[2].clone());
    assert_eq!(layers(&b), vec![base.clone(), d1.clone()]);
    assert_eq!(collect_garbage(d, false).unwrap(), Default::default(), "every layer is named");

    // b's layers are all named by c too: nothing to free.
    Snapshot::remove(d, "b").unwrap();
    assert_eq!(Snapshot::list(d).unwrap(), vec!["a", "c"]);
    assert!(collect_garbage(d, false).unwrap().layers.is_empty());
    child_sees(&hv, d, "c", &[check(0, 8, 1), check(8, 8, 2), check(16, 8, 3), check(24, 40, 1)]);

    // Without c only a is left, which names the base alone; a dry run removes nothing.
    Snapshot::remove(d, "c").unwrap();
    let dry = collect_garbage(d, true).unwrap();
    let mut both = vec![d1.clone(), d2.clone()];
    both.sort();
    assert_eq!(dry.layers, both);
    assert!(dry.bytes >= 16 * PAGE, "two deltas of 8 pages each: {dry:?}");
    assert!(d.join(&d1).exists() && d.join(&d2).exists(), "a dry run removed a file");
    assert_eq!(collect_garbage(d, false).unwrap(), dry);
    assert!(!d.join(&d1).exists() && !d.join(&d2).exists());
    assert!(d.join(&base).exists());
    child_sees(&hv, d, "a", &[check(0, 64, 1)]);

    // The VM lives on: its chain lost two layers, so its next checkpoint is a new base.
    ok(&mut vm, fill(32, 4, 4));
    let e = vm.checkpoint(d, "e").unwrap().wait().unwrap();
    assert_eq!(layers(&e).len(), 1, "a checkpoint named layers that were collected: {:?}", layers(&e));
    child_sees(&hv, d, "e", &[check(0, 8, 1), check(8, 8, 2), check(16, 8, 3), check(32, 4, 4)]);

    // Leftovers of interrupted writes go; errors on bad input leave everything in place.
    std::fs::write(d.join(".mem-0-0-0.delta.tmp"), b"partial").unwrap();
    assert_eq!(collect_garbage(d, false).unwrap().leftovers, vec![".mem-0-0-0.delta.tmp"]);
    assert!(Snapshot::remove(d, "c").is_err(), "c is already gone");
    assert!(Snapshot::remove(d, "../a").is_err(), "not a snapshot name");
    std::fs::write(d.join("bad.state"), b"not a state file").unwrap();
    std::fs::write(d.join("mem-1-1-1.delta"), b"orphan").unwrap();
    assert!(collect_garbage(d, false).is_err(), "an unreadable state file must stop collection");
    assert!(d.join("mem-1-1-1.delta").exists(), "collection went on past an unreadable state file");
    assert_eq!(Snapshot::list(d).unwrap(), vec!["a", "e"]);
}

#[test]
fn flatten_leaves_one_layer_with_the_same_memory_and_the_vm_checkpoints_on() {
    let Some(hv) = common::kvm_or_skip() else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut vm, _, c) = three_checkpoints(&hv, d);
    assert_eq!(layers(&c).len(), 3);
    let checks = [check(0, 8, 1), check(8, 8, 2), check(16, 8, 3), check(24, 40, 1)];
    let before = child_sees(&hv, d, "c", &checks);

    let flat = c.flatten().unwrap();
    assert_eq!(layers(&flat).len(), 1, "flattened: {:?}", layers(&flat));
    assert_ne!(layers(&flat)[0], layers(&c)[0], "a new base layer");
    flat.verify().unwrap();
    assert_eq!(child_sees(&hv, d, "c", &checks), before, "the same registers (answer counter)");
    // b still names the base and the first delta; only the second delta is garbage.
    assert_eq!(collect_garbage(d, false).unwrap().layers, vec![layers(&c)[2].clone()]);

    // The VM's own chain lost that delta: its next checkpoint starts a new base, and the
    // one after that is a delta again.
    ok(&mut vm, fill(32, 4, 4));
    let e = vm.checkpoint(d, "e").unwrap().wait().unwrap();
    assert_eq!(layers(&e).len(), 1);
    ok(&mut vm, fill(40, 4, 5));
    let f = vm.checkpoint(d, "f").unwrap().wait().unwrap();
    assert_eq!(layers(&f).len(), 2);
    child_sees(&hv, d, "f", &[check(0, 8, 1), check(16, 8, 3), check(32, 4, 4), check(40, 4, 5)]);
    child_sees(&hv, d, "b", &[check(0, 8, 1), check(8, 8, 2), check(16, 48, 1)]);
}

#[test]
fn collection_waits_for_a_checkpoint_being_written() {
    let Some(hv) = common::kvm_or_skip() else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut vm = common::booted(&hv, VmConfig { mem_size: 64 << 20, ..common::small() });
    vm.checkpoint(d, "a").unwrap().wait().unwrap();
    for round in 0..3u64 {
        ok(&mut vm, fill(0, 8192, 10 + round));
        let cp = vm.checkpoint(d, &format!("r{round}")).unwrap();
        // Right away, while the writer still writes 32 MiB: collection must wait for it
        // rather than take its temporary files or its not yet named layer.
        let collected = collect_garbage(d, false).unwrap();
        assert!(collected.leftovers.is_empty() && collected.layers.is_empty(), "{collected:?}");
        let snap = cp.wait().unwrap();
        assert!(Snapshot::list(d).unwrap().contains(&snap.name().to_string()));
        child_sees(&hv, d, snap.name(), &[check(0, 8192, 10 + round)]);
    }
}

#[test]
fn a_checkpoint_after_a_killed_writer_starts_a_new_base() {
    let Some(hv) = common::kvm_or_skip() else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut vm = common::booted(&hv, VmConfig { mem_size: 64 << 20, ..common::small() });
    vm.checkpoint(d, "a").unwrap().wait().unwrap();
    // Kill the writer of a 32 MiB delta as soon as the checkpoint returns; retry in the rare
    // case it finished first.
    let mut killed = false;
    for round in 0..5u64 {
        ok(&mut vm, fill(0, 8192, 20 + round));
        let cp = vm.checkpoint(d, &format!("k{round}")).unwrap();
        let pid = cp.writer_pid().expect("a delta has a writer");
        // SAFETY: signals our own child, not yet reaped (the checkpoint holds it).
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        match cp.wait() {
            Err(e) => {
                assert!(e.to_string().contains("signal 9"), "{e}");
                killed = true;
                break;
            }
            Ok(_) => continue,
        }
    }
    assert!(killed, "the writer finished before SIGKILL five times in a row");
    ok(&mut vm, fill(8192, 4, 30));
    let next = vm.checkpoint(d, "next").unwrap().wait().unwrap();
    assert_eq!(layers(&next).len(), 1, "the checkpoint extended a chain whose newest layer is missing");
    let killed_round = (0..5u64).find(|r| !d.join(format!("k{r}.state")).exists()).expect("a killed round");
    child_sees(&hv, d, "next", &[check(0, 8192, 20 + killed_round), check(8192, 4, 30)]);
    // gc takes what the killed writer left.
    assert!(!collect_garbage(d, false).unwrap().leftovers.is_empty());
}

#[test]
fn a_failed_checkpoint_leaves_its_pages_to_the_next_one() {
    let Some(hv) = common::kvm_or_skip() else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut vm = common::booted(&hv, config());
    ok(&mut vm, fill(0, 64, 1));
    vm.checkpoint(d, "a").unwrap().wait().unwrap();
    // The first delta finds its pages in the mapping (pagemap) and turns the dirty log on;
    // make it fail after that: a directory squats on its state file's temporary name.
    ok(&mut vm, fill(8, 8, 2));
    let squat = d.join(".b.state.tmp");
    std::fs::create_dir(&squat).unwrap();
    assert!(vm.checkpoint(d, "b").is_err(), "the checkpoint could not create its state file");
    std::fs::remove_dir(&squat).unwrap();
    // The log only knows what was written since; the next checkpoint must still hold both.
    ok(&mut vm, fill(32, 4, 3));
    let b = vm.checkpoint(d, "b").unwrap().wait().unwrap();
    assert_eq!(layers(&b).len(), 2, "a delta");
    child_sees(&hv, d, "b", &[check(0, 8, 1), check(8, 8, 2), check(16, 16, 1), check(32, 4, 3)]);
}
