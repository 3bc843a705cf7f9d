//! Networked gVisor sandboxes end to end (root, runsc): the uplinks end in the test's own
//! internet namespace (documentation-range servers), never at the host's real interface.

mod common;

use branchbox_net::testing::{Dns, Internet, DNS_SERVER, METADATA, OTHER_PUBLIC, PORT, PRIVATE, PUBLIC};
use branchbox_net::{Names, NetConfig, Uplink};
use common::{bb_in, eventually, private_dir, Daemon};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The test's data directory, internet and networking settings; kills every sandbox it made
/// when dropped, passed or failed.
struct Net {
    dir: PathBuf,
    inet: Internet,
    state: PathBuf,
    made: Vec<String>,
}

impl Net {
    fn new(name: &str) -> Net {
        let inet = Internet::start(&format!("bbt-{name}-{}", std::process::id())).unwrap();
        let dir = private_dir(name);
        let state = dir.join("netstate");
        Net { dir, inet, state, made: Vec::new() }
    }

    fn bb(&self) -> Command {
        let mut c = bb_in(&self.dir);
        c.env("BRANCHBOX_NO_SERVICE", "1")
            .env("BRANCHBOX_NET_UPLINK_NETNS", &self.inet.netns)
            .env("BRANCHBOX_NET_STATE", &self.state);
        c
    }

