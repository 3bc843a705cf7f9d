//! A Linux guest's network interface in `branchbox-vmm` processes, as far as hosts without
//! hardware KVM allow: the VMM attaches the guest's virtio-net device to the tap of a sandbox
//! network built for it (`GuestSide::Tap`), serves the sandbox's resolver, gives the kernel
//! its `ip=` address (the kernel prints the command line it got), saves the device in a
//! snapshot, and a restore in another process attaches to its own sandbox's tap and serves
//! that sandbox's resolver. A restore that names no network for a networked snapshot is
//! refused by name. The guest's traffic itself is shown under QEMU (`qemu_net.rs`) and on
//! hardware KVM (`linux_kvm.rs`).

use branchbox_guest_tests::vmm::{start_vmm, VmmGuest};
use branchbox_net::testing::{Dns, Internet, DNS_SERVER, PUBLIC};
use branchbox_net::{Egress, GuestSide, NetConfig, GATEWAY, GUEST_TAP};
use branchbox_virtio::net::GUEST_MAC;
use branchbox_vmm::linux::state::{self, VirtioState, LINUX_STATE_FILE};
use branchbox_vmm::linux::NetAttach;
use branchbox_vmm::process::protocol::{ErrorKind, RestoreLinux};
use std::net::UdpSocket;
use std::path::Path;
use std::time::{Duration, Instant};

/// A safety net, not a measurement.
const SAFETY_NET: Duration = Duration::from_secs(240);

fn read(path: &Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
}

