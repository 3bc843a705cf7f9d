//! The per-thread seccomp filters, applied for real in child processes: what a thread kind
//! needs still works, and a forbidden call kills the process with SIGSYS before it happens.
//!
//! Each case forks: the child installs a filter (built before the fork, so the child only
//! makes raw system calls and never allocates), reports each step it got through on a pipe,
//! and then makes one forbidden call. The parent reads the steps and how the child ended.

mod common;

use branchbox_vmm::seccomp::{self, Filter, ThreadKind};
use branchbox_vmm::synthetic::testguest::{self, Command, DATA_BASE};
use branchbox_vmm::synthetic::vcpu::RunOutcome;
use std::ffi::CString;

/// Steps a child reported and the signal that ended it (`None`: it exited by itself).
struct Ending {
    steps: Vec<u8>,
    signal: Option<i32>,
    status: i32,
}

/// Forks a child that runs `setup` (before any filter, as a thread's setup does), applies
/// `filter`, runs `body` with the step pipe and what `setup` returned, then `_exit(0)`.
fn in_child(filter: &Filter, setup: impl FnOnce() -> i32, body: impl FnOnce(i32, i32)) -> Ending {
    let mut fds = [0i32; 2];
    // SAFETY: a pipe into a local array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let (rd, wr) = (fds[0], fds[1]);
    // SAFETY: the child only makes raw system calls (no allocation, no locks) and ends with
    // _exit, so the state it shares with the parent's other threads does not matter.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: raw calls on the child's own descriptors.
        unsafe { libc::close(rd) };
        let prepared = setup();
        if filter.apply().is_err() {
            unsafe { libc::_exit(3) };
        }
        step(wr, b'F');
        body(wr, prepared);
        unsafe { libc::_exit(0) };
    }
    // SAFETY: the parent's end of the pipe.
    unsafe { libc::close(wr) };
    let mut steps = Vec::new();
    let mut buf = [0u8; 64];
    loop {
        // SAFETY: reads into a local buffer.
        let n = unsafe { libc::read(rd, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        steps.extend_from_slice(&buf[..n as usize]);
    }
    // SAFETY: closes the parent's end.
    unsafe { libc::close(rd) };
    let mut status = 0;
    // SAFETY: waits for the child just forked.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    let signal = libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status));
    Ending { steps, signal, status }
}

/// No setup.
fn nothing() -> i32 {
    -1
}

/// Reports one step: a write, which every filter allows.
fn step(fd: i32, b: u8) {
    // SAFETY: writes one byte from a local.
    unsafe { libc::write(fd, (&b as *const u8).cast(), 1) };
}

fn killed_by_sigsys(e: &Ending) -> bool {
    e.signal == Some(libc::SIGSYS)
}

// KVM request numbers from linux/kvm.h (type 0xAE).
const KVM_CREATE_VM: u64 = 0xAE01;
const KVM_CREATE_VCPU: u64 = 0xAE41;
const KVM_RUN: u64 = 0xAE80;
const KVM_GET_REGS: u64 = 0x8090_AE81;

#[test]
fn the_vcpu_filter_allows_kvm_vcpu_requests_and_kills_on_socket_exec_and_open() {
    let filter = seccomp::filter(ThreadKind::Vcpu).unwrap();
    let kvm_path = CString::new("/dev/kvm").unwrap();
    // Setup, as a runner does before confining a vCPU thread: a VM and a vCPU, made in the
    // child because KVM refuses a VM's requests from any other process.
    let make_vcpu = || -> i32 {
        // SAFETY: raw KVM calls on descriptors the child owns.
        unsafe {
            let kvm = libc::open(kvm_path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
            let vm = if kvm >= 0 { libc::ioctl(kvm, KVM_CREATE_VM as _, 0) } else { -1 };
            if vm >= 0 {
                libc::ioctl(vm, KVM_CREATE_VCPU as _, 0)
            } else {
                -1
            }
        }
    };
    let with_vcpu = in_child(&filter, make_vcpu, |wr, vcpu| {
        if vcpu >= 0 {
            step(wr, b'V');
            let mut regs = kvm_bindings::kvm_regs::default();
            // SAFETY: KVM_GET_REGS into a kvm_regs.
            if unsafe { libc::ioctl(vcpu, KVM_GET_REGS as _, &mut regs) } == 0 {
                step(wr, b'G');
            }
            // Whatever the guest-less vCPU does (an exit, an entry failure), the call was
            // let through if the process is still here.
            // SAFETY: KVM_RUN on the child's vCPU.
            unsafe { libc::ioctl(vcpu, KVM_RUN as _, 0) };
            step(wr, b'R');
        }
        // SAFETY: a small anonymous read-write mapping, then unmapped.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            // SAFETY: unmaps the mapping just made.
            unsafe { libc::munmap(p, 4096) };
            step(wr, b'M');
        }
        // SAFETY: forbidden: the process dies here.
        unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
        step(wr, b'X');
    });
    if with_vcpu.steps.contains(&b'V') {
        assert_eq!(with_vcpu.steps, b"FVGRM", "allowed calls ran, nothing after the forbidden one");
    } else {
        println!("skipped: KVM requests under the vCPU filter (no usable /dev/kvm)");
        assert_eq!(with_vcpu.steps, b"FM");
    }
    assert!(killed_by_sigsys(&with_vcpu), "socket: status {:#x}", with_vcpu.status);

    let exec = in_child(&filter, nothing, |wr, _| {
        let prog = b"/bin/true\0";
        let argv = [prog.as_ptr() as *const libc::c_char, std::ptr::null()];
        // SAFETY: forbidden: the process dies here instead of running /bin/true.
        unsafe { libc::execve(prog.as_ptr().cast(), argv.as_ptr(), std::ptr::null()) };
        step(wr, b'X');
    });
    assert_eq!(exec.steps, b"F");
    assert!(killed_by_sigsys(&exec), "execve: status {:#x}", exec.status);

    let dir = tempfile::tempdir().unwrap();
    let new_file = dir.path().join("created-by-a-confined-thread");
    let path = CString::new(new_file.to_str().unwrap()).unwrap();
    let open = in_child(&filter, nothing, |wr, _| {
        // SAFETY: forbidden: the process dies before the file exists.
        unsafe { libc::openat(libc::AT_FDCWD, path.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o600) };
        step(wr, b'X');
    });
    assert_eq!(open.steps, b"F");
    assert!(killed_by_sigsys(&open), "openat: status {:#x}", open.status);
    assert!(!new_file.exists(), "the forbidden openat created its file");

    let exec_mapping = in_child(&filter, nothing, |wr, _| {
        // SAFETY: forbidden: executable memory.
        unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_EXEC,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        step(wr, b'X');
    });
    assert_eq!(exec_mapping.steps, b"F");
    assert!(killed_by_sigsys(&exec_mapping), "mmap PROT_EXEC: status {:#x}", exec_mapping.status);
}

#[test]
fn the_vmm_filter_allows_disk_io_epoll_eventfd_and_unix_sockets_and_kills_on_inet_and_open() {
    let filter = seccomp::filter(ThreadKind::Vmm).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let disk = CString::new(dir.path().join("disk").to_str().unwrap()).unwrap();
    // A disk file opened during setup, as a block device's backing file is.
    let open_disk = || -> i32 {
        // SAFETY: opens a file in the test's directory.
        unsafe { libc::open(disk.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC, 0o600) }
    };
    let allowed = in_child(&filter, open_disk, |wr, fd| {
        // SAFETY: raw calls on descriptors the child owns or creates.
        unsafe {
            let data = [7u8; 512];
            let mut back = [0u8; 512];
            if libc::fallocate(fd, 0, 0, 4096) == 0
                && libc::pwrite(fd, data.as_ptr().cast(), 512, 512) == 512
                && libc::fdatasync(fd) == 0
                && libc::pread(fd, back.as_mut_ptr().cast(), 512, 512) == 512
                && back == data
            {
                step(wr, b'D');
            }
            let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            let ev = libc::eventfd(0, libc::EFD_NONBLOCK);
            let mut event = libc::epoll_event { events: libc::EPOLLIN as u32, u64: 7 };
            if ep >= 0 && ev >= 0 && libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, ev, &mut event) == 0 {
                let one = 1u64;
                libc::write(ev, (&one as *const u64).cast(), 8);
                let mut out = [libc::epoll_event { events: 0, u64: 0 }];
                if libc::epoll_wait(ep, out.as_mut_ptr(), 1, 0) == 1 && { out[0].u64 } == 7 {
                    step(wr, b'E');
                }
            }
            let unix = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            if unix >= 0 && libc::ioctl(unix, libc::FIONBIO, &1i32) == 0 {
                step(wr, b'U');
            }
            libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        }
        step(wr, b'X');
    });
    assert_eq!(allowed.steps, b"FDEU");
    assert!(killed_by_sigsys(&allowed), "AF_INET socket: status {:#x}", allowed.status);

    let path = CString::new(dir.path().join("new").to_str().unwrap()).unwrap();
    let open = in_child(&filter, nothing, |wr, _| {
        // SAFETY: forbidden.
        unsafe { libc::openat(libc::AT_FDCWD, path.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o600) };
        step(wr, b'X');
    });
    assert!(killed_by_sigsys(&open), "openat: status {:#x}", open.status);
    assert!(!dir.path().join("new").exists());

    let clone = in_child(&filter, nothing, |wr, _| {
        // SAFETY: forbidden: a confined thread cannot start processes.
        unsafe { libc::fork() };
        step(wr, b'X');
    });
    assert_eq!(clone.steps, b"F");
    assert!(killed_by_sigsys(&clone), "fork: status {:#x}", clone.status);
}

