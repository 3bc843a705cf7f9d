//! The Linux VM runner with tiny hand-written "kernels" (a few instructions in an ELF): entry
//! in 64-bit mode with the zero page in `rsi`, COM1 output in the serial log, and each way a
//! run ends. A few instructions run quickly even where guest kernel code is emulated (PVM).

use branchbox_vmm::linux::{LinuxError, LinuxVm, LinuxVmConfig, RunEnd};
use branchbox_vmm::Hypervisor;
use std::path::Path;

const ENTRY: u64 = 0x100_0000;

/// An x86_64 ELF executable with one PT_LOAD segment holding `code` at [`ENTRY`].
fn tiny_elf(code: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 120];
    f[..4].copy_from_slice(b"\x7fELF");
    f[4..7].copy_from_slice(&[2, 1, 1]); // 64-bit, little-endian, version 1
    f[16..18].copy_from_slice(&2u16.to_le_bytes()); // executable
    f[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86_64
    f[20..24].copy_from_slice(&1u32.to_le_bytes());
    f[24..32].copy_from_slice(&ENTRY.to_le_bytes());
    f[32..40].copy_from_slice(&64u64.to_le_bytes()); // program headers right after
    f[52..54].copy_from_slice(&64u16.to_le_bytes());
    f[54..56].copy_from_slice(&56u16.to_le_bytes());
    f[56..58].copy_from_slice(&1u16.to_le_bytes());
    f[64..68].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    f[72..80].copy_from_slice(&120u64.to_le_bytes()); // file offset of the code
    f[80..88].copy_from_slice(&ENTRY.to_le_bytes());
    f[88..96].copy_from_slice(&ENTRY.to_le_bytes());
    f[96..104].copy_from_slice(&(code.len() as u64).to_le_bytes());
    f[104..112].copy_from_slice(&(code.len() as u64).to_le_bytes());
    f.extend_from_slice(code);
    f
}

/// `mov dx, 0x3f8; mov al, <byte>; out dx, al` for each byte.
fn print(text: &[u8]) -> Vec<u8> {
    let mut code = vec![0x66, 0xba, 0xf8, 0x03];
    for b in text {
        code.extend_from_slice(&[0xb0, *b, 0xee]);
    }
    code
}

/// `mov dx, 0x64; mov al, 0xfe; out dx, al`: the i8042's CPU reset.
const I8042_RESET: [u8; 7] = [0x66, 0xba, 0x64, 0x00, 0xb0, 0xfe, 0xee];

fn config(dir: &Path, code: &[u8], cmdline: &str) -> LinuxVmConfig {
    let kernel = dir.join("vmlinux");
    std::fs::write(&kernel, tiny_elf(code)).unwrap();
    LinuxVmConfig {
        kernel,
        cmdline: cmdline.into(),
        mem_size: 64 << 20,
        vcpus: 1,
        serial_log: dir.join("serial.log"),
        serial_log_cap: 1 << 20,
    }
}

fn boot_and_run(config: LinuxVmConfig) -> (RunEnd, String) {
    let log = config.serial_log.clone();
    let hv = Hypervisor::open().expect("/dev/kvm");
    let mut vm = LinuxVm::new(&hv, config).expect("build the VM");
    vm.boot().expect("boot");
    let end = vm.run().expect("run");
    (end, std::fs::read_to_string(log).unwrap())
}

#[test]
fn entry_sees_the_zero_page_and_prints_on_com1_then_resets() {
    let dir = tempfile::tempdir().unwrap();
    // Print the command line's first byte, found through rsi -> zero page -> cmd_line_ptr.
    let mut code = vec![
        0x8b, 0x86, 0x28, 0x02, 0x00, 0x00, // mov eax, [rsi + 0x228]
        0x8a, 0x00, // mov al, [rax]
        0x66, 0xba, 0xf8, 0x03, // mov dx, 0x3f8
        0xee, // out dx, al
    ];
    code.extend(print(b" booted\n"));
    code.extend(I8042_RESET);
    code.extend([0x0f, 0x0b]); // ud2: a run that missed the reset ends in a triple fault
    let (end, log) = boot_and_run(config(dir.path(), &code, "Zconsole=ttyS0"));
    assert_eq!(end, RunEnd::Reset { vcpu: 0 });
    assert_eq!(log, "Z booted\n");
}

#[test]
fn an_exception_with_no_idt_is_a_triple_fault() {
    let dir = tempfile::tempdir().unwrap();
    let mut code = print(b"before\n");
    code.extend([0x0f, 0x0b]); // ud2: #UD, no IDT entry, #DF, no entry: shutdown
    let (end, log) = boot_and_run(config(dir.path(), &code, "console=ttyS0"));
    assert_eq!(end, RunEnd::TripleFault { vcpu: 0 });
    assert_eq!(log, "before\n");
}

