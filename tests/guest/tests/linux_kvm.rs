//! End to end on hardware KVM: boot the project's kernel and root disk with virtio-blk,
//! vsock and rng on virtio-mmio, reach the agent (PID 1) over vsock and run Python through
//! it, in process and through the microvm backend (a VMM process per sandbox), also with a
//! network. Where `/dev/kvm` is not hardware virtualization (the PVM hosts we build on), each test
//! prints one skip line and passes: the guest cannot get past its first emulated
//! instruction there (see `linux_boot.rs` for what those hosts do prove).

use branchbox_guest_tests::artifacts::{root_disk, vmlinux};
use branchbox_guest_tests::kvm::{boot_to_agent, hardware_kvm};
use branchbox_guest_tests::microvm::{cached_guest, process_alive};
use branchbox_model::Backend;
use branchbox_protocol::{Command, ExecSpec};
use branchbox_vmm::Hypervisor;
use std::io::Write;
use std::time::Duration;

#[test]
fn boots_to_the_agent_and_runs_python() {
    if let Err(why) = hardware_kvm() {
        // Written past the test harness's capture, so the skip is visible in every run.
        let _ = writeln!(std::io::stderr(), "SKIP linux_kvm: hardware KVM missing: {why}");
        return;
    }
    let kernel = vmlinux().unwrap_or_else(|e| panic!("{e}"));
    let disk = root_disk().unwrap_or_else(|e| panic!("{e}"));
    let work = tempfile::tempdir().unwrap();
    let hv = Hypervisor::open().expect("open /dev/kvm");
    let mut booted = boot_to_agent(&hv, &kernel, &disk, work.path(), "", Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}"));
    let _ = writeln!(std::io::stderr(), "boot to the agent's first answer: {:?}", booted.to_first_answer);

    let python = "import os, platform; print(os.getpid() > 1, 6 * 7, platform.system())";
    let spec = ExecSpec::new(Command::Argv(vec!["python3".into(), "-c".into(), python.into()]));
    let out = booted.agent.exec(spec, None).expect("exec python3 through the agent");
    assert_eq!(out.status.code, Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "True 42 Linux");

    // The rng device feeds the kernel's hw_random core.
    let rng = ExecSpec::new(Command::Shell("cat /sys/devices/virtual/misc/hw_random/rng_current".into()));
    let out = booted.agent.exec(rng, None).expect("read the current hwrng");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("virtio_rng"), "{out:?}");

    let log = booted.serial_log.clone();
    let end = booted.shutdown().expect("stop the guest");
    let serial = std::fs::read_to_string(log).unwrap_or_default();
    assert!(serial.contains("Linux version"), "the console reached our serial log");
    let _ = writeln!(std::io::stderr(), "run ended: {end}");
}

#[test]
fn the_microvm_backend_creates_runs_python_and_destroys() {
    if let Err(why) = hardware_kvm() {
        let _ = writeln!(std::io::stderr(), "SKIP linux_kvm: hardware KVM missing: {why}");
        return;
    }
    let guest = cached_guest().unwrap_or_else(|e| panic!("{e}"));
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("sandbox");
    let plan = guest.plan(&dir, 512).unwrap();
    let backend = guest.backend(Duration::from_secs(60));
    backend.create(&plan).unwrap_or_else(|e| panic!("create: {e}"));
    assert!(backend.is_alive(&dir));

    let mut agent = backend.connect(&dir).expect("connect to the agent");
    let spec = ExecSpec::new(Command::Argv(vec!["python3".into(), "-c".into(), "print(6*7)".into()]));
    let out = agent.exec(spec, None).expect("exec python3 through the agent");
    assert_eq!(out.status.code, Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "42");
    let host = agent.exec(ExecSpec::new(Command::Argv(vec!["hostname".into()])), None).expect("hostname");
    assert_eq!(String::from_utf8_lossy(&host.stdout).trim(), plan.hostname);
    drop(agent);

    backend.pause(&dir).expect("pause");
    assert!(backend.is_alive(&dir), "a paused sandbox is alive");
    backend.resume(&dir).expect("resume");
    let mut agent = backend.connect(&dir).expect("connect after resume");
    let again = ExecSpec::new(Command::Argv(vec!["python3".into(), "-c".into(), "print(6*7)".into()]));
    assert_eq!(String::from_utf8_lossy(&agent.exec(again, None).expect("exec").stdout).trim(), "42");
    drop(agent);

    // Fork: each child is restored from one snapshot, runs the after-fork hook, has its own
    // host name and random bytes, and sees only its own disk writes.
    let mut agent = backend.connect(&dir).expect("connect before the fork");
    let sh = |script: &str| ExecSpec::new(Command::Argv(vec!["sh".into(), "-c".into(), script.into()]));
    agent.exec(sh("echo parent > /root/marker && sync"), None).expect("write the parent's marker");
    drop(agent);
    let children: Vec<_> =
        (0..3).map(|i| guest.plan(&work.path().join(format!("child{i}")), 512).unwrap()).collect();
    let (bytes, results) = backend.fork(&dir, &work.path().join("snap"), &children).expect("fork");
    assert!(bytes > 0);
    let mut seen = std::collections::HashSet::new();
    for (child, result) in children.iter().zip(results) {
        result.unwrap_or_else(|e| panic!("child {}: {e}", child.hostname));
        let mut agent = backend.connect(&child.dir).expect("connect to a child");
        let host = agent.exec(ExecSpec::new(Command::Argv(vec!["hostname".into()])), None).expect("hostname");
        assert_eq!(String::from_utf8_lossy(&host.stdout).trim(), child.hostname);
        let script = format!(
            "cat /root/marker; echo {} > /root/mine; head -c 16 /dev/urandom | od -An -tx1",
            child.hostname
        );
        let out = agent.exec(sh(&script), None).expect("exec in a child");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(text.starts_with("parent"), "the child sees the parent's write: {text}");
        assert!(
            seen.insert(text.lines().skip(1).collect::<String>()),
            "two children drew the same random bytes"
        );
        drop(agent);
    }
    for child in &children {
        let mut agent = backend.connect(&child.dir).expect("connect to a child");
        let out = agent.exec(sh("cat /root/mine"), None).expect("read the child's file");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            child.hostname,
            "a child saw another's write"
        );
        drop(agent);
        backend.destroy(&child.id, &child.dir).expect("destroy a child");
    }

    let pid: i32 = std::fs::read_to_string(dir.join("vmm.pid")).unwrap().trim().parse().unwrap();
    backend.destroy(&plan.id, &dir).expect("destroy");
    assert!(!process_alive(pid), "destroy left the VMM {pid} running");
    assert!(!dir.exists());
    assert!(!backend.is_alive(&dir));
}

