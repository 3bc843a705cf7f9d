//! A real Linux guest's virtio-net driver on our net back end, in a sandbox network built the
//! way the microvm backend builds it (`GuestSide::Tap`): QEMU (software emulation, q35) boots
//! the project's guest kernel with our vhost-user net server attached to the guest namespace's
//! tap, and the guest reaches the test's own internet through the sandbox's router, NAT,
//! egress policy and DNS forwarder. Nothing leaves this machine: the uplink ends in the test's
//! namespace.
//!
//! Needs root (namespaces, a tap), `qemu-system-x86_64`, `nft`, and the built guest kernel and
//! disk; fails, naming what to install, when one is missing.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use branchbox_guest_tests::artifacts::guest_files;
use branchbox_guest_tests::qemu::{agent, one_guest_at_a_time, sh, Devices, Disk, Qemu};
use branchbox_guest_tests::vhost_relay::relay;
use branchbox_net::testing::{Dns, Internet, DNS_SERVER, PRIVATE, PUBLIC};
use branchbox_net::{in_netns, Egress, GuestSide, NetConfig, Uplink, GUEST_TAP};
use branchbox_vhost::{Backend, Counters, VhostServer};
use branchbox_virtio::net::{Net, Tap, GUEST_MAC, RX, TX};

/// Serves our net device, attached to the tap of the guest namespace `guest_ns`, behind the
/// relay at `socket` (`vhost_relay`: it holds back QEMU's early ring enables).
fn serve_net(socket: &Path, guest_ns: &str) -> (Arc<Counters>, std::thread::JoinHandle<()>) {
    let tap =
        in_netns(guest_ns, || Tap::open(GUEST_TAP)).expect("enter the guest namespace").expect("open tap0");
    let server_socket = socket.with_extension("server");
    let mut server = VhostServer::bind(&server_socket).expect("bind the net vhost-user socket");
    let backend = Backend::new(Net::new(Box::new(tap), GUEST_MAC));
    let counters = backend.counters();
    let relay = relay(socket, server_socket);
    let session = std::thread::spawn(move || {
        server.serve(backend).expect("the net session");
        relay.join().expect("the relay thread").expect("the relay");
    });
    (counters, session)
}

/// Runs a Python snippet in the guest and returns what it printed.
fn py(
    guest: &mut branchbox_protocol::client::AgentClient<std::os::unix::net::UnixStream>,
    code: &str,
) -> String {
    sh(guest, &format!("python3 -c \"{code}\"")).trim().to_string()
}

#[test]
fn a_linux_guest_on_our_net_device_reaches_the_internet_through_the_sandbox_router_and_policy() {
    let _one = one_guest_at_a_time();
    let files = guest_files();
    let dir = tempfile::tempdir().expect("tempdir");
    let pid = std::process::id();
    let inet = Internet::start(&format!("bbt-qnet-{pid}")).expect("the test internet");
    let dns = Dns::start(&inet.netns, &[("files.example", PUBLIC)]).expect("the test resolver");
    let cfg = NetConfig {
        uplink: Uplink::Netns(inet.netns.clone()),
        pool: "100.126.0.0/16".parse().unwrap(),
        state_dir: dir.path().join("net-state"),
        resolvers: vec![DNS_SERVER],
    };
    let id = format!("sbx-{pid:08x}0000beef");
    struct Teardown<'a>(&'a NetConfig, &'a str);
    impl Drop for Teardown<'_> {
        fn drop(&mut self) {
            let _ = self.0.teardown(self.1);
        }
    }
    cfg.setup_for(&id, &Egress::Internet, dir.path(), GuestSide::Tap).expect("the sandbox network");
    let _teardown = Teardown(&cfg, &id);
    branchbox_net::dns::start(cfg.clone(), &id, Box::new(|| Some(Egress::Internet)))
        .expect("the DNS forwarder");
    let guest_ns = format!("bbg-{}", &id[4..]);

    let disk = Disk { base: files.rootfs.clone(), overlay: dir.path().join("overlay.img") };
    let devices = Devices::start(dir.path(), &disk);
    let net_socket = dir.path().join("net.sock");
    let (net, net_session) = serve_net(&net_socket, &guest_ns);
    let mut qemu = Qemu::boot_networked(&files, &devices, &net_socket, &dir.path().join("console.log"));
    let (mut guest, up) = agent(&mut qemu, &devices.vsock_host_socket);
    eprintln!("networked boot to the agent's first answer under TCG: {} ms", up.as_millis());

    // The guest has the sandbox's MAC and address, set by its own kernel from the command line.
    assert_eq!(sh(&mut guest, "cat /sys/class/net/eth0/address").trim(), branchbox_net::GUEST_MAC);
    let addr = py(&mut guest, "import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(('203.0.113.10', 9)); print(s.getsockname()[0])");
    assert_eq!(addr, "10.200.0.2");

    // An allowed destination answers; the frames went through our device both ways.
    let status = py(
        &mut guest,
        "import urllib.request as u; print(u.urlopen('http://203.0.113.10:8000/', timeout=30).status)",
    );
    assert_eq!(status, "200");
    assert!(net.chains(TX) > 0 && net.bytes_to_guest(RX) > 0, "the fetch did not pass our net device");
    assert_eq!(net.rejected(TX), 0, "the real driver's frames were refused");

    // A private address is refused at once by the router, not left to time out.
    let private = py(
        &mut guest,
        &format!("import socket,time; s=socket.socket(); s.settimeout(20); t=time.time()\ntry:\n s.connect(('{PRIVATE}', 8000)); print('connected')\nexcept Exception as e: print(type(e).__name__, round(time.time()-t))"),
    );
    assert!(private.starts_with("ConnectionRefusedError"), "a private address was not refused: {private}");
    let counted = cfg.counters(&id).expect("the router's counters");
    assert!(counted.allowed_packets >= 1 && counted.denied_packets >= 1, "{counted:?}");

    // The guest's resolver is its gateway (the kernel's `ip=` name server, written out by the
    // agent), which answers through the sandbox's forwarder and the test resolver.
    assert_eq!(sh(&mut guest, "cat /etc/resolv.conf"), "nameserver 10.200.0.1\n");
    let status = py(
        &mut guest,
        "import urllib.request as u; print(u.urlopen('http://files.example:8000/', timeout=30).status)",
    );
    assert_eq!(status, "200");
    assert!(dns.asked().iter().any(|n| n == "files.example"), "the name did not reach the test resolver");

    // A runtime policy change applies to the running guest.
    cfg.set_egress(&id, &Egress::DenyAll).expect("deny all");
    let denied = py(
        &mut guest,
        &format!("import socket; s=socket.socket(); s.settimeout(20)\ntry:\n s.connect(('{PUBLIC}', 8000)); print('connected')\nexcept Exception as e: print(type(e).__name__)"),
    );
    assert_eq!(denied, "ConnectionRefusedError");

    guest.shutdown(false).expect("power off");
    qemu.wait_exit(Duration::from_secs(60));
    devices.finish();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !net_session.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "the net vhost-user session did not end after QEMU exited"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    net_session.join().expect("the net session ended cleanly");
}