/// `ip -n NS -d link show tap0`.
fn tap_link(id: &str) -> String {
    let ns = format!("bbg-{}", &id[4..]);
    let out =
        std::process::Command::new("ip").args(["-n", &ns, "-d", "link", "show", GUEST_TAP]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Asks sandbox `id`'s resolver (its gateway, in its router namespace) for `name`'s A record;
/// returns the answer's record count, or why there was none.
fn ask_resolver(id: &str, name: &str) -> Result<u16, String> {
    let router = format!("bbr-{}", &id[4..]);
    let mut query = vec![0xbb, 0x01, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.') {
        query.push(label.len() as u8);
        query.extend_from_slice(label.as_bytes());
    }
    query.extend_from_slice(&[0, 0, 1, 0, 1]);
    let answer = branchbox_net::in_netns(&router, move || -> std::io::Result<Vec<u8>> {
        let s = UdpSocket::bind(("0.0.0.0", 0))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.send_to(&query, (GATEWAY, 53))?;
        let mut buf = [0u8; 512];
        let n = s.recv(&mut buf)?;
        Ok(buf[..n].to_vec())
    })
    .map_err(|e| e.to_string())?
    .map_err(|e| format!("no answer from {GATEWAY}:53 in {router}: {e}"))?;
    if answer.len() < 12 || answer[..2] != [0xbb, 0x01] || answer[3] & 0x0f != 0 {
        return Err(format!("a bad or failed answer: {answer:?}"));
    }
    Ok(u16::from_be_bytes([answer[6], answer[7]]))
}

/// A sandbox network made for a VMM, with its policy recorded in `dir`.
fn network(cfg: &NetConfig, id: &str, dir: &Path) -> NetAttach {
    std::fs::create_dir_all(dir).unwrap();
    cfg.setup_for(id, &Egress::Internet, dir, GuestSide::Tap).expect("the sandbox network");
    branchbox_net::record::record(dir, &Egress::Internet).unwrap();
    NetAttach { sandbox: id.into(), tap: GUEST_TAP.into(), policy_dir: dir.into() }
}

#[test]
fn the_vmm_attaches_the_guest_to_its_sandbox_tap_serves_its_resolver_and_a_restore_gets_its_own() {
    let guest = VmmGuest::cached();
    let work = tempfile::tempdir().unwrap();
    let pid = std::process::id();
    let inet = Internet::start(&format!("bbt-vmmnet-{pid}")).expect("the test internet");
    let _dns = Dns::start(&inet.netns, &[("files.example", PUBLIC)]).expect("the test resolver");
    // The VMM processes serve the resolvers with the configuration they inherit.
    std::env::set_var("BRANCHBOX_NET_UPLINK_NETNS", &inet.netns);
    std::env::set_var("BRANCHBOX_NET_STATE", work.path().join("net"));
    std::env::set_var("BRANCHBOX_NET_POOL", "100.124.0.0/16");
    std::env::set_var("BRANCHBOX_NET_RESOLVERS", DNS_SERVER.to_string());
    let cfg = NetConfig::from_env().unwrap();
    let (a, b) = (format!("sbx-{pid:08x}0000000a"), format!("sbx-{pid:08x}0000000b"));
    struct Teardown<'a>(&'a NetConfig, [&'a str; 2]);
    impl Drop for Teardown<'_> {
        fn drop(&mut self) {
            for id in self.1 {
                let _ = self.0.teardown(id);
                branchbox_net::resolver_cgroup::remove(id);
            }
        }
    }
    let _teardown = Teardown(&cfg, [&a, &b]);
    let net_a = network(&cfg, &a, &work.path().join("a"));
    let net_b = network(&cfg, &b, &work.path().join("b"));
    assert!(tap_link(&a).contains("NO-CARRIER"), "tap0 has a carrier before any VMM: {}", tap_link(&a));

    let mut boot = guest.boot_request(work.path(), "source", &branchbox_net::guest_ip_arg());
    boot.net = Some(net_a);
    let mut source = start_vmm();
    source.boot_linux(boot).expect("boot a networked guest");
    let start = Instant::now();
    let log = work.path().join("serial.log");
    while !read(&log).contains("Command line:") {
        assert!(start.elapsed() < SAFETY_NET, "no command line in the serial log:\n{}", read(&log));
        std::thread::sleep(Duration::from_millis(5));
    }
    source.pause().expect("pause");
    let cmdline = read(&log).lines().find(|l| l.contains("Command line:")).unwrap_or_default().to_string();
    assert!(
        cmdline.contains(&branchbox_net::guest_ip_arg()),
        "the kernel did not get its address: {cmdline}"
    );
    assert!(
        !cmdline.contains("virtio_mmio.device="),
        "the DSDT describes the devices, not the command line: {cmdline}"
    );
    assert!(!tap_link(&a).contains("NO-CARRIER"), "the VMM did not attach to tap0: {}", tap_link(&a));
    assert_eq!(ask_resolver(&a, "files.example"), Ok(1), "the source's VMM does not serve its resolver");
    // Its threads run in the resolver's CPU cgroup, where the host has cgroup v1's CPU controller.
    if Path::new("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").is_file() {
        let cg = branchbox_net::resolver_cgroup::dir(&a);
        let tasks = read(&cg.join("tasks"));
        let vmm_threads: Vec<String> = std::fs::read_dir(format!("/proc/{}/task", source.pid()))
            .unwrap()
            .flatten()
            .map(|t| t.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            tasks.lines().any(|t| vmm_threads.iter().any(|v| v == t)),
            "no thread of the VMM is in the resolver's cgroup {}: {tasks:?}",
            cg.display()
        );
    }

    let snap = work.path().join("snap");
    std::fs::create_dir(&snap).unwrap();
    source.snapshot(&snap).expect("snapshot the networked guest");
    let saved = state::read(&snap.join(LINUX_STATE_FILE)).expect("read the state");
    let nets: Vec<_> = saved
        .virtio
        .iter()
        .filter_map(|v| match v {
            VirtioState::Net(n) => Some(n.device.mac),
            _ => None,
        })
        .collect();
    assert_eq!(nets, vec![GUEST_MAC], "the snapshot holds the interface and its MAC");

    let request = |name: &str, net: Option<NetAttach>| RestoreLinux {
        dir: snap.clone(),
        serial_log: work.path().join(format!("{name}.log")),
        vsock_socket: work.path().join(format!("{name}.sock")),
        disk_store: work.path().join(format!("{name}-disk")),
        disk_chain: "root".into(),
        resume: false,
        net,
    };
    let mut refused = start_vmm();
    let e = refused.restore_linux(request("bare", None)).unwrap_err();
    assert_eq!(e.remote().map(|r| r.kind), Some(ErrorKind::Snapshot), "{e}");
    assert!(e.to_string().contains("give its namespace and tap"), "{e}");
    let _ = refused.shutdown();

    assert!(tap_link(&b).contains("NO-CARRIER"));
    let mut restored = start_vmm();
    restored.restore_linux(request("restored", Some(net_b))).expect("restore onto b's tap");
    assert!(!tap_link(&b).contains("NO-CARRIER"), "the restore did not attach to its own tap");
    assert_eq!(ask_resolver(&b, "files.example"), Ok(1), "the restore's VMM does not serve b's resolver");
    assert!(!tap_link(&a).contains("NO-CARRIER"), "the source lost its tap");

    assert!(restored.shutdown().expect("shut down").is_some_and(|s| s.success()));
    assert!(source.shutdown().expect("shut down").is_some_and(|s| s.success()));
    assert!(tap_link(&a).contains("NO-CARRIER"), "tap0 still attached after the VMM ended");
}
