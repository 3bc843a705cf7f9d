//! Boot-protocol test: our VMM enters the project's guest kernel in 64-bit mode and the
//! kernel reports, on our 8250, exactly the command line and e820 map we gave it and the
//! memory zones it built from them.
//!
//! On the PVM hosts we build on (HOST.md) guest kernel code is emulated and the kernel stops
//! at its first unsupported instruction (`xrstor`) some seconds in; everything asserted here
//! is printed before that. On hardware KVM the kernel gets much further; the same lines are
//! printed first and the run is stopped once they are in.

use branchbox_guest_tests::{artifacts, kvm};
use branchbox_vmm::linux::{LinuxVm, LinuxVmConfig, RunEnd};
use branchbox_vmm::Hypervisor;
use std::path::Path;
use std::time::{Duration, Instant};

const CMDLINE: &str = "earlyprintk=serial,ttyS0,115200 console=ttyS0 pci=off";
/// The smallest RAM the layout allows: the kernel initialises a page struct per page in
/// emulated code, so less RAM reaches the end sooner (64 MiB: ~11 s, 256 MiB: ~16 s here).
const MEM: u64 = 64 << 20;
/// A safety net, not a measurement: a kernel that has printed nothing new for this long is
/// stuck, and the run is stopped so the assertions can say what is missing.
const QUIET_LIMIT: Duration = Duration::from_secs(30);

/// The kernel's e820 type names.
fn e820_name(kind: u32) -> &'static str {
    match kind {
        1 => "usable",
        2 => "reserved",
        _ => "unknown",
    }
}

/// Lines of the serial log without the kernel's `[    0.000000] ` time stamps.
fn messages(log: &str) -> Vec<String> {
    log.lines()
        .map(|l| match (l.starts_with('['), l.find("] ")) {
            (true, Some(i)) => l[i + 2..].to_string(),
            _ => l.to_string(),
        })
        .collect()
}

/// The `[mem 0xSTART-0xEND]` range in a kernel message line.
fn mem_range(line: &str) -> Option<(u64, u64)> {
    let inner = line.split("[mem ").nth(1)?.split(']').next()?;
    let (a, b) = inner.split_once('-')?;
    let hex = |x: &str| u64::from_str_radix(x.trim_start_matches("0x"), 16).ok();
    Some((hex(a)?, hex(b)?))
}

/// What the kernel prints, in order, and the moment each first appeared in our log.
const MILESTONES: &[&str] = &[
    "Linux version",
    "Command line:",
    "BIOS-e820:",
    "found SMP MP-table",
    "ACPI: RSDP",
    "Zone ranges:",
    "kvm-clock: Using msrs",
    "x86/fpu:",
];