#[test]
fn a_vcpu_thread_serving_devices_may_run_its_vcpu_and_do_disk_io_but_not_open_files() {
    let filter = seccomp::filter(ThreadKind::VcpuDevices).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let disk = CString::new(dir.path().join("disk").to_str().unwrap()).unwrap();
    let kvm_path = CString::new("/dev/kvm").unwrap();
    // Setup: the disk opened as a block device's backing file is, and a vCPU, whose
    // descriptor is the disk's plus one (both made in the child, which owns the VM).
    let setup = || -> i32 {
        // SAFETY: opens a file in the test's directory and makes a VM and a vCPU.
        unsafe {
            let fd = libc::open(disk.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC, 0o600);
            let kvm = libc::open(kvm_path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
            let vm = if kvm >= 0 { libc::ioctl(kvm, KVM_CREATE_VM as _, 0) } else { -1 };
            let vcpu = if vm >= 0 { libc::ioctl(vm, KVM_CREATE_VCPU as _, 0) } else { -1 };
            if vcpu >= 0 {
                libc::dup2(vcpu, 100);
            }
            fd
        }
    };
    let served = in_child(&filter, setup, |wr, fd| {
        // SAFETY: raw calls on descriptors the child owns.
        unsafe {
            let data = [9u8; 512];
            let mut back = [0u8; 512];
            if libc::pwrite(fd, data.as_ptr().cast(), 512, 0) == 512
                && libc::fdatasync(fd) == 0
                && libc::pread(fd, back.as_mut_ptr().cast(), 512, 0) == 512
                && back == data
            {
                step(wr, b'D');
            }
            let mut regs = kvm_bindings::kvm_regs::default();
            if libc::ioctl(100, KVM_GET_REGS as _, &mut regs) == 0 {
                step(wr, b'G');
            }
            let unix = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            if unix >= 0 {
                step(wr, b'U');
            }
            libc::openat(libc::AT_FDCWD, disk.as_ptr(), libc::O_RDONLY);
        }
        step(wr, b'X');
    });
    assert_eq!(served.steps, b"FDGU", "disk I/O, a vCPU request and a Unix socket ran; nothing after openat");
    assert!(killed_by_sigsys(&served), "openat: status {:#x}", served.status);
}

#[test]
fn the_reaper_thread_runs_confined() {
    // Freeing a long run of guest pages starts the reaper thread; it confines itself with
    // the VMM filter before serving.
    let pages = 64usize;
    let layer = tempfile::tempfile().unwrap();
    layer.set_len((pages * 4096) as u64).unwrap();
    let ram = branchbox_vmm::memory::GuestRam::from_layer(&layer, pages * 4096).unwrap();
    for p in 0..pages as u64 {
        ram.write(p * 4096, &[1]).unwrap();
    }
    ram.drop_pages(0, pages as u64).unwrap();
    let mut confined = None;
    for _ in 0..200 {
        for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            // The kernel keeps 15 bytes of a thread name.
            if "branchbox-reaper".starts_with(comm.trim()) && comm.trim().len() >= 14 {
                let status = std::fs::read_to_string(task.path().join("status")).unwrap();
                confined =
                    status.lines().find_map(|l| l.strip_prefix("Seccomp:")).map(|v| v.trim().to_string());
            }
        }
        if confined.as_deref() == Some("2") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(confined.as_deref(), Some("2"), "the reaper thread is in seccomp filter mode");
    let mut b = [0u8; 1];
    ram.read(0, &mut b).unwrap();
    assert_eq!(b[0], 0, "the dropped pages show the layer again");
}

#[test]
fn the_synthetic_guest_runs_and_pauses_on_a_confined_vcpu_thread() {
    let Some(hv) = common::kvm_or_skip() else {
        return;
    };
    // Set up but never run before the filter: the run loop's first entry happens confined.
    let mut vm = branchbox_vmm::Vm::boot(&hv, common::small()).unwrap();
    testguest::install(&mut vm).unwrap();
    let pause = vm.pause_handle().unwrap();
    let iterations = 300_000_000;
    // The whole run loop under the vCPU filter: commands, doorbell exits, and a pause whose
    // signal lands in the confined thread. A call outside the list would kill this process.
    let runner = std::thread::spawn(move || {
        seccomp::apply(ThreadKind::Vcpu).unwrap();
        let pinged = testguest::call(&mut vm, Command::Ping).map(|a| a.seq);
        let fill = Command::Fill { base: DATA_BASE, count: 64, stride: 4096, seed: 7 };
        let filled = testguest::call(&mut vm, fill).map(|a| a.status);
        let check = Command::Check { base: DATA_BASE, count: 64, stride: 4096, seed: 7 };
        let checked = testguest::call(&mut vm, check).map(|a| a.status);
        let long = testguest::post(&vm, Command::Count { base: DATA_BASE, iterations, mask: 255, seed: 3 });
        let paused = long.and_then(|()| vm.run());
        (vm, pinged, filled, checked, paused)
    });
    std::thread::sleep(std::time::Duration::from_millis(20));
    pause.request_pause();
    let (mut vm, pinged, filled, checked, paused) = runner.join().unwrap();
    assert_eq!((pinged.unwrap(), filled.unwrap(), checked.unwrap()), (1, 0, 0));
    assert_eq!(paused.unwrap(), RunOutcome::Paused);
    let a = testguest::wait_answer(&mut vm).unwrap();
    assert_eq!((a.status, a.a, a.b), (0, testguest::lcg(3, iterations), iterations));
}
