//! Snapshot and restore: state survives exactly, in this process and in a fresh one.

mod common;

use branchbox_vmm::synthetic::testguest::{self, Command, DATA_BASE};
use branchbox_vmm::synthetic::vcpu::RunOutcome;
use branchbox_vmm::{Vm, VmConfig};
use std::time::Duration;

const RESTORE_DIR_ENV: &str = "BRANCHBOX_VMM_TEST_RESTORE_DIR";

fn pattern(seed: u64) -> (Command, Command) {
    let (base, count, stride) = (DATA_BASE, 32, 4096);
    (Command::Fill { base, count, stride, seed }, Command::Check { base, count, stride, seed })
}

#[test]
fn restored_vm_keeps_registers_memory_and_devices() {
    let Some(hv) = common::kvm_or_skip() else {
        return;
    };
    let mut vm = common::booted(&hv, common::small());
    let (fill, check) = pattern(0xabc);
    testguest::call(&mut vm, fill).unwrap();
    let dir = tempfile::tempdir().unwrap();
    vm.snapshot(dir.path()).unwrap();
    // The source keeps running on the new layer after the snapshot.
    assert_eq!(testguest::call(&mut vm, check).unwrap().status, 0);

    let mut child = Vm::restore_from(&hv, dir.path()).unwrap();
    let a = testguest::call(&mut child, check).unwrap();
    assert_eq!(a.status, 0, "memory pattern lost: {a:?}");
    assert_eq!(a.seq, 3, "answer counter (a register) not restored");
    assert_eq!(child.doorbell().unwrap().rings, 3);
}

#[test]
fn vm_with_irqchip_and_pit_round_trips() {
    let Some(hv) = common::kvm_or_skip() else {
        return;
    };
    let config = VmConfig { irqchip: true, vcpus: 2, ..common::small() };
    let mut vm = common::booted(&hv, config);
    let dir = tempfile::tempdir().unwrap();
    vm.snapshot(dir.path()).unwrap();
    let snap = branchbox_vmm::Snapshot::open(dir.path()).unwrap();
    let chips = snap.state().vm.irqchip.as_ref().expect("irqchip state saved");
    assert_eq!(chips.ioapic.chip_id, 2);
    assert!(snap.state().vcpus.iter().all(|v| v.lapic.is_some()));
    let mut child = Vm::restore_from(&hv, dir.path()).unwrap();
    assert_eq!(testguest::call(&mut child, Command::Ping).unwrap().seq, 2);
}

/// Iterations of the long computation: long enough that a pause lands inside it.
const LONG: u64 = 400_000_000;

#[test]
fn snapshot_taken_mid_computation_resumes_in_a_fresh_process() {
    if let Ok(dir) = std::env::var(RESTORE_DIR_ENV) {
        // Second half, in the re-executed test binary: restore and let the guest finish.
        let hv = branchbox_vmm::Hypervisor::open().unwrap();
        let mut vm = Vm::restore_from(&hv, std::path::Path::new(&dir)).unwrap();
        let a = testguest::wait_answer(&mut vm).unwrap();
        println!("RESUMED {} {} {} {}", a.status, a.a, a.b, a.seq);
        return;
    }
    let Some(hv) = common::kvm_or_skip() else {
        return;
    };
    let mut vm = common::booted(&hv, common::small());
    let seed = 99;
    testguest::post(&vm, Command::Count { base: DATA_BASE, iterations: LONG, mask: 4095, seed }).unwrap();
    let pause = vm.pause_handle().unwrap();
    let runner = std::thread::spawn(move || {
        let outcome = vm.run();
        (vm, outcome)
    });
    std::thread::sleep(Duration::from_millis(40));
    pause.request_pause();
    let (mut vm, outcome) = runner.join().unwrap();
    assert_eq!(outcome.unwrap(), RunOutcome::Paused);
    let done = vm.vcpu(0).unwrap().fd().get_regs().unwrap().r11;
    assert!(done > 0 && done < LONG, "pause did not land mid-loop: {done}");

    let dir = tempfile::tempdir().unwrap();
    vm.snapshot(dir.path()).unwrap();
    drop(vm);
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "snapshot_taken_mid_computation_resumes_in_a_fresh_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(RESTORE_DIR_ENV, dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("RESUMED ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("no answer from the fresh process: {stdout}"));
    let words: Vec<u64> = line.split(' ').map(|w| w.parse().unwrap()).collect();
    // status 0: the guest's own sum over memory equals its register sum.
    assert_eq!(words, vec![0, testguest::lcg(seed, LONG), LONG, 2]);
}