/// Runs a Python snippet in a microvm sandbox through its agent; returns what it printed.
fn py(agent: &mut branchbox_model::AgentConn, code: &str) -> String {
    let spec = ExecSpec::new(Command::Argv(vec!["python3".into(), "-c".into(), code.into()]));
    let out = agent.exec(spec, None).expect("exec python3 through the agent");
    assert_eq!(out.status.code, Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Fetches the test server by name and prints the status and the address it came from.
const FETCH: &str = "import socket, urllib.request as u\n\
s = socket.create_connection(('files.example', 8000), timeout=20)\n\
src = s.getsockname()[0]; s.close()\n\
print(u.urlopen('http://files.example:8000/', timeout=20).status, src)";

#[test]
fn a_networked_microvm_sandbox_reaches_the_test_internet_and_its_children_keep_its_address() {
    use branchbox_net::testing::{Dns, Internet, DNS_SERVER, PRIVATE, PUBLIC};
    if let Err(why) = hardware_kvm() {
        let _ = writeln!(std::io::stderr(), "SKIP linux_kvm: hardware KVM missing: {why}");
        return;
    }
    let guest = cached_guest().unwrap_or_else(|e| panic!("{e}"));
    let work = tempfile::tempdir().unwrap();
    let inet = Internet::start(&format!("bbt-kvmnet-{}", std::process::id())).expect("the test internet");
    let dns = Dns::start(&inet.netns, &[("files.example", PUBLIC)]).expect("the test resolver");
    // The backend and the VMMs it starts read these; only this test in the file networks.
    std::env::set_var("BRANCHBOX_NET_UPLINK_NETNS", &inet.netns);
    std::env::set_var("BRANCHBOX_NET_STATE", work.path().join("net"));
    std::env::set_var("BRANCHBOX_NET_POOL", "100.125.0.0/16");
    std::env::set_var("BRANCHBOX_NET_RESOLVERS", DNS_SERVER.to_string());
    let net = branchbox_net::NetConfig::from_env().expect("the test's network configuration");
    let backend = guest.backend(Duration::from_secs(60));
    let dir = work.path().join("sandbox");
    let mut plan = guest.plan(&dir, 512).unwrap();
    plan.network = Some(branchbox_net::Egress::Internet);
    backend.create(&plan).unwrap_or_else(|e| panic!("create: {e}"));

    let mut agent = backend.connect(&dir).expect("connect to the agent");
    assert_eq!(py(&mut agent, FETCH), "200 10.200.0.2", "the sandbox did not fetch with its address");
    assert!(dns.asked().iter().any(|n| n == "files.example"), "the name did not go through the forwarder");
    let refused = format!(
        "import socket\ntry:\n socket.create_connection(('{PRIVATE}', 8000), timeout=20); print('connected')\nexcept Exception as e: print(type(e).__name__)"
    );
    assert_eq!(py(&mut agent, &refused), "ConnectionRefusedError");
    drop(agent);

    let children: Vec<_> = (0..3)
        .map(|i| {
            let mut p = guest.plan(&work.path().join(format!("child{i}")), 512).unwrap();
            p.hostname = format!("bb-net-child-{i}");
            p
        })
        .collect();
    let (_, results) = backend.fork(&dir, &work.path().join("snap"), &children).expect("fork");
    for (child, result) in children.iter().zip(results) {
        result.unwrap_or_else(|e| panic!("child {}: {e}", child.hostname));
        let mut agent = backend.connect(&child.dir).expect("connect to a child");
        assert_eq!(py(&mut agent, FETCH), "200 10.200.0.2", "child {} did not fetch", child.hostname);
        let counted = net.counters(child.id.as_str()).expect("the child's counters");
        assert!(
            counted.allowed_packets >= 1,
            "child {}'s own router counted nothing: {counted:?}",
            child.hostname
        );
    }
    let mut agent = backend.connect(&dir).expect("connect to the source after the fork");
    assert_eq!(py(&mut agent, FETCH), "200 10.200.0.2", "the source lost its network in the fork");
    drop(agent);

    for child in &children {
        backend.destroy(&child.id, &child.dir).expect("destroy a child");
    }
    backend.destroy(&plan.id, &dir).expect("destroy");
    let left = branchbox_net::leftovers();
    for id in children.iter().map(|c| &c.id).chain([&plan.id]) {
        let hex = id.as_str().trim_start_matches("sbx-");
        assert!(!left.iter().any(|l| l == hex), "destroy left the network of {id}");
    }
}