/// Boots, records when each milestone appeared, and returns the log and how the run ended.
fn boot_and_watch(
    log_path: &Path,
    hardware: bool,
) -> (String, RunEnd, Vec<(&'static str, Duration)>, branchbox_arch::BootInfo) {
    let hv = Hypervisor::open().expect("open /dev/kvm: this test needs KVM (PVM is enough)");
    let config = LinuxVmConfig {
        kernel: artifacts::vmlinux().unwrap_or_else(|e| panic!("{e}")),
        cmdline: CMDLINE.into(),
        mem_size: MEM,
        vcpus: 1,
        serial_log: log_path.to_path_buf(),
        serial_log_cap: 4 << 20,
    };
    let mut vm = LinuxVm::new(&hv, config).expect("build the VM");
    let info = vm.boot().expect("write the boot structures").clone();
    let stop = vm.stop_handle();
    let start = Instant::now();
    let runner = std::thread::spawn(move || vm.run());

    let mut seen: Vec<(&'static str, Duration)> = Vec::new();
    let (mut last_len, mut last_change) = (0, Instant::now());
    while !runner.is_finished() {
        std::thread::sleep(Duration::from_millis(20));
        let log = std::fs::read_to_string(log_path).unwrap_or_default();
        for m in MILESTONES {
            if !seen.iter().any(|(s, _)| s == m) && log.contains(m) {
                seen.push((m, start.elapsed()));
            }
        }
        if log.len() != last_len {
            (last_len, last_change) = (log.len(), Instant::now());
        }
        // On hardware KVM the kernel would boot on: once all milestones and the zones are in,
        // there is nothing more to wait for. Under PVM the run ends by itself at the first
        // instruction the host cannot emulate, which the test wants to see.
        let zones_done = log.contains("Zone ranges:") && log.contains("Early memory node ranges");
        let all_in = zones_done && log.contains("node   0: [mem") && seen.len() == MILESTONES.len();
        if (all_in && hardware) || last_change.elapsed() > QUIET_LIMIT {
            // Give the remaining zone lines a moment to arrive, then stop.
            std::thread::sleep(Duration::from_millis(200));
            stop.stop();
        }
    }
    let end = runner.join().expect("the run thread").expect("the run");
    seen.push(("end of the run", start.elapsed()));
    let log = std::fs::read_to_string(log_path).expect("read the serial log");
    (log, end, seen, info)
}

#[test]
fn kernel_reports_our_command_line_e820_map_and_zones() {
    let dir = tempfile::tempdir().unwrap();
    let hardware = kvm::hardware_kvm().is_ok();
    let (log, end, seen, info) = boot_and_watch(&dir.path().join("serial.log"), hardware);
    eprintln!("run ended: {end}");
    for (m, t) in &seen {
        eprintln!("milestone {m:?} at {:.2} s", t.as_secs_f64());
    }
    let msgs = messages(&log);
    let tail: Vec<_> = msgs.iter().rev().take(15).rev().collect();
    let context = format!("run ended: {end}\nlast lines of the serial log:\n{tail:#?}");

    assert!(msgs.iter().any(|l| l.starts_with("Linux version ")), "no `Linux version` line\n{context}");

    // The command line, exactly.
    assert_eq!(info.cmdline, CMDLINE, "no virtio devices here: the command line is ours alone");
    let cmdlines: Vec<_> = msgs.iter().filter_map(|l| l.strip_prefix("Command line: ")).collect();
    assert_eq!(cmdlines, vec![CMDLINE], "the kernel's command line\n{context}");

    // The e820 map, range by range and type by type, and nothing else.
    let e820: Vec<_> = msgs.iter().filter_map(|l| l.strip_prefix("BIOS-e820: ")).collect();
    let expected: Vec<_> = info
        .e820
        .iter()
        .map(|e| format!("[mem {:#018x}-{:#018x}] {}", e.addr, e.addr + e.size - 1, e820_name(e.kind)))
        .collect();
    assert_eq!(e820, expected, "the kernel's BIOS-provided map\n{context}");

    // Memory zones built from that map: the populated zones (DMA and DMA32, or DMA32 alone in
    // a kernel without ZONE_DMA) run back to back from the first page to our RAM's last byte,
    // and node 0's ranges are our usable ranges (page-aligned, less the first page, which the
    // kernel always keeps for itself).
    let after = |head: &str| -> Vec<&String> {
        msgs.iter().skip_while(|l| !l.starts_with(head)).skip(1).take_while(|l| l.starts_with(' ')).collect()
    };
    let zones = after("Zone ranges:");
    let spans: Vec<(u64, u64)> = zones.iter().filter_map(|l| mem_range(l)).collect();
    let mut expected_start = 0x1000;
    for (start, end) in &spans {
        assert_eq!(*start, expected_start, "zones are contiguous from the first page: {zones:#?}\n{context}");
        expected_start = end + 1;
    }
    assert!(!spans.is_empty(), "no populated zone: {zones:#?}\n{context}");
    assert_eq!(expected_start, MEM, "the last zone ends at our RAM's last byte: {zones:#?}\n{context}");
    let nodes: Vec<String> = after("Early memory node ranges")
        .iter()
        .filter_map(|l| l.trim_start().strip_prefix("node   0: ").map(str::to_string))
        .collect();
    let usable: Vec<String> = info
        .e820
        .iter()
        .filter(|e| e.kind == branchbox_arch::E820_RAM)
        .map(|e| {
            let start = e.addr.max(0x1000).next_multiple_of(0x1000);
            let end = (e.addr + e.size) / 0x1000 * 0x1000 - 1;
            format!("[mem {start:#018x}-{end:#018x}]")
        })
        .collect();
    assert_eq!(nodes, usable, "node 0's memory ranges\n{context}");

    // The MP table and the ACPI tables were found where we put them, and parsed: the MADT's
    // IOAPIC and timer override, KVM's CPUID leaves (kvmclock).
    let mp = msgs.iter().find(|l| l.starts_with("found SMP MP-table at ")).and_then(|l| mem_range(l));
    let mp_addr = branchbox_arch::mptable::MPTABLE_ADDR;
    assert_eq!(mp, Some((mp_addr, mp_addr + 15)), "the MP floating pointer\n{context}");
    let acpi = info.acpi;
    for (sig, addr) in [
        ("RSDP", acpi.rsdp),
        ("XSDT", acpi.xsdt),
        ("FACP", acpi.fadt),
        ("DSDT", acpi.dsdt),
        ("APIC", acpi.madt),
    ] {
        let want = format!("ACPI: {sig} {addr:#018X}").replace("0X", "0x");
        assert!(msgs.iter().any(|l| l.starts_with(&want)), "no `{want}` line\n{context}");
    }
    let has = |prefix: &str| msgs.iter().any(|l| l.starts_with(prefix));
    assert!(has("IOAPIC[0]: apic_id 0, version 17, address 0xfec00000, GSI 0-23"), "{context}");
    assert!(has("ACPI: INT_SRC_OVR (bus 0 bus_irq 0 global_irq 2 "), "{context}");
    assert!(has("Hypervisor detected: KVM") && has("kvm-clock: Using msrs"), "{context}");

    // Under PVM the run ends at the first instruction the host cannot emulate (KVM's
    // emulation failure, after everything above); anything else (a triple fault, a failed
    // entry, a guest that went quiet) is a bug in what we set up.
    if hardware {
        assert_eq!(end, RunEnd::Stopped, "{context}");
    } else {
        assert!(matches!(end, RunEnd::InternalError { suberror: 1, .. }), "the run ended early: {context}");
    }
}