    fn ok(&mut self, args: &[&str]) -> String {
        let out = self.bb().args(args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(out.status.success(), "branchbox {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        text
    }

    fn create(&mut self, flags: &[&str]) -> String {
        let mut args = vec!["create", "--backend", "gvisor"];
        args.extend_from_slice(flags);
        let id = self.ok(&args).lines().last().unwrap_or_default().to_string();
        self.made.push(id.clone());
        id
    }

    /// curl inside sandbox `id`: its output (`CODE LOCAL_IP`) and exit status.
    fn fetch(&self, id: &str, addr: impl std::fmt::Display) -> (String, Output) {
        let url = format!("http://{addr}:{PORT}/");
        let out = self
            .bb()
            .args([
                "exec",
                id,
                "--",
                "curl",
                "-s",
                "-m",
                "10",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code} %{local_ip}",
                &url,
            ])
            .output()
            .unwrap();
        (String::from_utf8_lossy(&out.stdout).trim().to_string(), out)
    }

    fn config(&self) -> NetConfig {
        NetConfig {
            uplink: Uplink::Netns(self.inet.netns.clone()),
            state_dir: self.state.clone(),
            ..NetConfig::default()
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        if !self.made.is_empty() {
            let mut c = self.bb();
            let _ = c.arg("kill").args(&self.made).output();
        }
        for id in &self.made {
            let _ = self.config().teardown(id);
        }
    }
}

/// curl's exit status for a refused connection: the policy rejects, it does not drop.
const REFUSED: i32 = 7;

fn nothing_left(net: &Net, ids: &[String]) {
    let links = Command::new("ip").args(["-n", &net.inet.netns, "-o", "link"]).output().unwrap();
    let links = String::from_utf8_lossy(&links.stdout);
    for id in ids {
        let n = Names::of(id).unwrap();
        for ns in [&n.guest_ns, &n.router_ns] {
            assert!(!Path::new("/run/netns").join(ns).exists(), "{ns} is left after kill");
        }
        assert!(!links.contains(&n.uplink_link), "{} is left after kill:\n{links}", n.uplink_link);
    }
    let slots = std::fs::read_dir(net.state.join("slots")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(slots, 0, "uplink slots are left after kill");
}

#[test]
fn a_networked_sandbox_reaches_allowed_hosts_only_and_its_forks_keep_its_address() {
    let mut net = Net::new("net-e2e");
    let a = net.create(&["--network"]);
    let (text, out) = net.fetch(&a, PUBLIC);
    assert!(
        out.status.success(),
        "no answer from the test internet: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text, "200 10.200.0.2");
    for blocked in [PRIVATE, METADATA] {
        let (_, out) = net.fetch(&a, blocked);
        assert_eq!(out.status.code(), Some(REFUSED), "{blocked} was not refused");
    }

    // Another sandbox is not reachable: its uplink address is refused by a's policy.
    let b = net.create(&["--network"]);
    let b_names = Names::of(&b).unwrap();
    let addr = Command::new("ip")
        .args(["-n", &b_names.router_ns, "-4", "-o", "addr", "show", "up0"])
        .output()
        .unwrap();
    let addr = String::from_utf8_lossy(&addr.stdout);
    let b_uplink = addr.split_whitespace().nth(3).and_then(|a| a.split('/').next()).unwrap().to_string();
    let (_, out) = net.fetch(&a, &b_uplink);
    assert_eq!(out.status.code(), Some(REFUSED), "a reached b at {b_uplink}");

    // A deny-all sandbox reaches nothing; an allow-list only its list.
    let d = net.create(&["--deny-all"]);
    assert_eq!(net.fetch(&d, PUBLIC).1.status.code(), Some(REFUSED));
    let l = net.create(&["--allow", "10.9.9.9/32"]);
    assert_eq!(net.fetch(&l, PRIVATE).0, "200 10.200.0.2");
    assert_eq!(net.fetch(&l, PUBLIC).1.status.code(), Some(REFUSED));

    // The policy changes while the sandbox runs, and a fork taken after carries the new one.
    let shown = net.ok(&["egress", &l, "--deny-all", "--json"]);
    let shown: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(shown["policy"]["mode"], "deny_all", "{shown}");
    assert!(shown["allowed_packets"].as_u64().unwrap() >= 1, "{shown}");
    assert_eq!(net.fetch(&l, PRIVATE).1.status.code(), Some(REFUSED), "the change did not apply");
    // The fork is of a sandbox that has made no connection: runsc 20240729 cannot checkpoint
    // one whose connection has only just closed (docs/network.md), and forking `l` right
    // after its fetches failed so in CI.
    let f = net.create(&["--allow", "10.9.9.9/32"]);
    net.ok(&["egress", &f, "--deny-all"]);
    let child: String =
        net.ok(&["fork", &f]).lines().find(|l| l.starts_with("sbx-")).unwrap_or_default().to_string();
    net.made.push(child.clone());
    assert_eq!(net.fetch(&child, PRIVATE).1.status.code(), Some(REFUSED), "the fork has the old policy");
    net.ok(&["egress", &child, "--allow", "10.9.9.9/32"]);
    assert_eq!(net.fetch(&child, PRIVATE).0, "200 10.200.0.2");
    assert_eq!(net.fetch(&f, PRIVATE).1.status.code(), Some(REFUSED), "a child's change reached its source");
    let plain = net.create(&[]);
    let out = net.bb().args(["egress", &plain, "--deny-all"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no network"), "{out:?}");

    // Three children fetch with the source's address, each through its own router. The source
    // has made no connection: `a`'s fetches above closed only seconds ago, and runsc 20240729
    // cannot checkpoint a networked sandbox then (docs/network.md; this fork of `a` failed so
    // once in CI).
    let source = net.create(&["--network"]);
    let children: Vec<String> = net
        .ok(&["fork", &source, "-n", "3"])
        .lines()
        .filter(|l| l.starts_with("sbx-"))
        .map(str::to_string)
        .collect();
    assert_eq!(children.len(), 3, "{children:?}");
    net.made.extend(children.iter().cloned());
    for c in &children {
        let (text, out) = net.fetch(c, PUBLIC);
        assert_eq!(text, "200 10.200.0.2", "child {c}: {}", String::from_utf8_lossy(&out.stderr));
        let counted = net.config().counters(c).unwrap();
        assert!(counted.allowed_packets >= 1, "child {c} has no egress of its own: {counted:?}");
    }

    let all = net.made.clone();
    let mut args = vec!["kill"];
    args.extend(all.iter().map(String::as_str));
    net.ok(&args);
    nothing_left(&net, &all);
    net.made.clear();
}

#[test]
fn gc_removes_the_network_of_a_create_killed_with_sigkill() {
    let mut net = Net::new("net-crash");
    let mut create = net.bb().args(["create", "--backend", "gvisor", "--network"]).spawn().unwrap();
    // Wait until the network exists (its policy record is written right after), then kill.
    let sandboxes = net.dir.join("sandboxes");
    let started = std::time::Instant::now();
    let id = loop {
        let found = std::fs::read_dir(&sandboxes).into_iter().flatten().flatten().find_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            e.path().join("network.json").exists().then_some(name)
        });
        if let Some(id) = found {
            break id;
        }
        assert!(started.elapsed().as_secs() < 60, "the create never set up its network");
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    create.kill().unwrap();
    let _ = create.wait();
    net.made.push(id.clone());
    assert!(Path::new("/run/netns").join(Names::of(&id).unwrap().router_ns).exists());

    net.ok(&["gc"]);
    // Recorded after all when the kill came after the create finished: then kill cleans up.
    if net.bb().args(["exec", &id, "--", "true"]).output().unwrap().status.success() {
        net.ok(&["kill", &id]);
    }
    nothing_left(&net, &[id]);
    net.made.clear();
}

/// Holds a TCP connection to the test server open until /tmp/release appears.
/// Opens a connection to the test's server, says so, and once released asks over it: the
/// answer's first line, `closed`, or the error's name lands in `/tmp/result`.
const HOLDER: &str = r#"
import os, socket, time
s = socket.create_connection(('203.0.113.10', 8000))
open('/tmp/conn-open', 'w').write('1')
while not os.path.exists('/tmp/release'):
    time.sleep(0.05)
try:
    s.settimeout(10)
    s.sendall(b'GET / HTTP/1.0\r\n\r\n')
    line = s.recv(64).split(b'\r\n')[0].decode() or 'closed'
except OSError as e:
    line = type(e).__name__
open('/tmp/result', 'w').write(line)
"#;

/// Waits up to a minute for `path` in sandbox `id`.
fn wait_for_file(net: &Net, id: &str, path: &str) {
    let started = std::time::Instant::now();
    while !net.bb().args(["exec", id, "--", "test", "-e", path]).output().unwrap().status.success() {
        assert!(started.elapsed().as_secs() < 60, "{path} never appeared in {id}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn a_fork_is_refused_while_a_connection_is_open_and_goes_through_once_it_closed() {
    let mut net = Net::new("net-conn");
    let a = net.create(&["--network"]);
    let mut put = net
        .bb()
        .args(["files", "put", &a, "-", "/tmp/holder.py"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut put.stdin.take().unwrap(), HOLDER.as_bytes()).unwrap();
    assert!(put.wait().unwrap().success());
    net.ok(&["spawn", &a, "--", "python3", "/tmp/holder.py"]);
    wait_for_file(&net, &a, "/tmp/conn-open");
    serve(&mut net, &a, 8080);
    let addr = net.ok(&["host", &a, "8080"]);
    assert_eq!(fetch_from_uplink(&net, &format!("http://{addr}/whoami")), a);

    // Open: refused up front, naming the connection, and the source keeps it.
    let out = net.bb().args(["fork", &a]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "forked with an open connection: {text}");
    assert!(
        text.contains("1 open TCP connection") && text.contains("-> 203.0.113.10:8000 (ESTABLISHED)"),
        "the error does not say why: {text}"
    );
    net.ok(&["exec", &a, "--", "touch", "/tmp/release"]);
    wait_for_file(&net, &a, "/tmp/result");
    let kept = net.ok(&["exec", &a, "--", "cat", "/tmp/result"]);
    assert!(kept.starts_with("HTTP/1.0 200"), "the refused fork cost the source its connection: {kept}");

    // Closed by the guest first, so its end lingers in TIME_WAIT (runsc refused to save one
    // before --net-disconnect-ok): the fork goes through at once.
    let close_first = "import socket; socket.create_connection(('203.0.113.10', 8000)).close()";
    net.ok(&["exec", &a, "--", "python3", "-c", close_first]);
    let child = net.ok(&["fork", &a]).lines().find(|l| l.starts_with("sbx-")).unwrap_or_default().to_string();
    net.made.push(child.clone());
    assert_eq!(net.fetch(&a, PUBLIC).0, "200 10.200.0.2", "the source lost its network");
    assert_eq!(net.fetch(&child, PUBLIC).0, "200 10.200.0.2", "the child has no network");
    // The server listening at the fork answers in the child too, at the child's own address
    // (its files are the source's), and still in the source.
    let child_addr = net.ok(&["host", &child, "8080"]);
    assert_ne!(child_addr, addr, "the child shares its source's exposed address");
    assert_eq!(fetch_from_uplink(&net, &format!("http://{child_addr}/whoami")), a);
    assert_eq!(fetch_from_uplink(&net, &format!("http://{addr}/whoami")), a);
}

#[test]
fn a_networked_sandbox_rolls_back_in_place_and_keeps_its_address_policy_and_ports() {
    let mut net = Net::new("net-rollback");
    let a = net.create(&["--network"]);
    net.ok(&["exec", &a, "-s", "--", "echo before > /tmp/state"]);
    serve(&mut net, &a, 8080);
    let addr = net.ok(&["host", &a, "8080"]);
    assert_eq!(fetch_from_uplink(&net, &format!("http://{addr}/whoami")), a);
    let cp = net.ok(&["checkpoint", &a]).lines().last().unwrap_or_default().to_string();
    net.ok(&["exec", &a, "-s", "--", "echo after > /tmp/state; rm -rf /tmp/www"]);
    net.ok(&["rollback", &a, &cp]);
    assert_eq!(net.ok(&["exec", &a, "--", "cat", "/tmp/state"]), "before");
    // The same address from inside, the server of the checkpoint at the same exposed address,
    // and the egress policy still applied.
    assert_eq!(net.fetch(&a, PUBLIC).0, "200 10.200.0.2", "no network after the rollback");
    assert_eq!(fetch_from_uplink(&net, &format!("http://{addr}/whoami")), a);
    assert_eq!(net.fetch(&a, PRIVATE).1.status.code(), Some(REFUSED), "a private address answered");
    // Twice in a row, and the sandbox answers through its agent after each.
    net.ok(&["rollback", &a, &cp]);
    assert_eq!(net.fetch(&a, PUBLIC).0, "200 10.200.0.2", "no network after a second rollback");
    assert!(ended_of(&net, &a).is_none(), "the sandbox ended: {:?}", ended_of(&net, &a));

    // A checkpoint that cannot come up: the old container is gone by then, so the sandbox ends
    // and says why, and the error says so too.
    let bad = net.ok(&["checkpoint", &a]).lines().last().unwrap_or_default().to_string();
    let img = net.dir.join("snapshots").join(&bad).join("checkpoint").join("checkpoint.img");
    std::fs::OpenOptions::new().write(true).open(&img).unwrap().set_len(64).unwrap();
    let out = net.bb().args(["rollback", &a, &bad]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success() && text.contains("the sandbox has ended"), "{text}");
    let ended = ended_of(&net, &a).unwrap_or_default();
    assert!(ended.contains("rollback_failed"), "ended.json: {ended:?}");
}

fn ended_of(net: &Net, id: &str) -> Option<String> {
    std::fs::read_to_string(net.dir.join("sandboxes").join(id).join("ended.json")).ok()
}

#[test]
fn an_allow_list_of_host_names_reaches_what_the_resolver_answered_for_them_only() {
    let mut net = Net::new("net-dns");
    // many.test has 40 addresses: its answer (about 700 bytes) comes truncated over UDP.
    let many: Vec<(&str, std::net::Ipv4Addr)> =
        (0..40).map(|i| ("many.test", std::net::Ipv4Addr::new(203, 0, 113, 100 + i))).collect();
    let mut names = vec![("allowed.test", PUBLIC), ("other.test", OTHER_PUBLIC), ("rebind.test", METADATA)];
    names.extend(many);
    let dns = Dns::start(&net.inet.netns, &names).unwrap();
    let resolvers = DNS_SERVER.to_string();
    let sh = |net: &Net, id: &str, line: &str| {
        net.bb()
            .env("BRANCHBOX_NET_RESOLVERS", &resolvers)
            .args(["exec", id, "-s", "--", line])
            .output()
            .unwrap()
    };
    let create = |net: &mut Net, flags: &[&str]| {
        let mut args = vec!["create", "--backend", "gvisor"];
        args.extend_from_slice(flags);
        let out = net.bb().env("BRANCHBOX_NET_RESOLVERS", &resolvers).args(&args).output().unwrap();
        assert!(out.status.success(), "create {flags:?}: {}", String::from_utf8_lossy(&out.stderr));
        let id = String::from_utf8_lossy(&out.stdout).trim().lines().last().unwrap_or_default().to_string();
        net.made.push(id.clone());
        id
    };
    let curl = format!("curl -s -m 10 -o /dev/null -w '%{{http_code}}' http://allowed.test:{PORT}/");

    // Every networked sandbox's resolver is its gateway, which answers from upstream.
    let open = create(&mut net, &["--network"]);
    let out = sh(&net, &open, "cat /etc/resolv.conf; getent hosts other.test");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("nameserver 10.200.0.1"), "{out:?}");
    // A truncated answer: the guest's resolver asks again over TCP, and so does the forwarder.
    let out = sh(&net, &open, "getent ahostsv4 many.test | awk '{print $1}' | sort -u | wc -l");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "40", "{out:?}");
    assert!(dns.asked_over_tcp().contains(&"many.test".to_string()), "{:?}", dns.asked_over_tcp());
    assert!(text.contains(&OTHER_PUBLIC.to_string()), "{text}");

    let l = create(&mut net, &["--allow", "allowed.test", "--allow", "rebind.test"]);
    let out = sh(&net, &l, &curl);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200", "a listed name: {out:?}");
    // The name's answer opened its address only: another public address stays refused.
    let (_, out) = net.fetch(&l, OTHER_PUBLIC);
    assert_eq!(out.status.code(), Some(REFUSED), "an address no listed name resolved to");
    // A name off the list gets no answer, and never reaches upstream.
    let out = sh(&net, &l, "getent hosts other.test");
    assert!(!out.status.success(), "a name off the list resolved: {out:?}");
    let before = dns.asked().iter().filter(|n| *n == "other.test").count();
    let _ = sh(&net, &l, "getent hosts other.test");
    assert_eq!(
        dns.asked().iter().filter(|n| *n == "other.test").count(),
        before,
        "a refused name went upstream"
    );
    // A listed name that answers a private address (the metadata service) opens nothing.
    let out = sh(&net, &l, &format!("curl -s -m 10 -o /dev/null http://rebind.test:{PORT}/"));
    assert_eq!(out.status.code(), Some(REFUSED), "a listed name opened the metadata address: {out:?}");

    // A change at runtime applies to names at once, and drops what the old list resolved.
    net.ok(&["egress", &l, "--allow", "other.test"]);
    let out = sh(&net, &l, "getent hosts other.test");
    assert!(String::from_utf8_lossy(&out.stdout).contains(&OTHER_PUBLIC.to_string()), "{out:?}");
    let (code, _) = net.fetch(&l, OTHER_PUBLIC);
    assert_eq!(code, "200 10.200.0.2");
    let (_, out) = net.fetch(&l, PUBLIC);
    assert_eq!(out.status.code(), Some(REFUSED), "the old list's address stayed allowed");
    let out = sh(&net, &l, "getent hosts allowed.test");
    assert!(!out.status.success(), "a name of the old list still resolved: {out:?}");

    // deny-all answers no name at all.
    let d = create(&mut net, &["--deny-all"]);
    let asked = dns.asked().len();
    assert!(!sh(&net, &d, "getent hosts allowed.test").status.success());
    assert_eq!(dns.asked().len(), asked, "deny-all asked upstream");
}

#[test]
fn network_flags_are_checked_before_anything_starts() {
    let net = Net::new("net-flags");
    let fails = |args: &[&str]| {
        let out = net.bb().args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // A microvm sandbox takes a network where Linux microVMs run (tests/guest's hardware-KVM
    // test); where they cannot (PVM), the backend is refused before any network is made.
    if std::path::Path::new("/sys/module/kvm_pvm").exists() {
        let e = fails(&["create", "--backend", "microvm", "--network"]);
        assert!(
            e.contains("cannot run Linux sandboxes on this host") && e.contains("--backend gvisor"),
            "{e}"
        );
    }
    let e = fails(&["create", "--backend", "gvisor", "--allow", "10.0.0.1/8"]);
    assert!(e.contains("10.0.0.1/8") && e.contains("10.0.0.0/8"), "{e}");
    let many: Vec<String> = (0..257).map(|i| format!("192.0.2.{}/32", i % 256)).collect();
    let mut args = vec!["create", "--backend", "gvisor"];
    for cidr in &many {
        args.extend(["--allow", cidr.as_str()]);
    }
    let e = fails(&args);
    assert!(e.contains("at most 256") && e.contains("257"), "{e}");
    assert!(!net.state.join("slots").exists(), "a refused create reserved an uplink address");
}

/// Serves `/tmp/www` of sandbox `id` on `port` in the background, with a file naming `id`.
fn serve(net: &mut Net, id: &str, port: u16) {
    net.ok(&["exec", id, "-s", "--", &format!("mkdir -p /tmp/www && echo {id} > /tmp/www/whoami")]);
    let port = port.to_string();
    net.ok(&["spawn", id, "--", "python3", "-m", "http.server", &port, "--directory", "/tmp/www"]);
}

/// curl from the test's internet namespace (the uplinks' far side, where the host would be):
/// the body of `url`, retried while the server starts.
fn fetch_from_uplink(net: &Net, url: &str) -> String {
    let started = std::time::Instant::now();
    loop {
        let out = Command::new("ip")
            .args(["netns", "exec", &net.inet.netns, "curl", "-s", "-f", "-m", "5", url])
            .output()
            .unwrap();
        if out.status.success() {
            return String::from_utf8_lossy(&out.stdout).trim().to_string();
        }
        assert!(started.elapsed().as_secs() < 60, "{url} never answered from the uplink side: {out:?}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// A UDP echo server on port 5353: answers `echo ` and what it got.
const UDP_ECHO: &str = r#"
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(('0.0.0.0', 5353))
while True:
    d, a = s.recvfrom(512)
    s.sendto(b'echo ' + d, a)
"#;

/// Sends `argv[3]` to `argv[1]:argv[2]` over UDP each second until an answer comes (a minute
/// at most, while the server starts), and prints it.
const UDP_CLIENT: &str = r#"
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(1)
for _ in range(60):
    s.sendto(sys.argv[3].encode(), (sys.argv[1], int(sys.argv[2])))
    try:
        print(s.recv(512).decode())
        sys.exit(0)
    except OSError:
        time.sleep(0.2)
sys.exit(1)
"#;

/// One datagram to `ip:port` from the test's internet namespace, and the answer's text.
fn udp_from_uplink(net: &Net, ip: &str, port: u16, text: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", &net.inet.netns, "python3", "-c", UDP_CLIENT, ip, &port.to_string(), text])
        .output()
        .unwrap();
    assert!(out.status.success(), "no UDP answer from {ip}:{port}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn exposed_ports_answer_from_the_uplink_side_only_each_sandbox_at_its_own_address() {
    let mut net = Net::new("net-ports");
    // Inbound connections do not depend on the egress policy: replies are part of their flow.
    let a = net.create(&["--deny-all"]);
    // Forked before it serves, so the child's server is its own (a server listening at the
    // fork is tested in `a_fork_is_refused_while_a_connection_is_open_...`).
    let child: String =
        net.ok(&["fork", &a]).lines().find(|l| l.starts_with("sbx-")).unwrap_or_default().to_string();
    net.made.push(child.clone());
    serve(&mut net, &a, 8080);
    let host: serde_json::Value = serde_json::from_str(&net.ok(&["host", &a, "8080", "--json"])).unwrap();
    let addr = host["address"].as_str().unwrap().to_string();
    assert_eq!(addr, format!("{}:8080", net.config().address(&a).unwrap()), "{host}");
    assert_eq!(fetch_from_uplink(&net, &format!("http://{addr}/whoami")), a);

    // Another sandbox cannot reach it: the uplink pool is refused to every guest.
    let b = net.create(&["--network"]);
    let (_, out) = net.fetch(&b, host["host"].as_str().unwrap());
    assert_eq!(out.status.code(), Some(REFUSED), "b reached a's router at {addr}");
    let url = format!("http://{addr}/whoami");
    let out = net.bb().args(["exec", &b, "--", "curl", "-s", "-m", "5", &url]).output().unwrap();
    assert_eq!(out.status.code(), Some(REFUSED), "b reached a's exposed port: {out:?}");

    // UDP too: an echo server in the sandbox answers a datagram from the uplink side.
    net.ok(&["spawn", &a, "--", "python3", "-c", UDP_ECHO]);
    let ip = addr.split(':').next().unwrap_or_default().to_string();
    assert_eq!(udp_from_uplink(&net, &ip, 5353, "ping"), "echo ping");

    // The child serves at its own address.
    serve(&mut net, &child, 8081);
    let child_addr = net.ok(&["host", &child, "8081"]);
    assert_ne!(child_addr.split(':').next(), addr.split(':').next(), "the child shares its source's address");
    assert_eq!(fetch_from_uplink(&net, &format!("http://{child_addr}/whoami")), child);

    let plain = net.create(&[]);
    let out = net.bb().args(["host", &plain, "8080"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no network"), "{out:?}");
    let out = net.bb().args(["host", &a, "0"]).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("port 0"), "{out:?}");
}

#[test]
fn the_service_creates_networked_sandboxes_and_proxies_their_ports_behind_its_token() {
    let mut net = Net::new("net-service");
    let state = net.state.to_string_lossy().into_owned();
    // The service creates networks and connects to exposed ports from the uplink's far side,
    // as `branchbox host` says: here the test's own namespace.
    let d = Daemon::start(
        &net.dir,
        &[("BRANCHBOX_NET_UPLINK_NETNS", net.inet.netns.as_str()), ("BRANCHBOX_NET_STATE", state.as_str())],
    );
    let json = |(code, body): (u16, String), want: u16| -> serde_json::Value {
        assert_eq!(code, want, "{body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
    };
    let both = r#"{"backend":"gvisor","network":{"mode":"internet"},"allow_internet_access":true}"#;
    let v = json(d.request("POST", "/v1/sandboxes", both, true), 422);
    assert!(v["error"]["message"].as_str().unwrap().contains("not both"), "{v}");
    let v = json(
        d.request("POST", "/v1/sandboxes", r#"{"backend":"gvisor","allow_internet_access":false}"#, true),
        201,
    );
    let a = v["id"].as_str().unwrap().to_string();
    net.made.push(a.clone());
    let v = json(d.get(&format!("/v1/sandboxes/{a}/network"), true), 200);
    assert_eq!(v["policy"], serde_json::json!({"mode": "deny_all"}), "{v}");
    let (_, out) = net.fetch(&a, PUBLIC);
    assert_eq!(out.status.code(), Some(REFUSED), "a deny-all sandbox reached {PUBLIC}: {out:?}");
    let list = r#"{"mode":"allow_list","allow":["203.0.113.0/24"]}"#;
    let v = json(d.request("PUT", &format!("/v1/sandboxes/{a}/network"), list, true), 200);
    assert_eq!(v["policy"]["allow"], serde_json::json!(["203.0.113.0/24"]), "{v}");
    // The policy the service set is the one the sandbox's router enforces.
    let (code, out) = net.fetch(&a, PUBLIC);
    assert!(out.status.success() && code.starts_with("200"), "{code}: {out:?}");

    serve(&mut net, &a, 8080);
    let v = json(d.get(&format!("/v1/sandboxes/{a}/hosts/8080"), true), 200);
    assert_eq!(v["address"], format!("{}:8080", net.config().address(&a).unwrap()), "{v}");
    let path = format!("{}whoami", v["proxy_path"].as_str().unwrap());
    let mut last = (0, String::new());
    eventually("the sandbox's server to answer through the proxy", || {
        last = d.get(&path, true);
        last.0 == 200
    });
    assert_eq!(last.1.trim(), a, "{last:?}");
    let (code, body) = d.get(&path, false);
    assert_eq!(code, 401, "the proxy answered without the token: {body}");
    let v = json(d.get(&format!("/v1/sandboxes/{a}/ports/8099/"), true), 502);
    assert_eq!(v["error"]["code"], "port_unreachable", "{v}");
    let v = json(d.request("POST", "/v1/sandboxes", r#"{"backend":"gvisor"}"#, true), 201);
    let plain = v["id"].as_str().unwrap().to_string();
    net.made.push(plain.clone());
    for path in [format!("/v1/sandboxes/{plain}/ports/8080/"), format!("/v1/sandboxes/{plain}/hosts/8080")] {
        let v = json(d.get(&path, true), 422);
        assert!(v["error"]["message"].as_str().unwrap().contains("has no network"), "{path}: {v}");
    }
}
