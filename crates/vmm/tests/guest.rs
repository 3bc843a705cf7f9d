//! The test guest runs in user mode and answers its commands.

mod common;

use branchbox_vmm::synthetic::testguest::{self, Command, DATA_BASE};

#[test]
fn test_guest_answers_ping_fill_check_and_count() {
    let Some(hv) = common::kvm_or_skip() else {
        return;
    };
    let mut vm = common::booted(&hv, common::small());
    let fill = Command::Fill { base: DATA_BASE, count: 64, stride: 4096, seed: 7 };
    assert_eq!(testguest::call(&mut vm, fill).unwrap().status, 0);
    let check = Command::Check { base: DATA_BASE, count: 64, stride: 4096, seed: 7 };
    let a = testguest::call(&mut vm, check).unwrap();
    assert_eq!((a.status, a.seq), (0, 3));
    let wrong = Command::Check { base: DATA_BASE, count: 64, stride: 4096, seed: 8 };
    let a = testguest::call(&mut vm, wrong).unwrap();
    assert_eq!((a.status, a.a), (64, DATA_BASE));
    let count = Command::Count { base: DATA_BASE, iterations: 100_000, mask: 1023, seed: 42 };
    let a = testguest::call(&mut vm, count).unwrap();
    assert_eq!((a.status, a.a, a.b), (0, testguest::lcg(42, 100_000), 100_000));
    assert_eq!(vm.doorbell().unwrap().rings, 5);
    assert_eq!(vm.unclaimed_accesses(), 0);
}

#[test]
fn paused_vm_resumes_where_it_stopped() {
    let Some(hv) = common::kvm_or_skip() else {
        return;
    };
    let mut vm = common::booted(&hv, common::small());
    let iterations = 300_000_000;
    testguest::post(&vm, Command::Count { base: DATA_BASE, iterations, mask: 255, seed: 3 }).unwrap();
    let pause = vm.pause_handle().unwrap();
    let runner = std::thread::spawn(move || {
        let outcome = vm.run();
        (vm, outcome)
    });
    std::thread::sleep(std::time::Duration::from_millis(20));
    pause.request_pause();
    let (mut vm, outcome) = runner.join().unwrap();
    assert_eq!(outcome.unwrap(), branchbox_vmm::synthetic::vcpu::RunOutcome::Paused);
    let a = testguest::wait_answer(&mut vm).unwrap();
    assert_eq!((a.status, a.a, a.b), (0, testguest::lcg(3, iterations), iterations));
}