#[test]
fn a_stop_request_ends_a_spinning_guest() {
    let dir = tempfile::tempdir().unwrap();
    let code = [0xeb, 0xfe]; // jmp $
    let hv = Hypervisor::open().expect("/dev/kvm");
    let mut vm = LinuxVm::new(&hv, config(dir.path(), &code, "console=ttyS0")).unwrap();
    vm.boot().unwrap();
    let stop = vm.stop_handle();
    let run = std::thread::spawn(move || vm.run());
    std::thread::sleep(std::time::Duration::from_millis(100));
    stop.stop();
    assert_eq!(run.join().unwrap().unwrap(), RunEnd::Stopped);
}

#[test]
fn the_vmgenid_page_holds_a_fresh_generation_id() {
    use vm_memory::Bytes;
    let dir = tempfile::tempdir().unwrap();
    let hv = Hypervisor::open().expect("/dev/kvm");
    let mut vm = LinuxVm::new(&hv, config(dir.path(), &[0xf4], "console=ttyS0")).unwrap();
    vm.boot().unwrap();
    let addr = vm_memory::GuestAddress(branchbox_arch::layout::VMGENID_ADDR);
    let in_guest: [u8; 16] = vm.memory().read_obj(addr).unwrap();
    assert_eq!(in_guest, vm.generation_id(), "the boot structures left the id in place");
    assert_ne!(in_guest, [0; 16]);
    let other = LinuxVm::new(&hv, config(dir.path(), &[0xf4], "console=ttyS0")).unwrap();
    assert_ne!(other.generation_id(), vm.generation_id(), "each VM is its own generation");
}

#[test]
fn bad_inputs_are_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let hv = Hypervisor::open().expect("/dev/kvm");
    let good = config(dir.path(), &[0xf4], "console=ttyS0");

    let err = LinuxVm::new(&hv, LinuxVmConfig { vcpus: 0, ..good.clone() }).err().unwrap();
    assert!(err.to_string().contains("0 vCPUs"), "{err}");
    let err = LinuxVm::new(&hv, LinuxVmConfig { mem_size: 1 << 20, ..good.clone() }).err().unwrap();
    assert!(err.to_string().contains("1048576 bytes"), "{err}");
    let err = LinuxVm::new(&hv, LinuxVmConfig { cmdline: "x".repeat(4000), ..good.clone() }).err().unwrap();
    assert!(err.to_string().contains("4000 bytes"), "{err}");
    let err = LinuxVm::new(&hv, LinuxVmConfig { serial_log: "/nonexistent/dir/log".into(), ..good.clone() })
        .err()
        .unwrap();
    assert!(matches!(err, LinuxError::File { .. }), "{err}");

    let mut vm =
        LinuxVm::new(&hv, LinuxVmConfig { kernel: dir.path().join("missing"), ..good.clone() }).unwrap();
    let err = vm.boot().unwrap_err();
    assert!(err.to_string().contains("branchbox guest kernel"), "{err}");
    let vm = LinuxVm::new(&hv, good).unwrap();
    assert!(matches!(vm.run(), Err(LinuxError::Config(_))), "running before booting is refused");
}

#[test]
fn the_vsock_host_side_answers_while_the_guest_runs_and_stops_with_it() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let hv = Hypervisor::open().expect("/dev/kvm");
    let mut vm = LinuxVm::new(&hv, config(dir.path(), &[0xeb, 0xfe], "console=ttyS0")).unwrap();
    let socket = dir.path().join("vsock.sock");
    vm.add_vsock(3, &socket).unwrap();
    vm.add_rng().unwrap();
    let boot = vm.boot().unwrap();
    assert_eq!(boot.cmdline, "console=ttyS0", "the devices are in the DSDT, not on the command line");
    let slots: Vec<_> = boot.virtio.iter().map(|d| (d.addr, d.len, d.irq)).collect();
    assert_eq!(slots, vec![(0xd000_0000, 0x1000, 5), (0xd000_1000, 0x1000, 6)], "vsock, then rng");
    let stop = vm.stop_handle();
    let run = std::thread::spawn(move || vm.run());
    // No guest driver: the device cannot reach guest port 1024, and says so (or stays
    // silent until the timeout) instead of answering OK.
    let refused = branchbox_vmm::linux::connect_guest_port(&socket, 1024, Duration::from_millis(500));
    assert!(refused.is_err(), "a CONNECT with no guest driver must not be answered OK");
    stop.stop();
    assert_eq!(run.join().unwrap().unwrap(), RunEnd::Stopped, "the host thread ends with the vCPUs");
}
