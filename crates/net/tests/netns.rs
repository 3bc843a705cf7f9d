//! Creates sandbox networks for real (root): namespaces, veths, NAT and nftables, with the
//! uplinks ending in the test's own internet namespace. A plain process in the guest namespace
//! stands in for the guest (the gvisor end-to-end test runs runsc there).

use branchbox_net::testing::{curl_in, Internet, METADATA, OTHER_PUBLIC, PRIVATE, PUBLIC};
use branchbox_net::{AllowList, Egress, GuestSide, NetConfig, Uplink, GUEST_MAC, GUEST_TAP};
use std::path::PathBuf;

/// Tears the sandboxes' networks down when the test ends, passed or failed.
struct Sandboxes<'a> {
    cfg: &'a NetConfig,
    ids: Vec<String>,
}

impl Drop for Sandboxes<'_> {
    fn drop(&mut self) {
        for id in &self.ids {
            let _ = self.cfg.teardown(id);
        }
        let _ = std::fs::remove_dir_all(&self.cfg.state_dir);
    }
}

fn config(inet: &Internet, tag: &str) -> NetConfig {
    NetConfig {
        uplink: Uplink::Netns(inet.netns.clone()),
        pool: "100.127.0.0/16".parse().unwrap(),
        state_dir: PathBuf::from(format!("/tmp/bbnet-test-{tag}-{}", std::process::id())),
        resolvers: Vec::new(),
    }
}

fn id(n: u32) -> String {
    format!("sbx-{:08x}{:08x}", std::process::id(), n)
}

fn guest(id: &str) -> String {
    format!("bbg-{}", &id[4..])
}

/// curl's failure code for a refused connection (a reject, not a silent drop).
const REFUSED: &str = "curl exit 7";

#[test]
fn the_policy_allows_public_refuses_private_and_changes_at_runtime() {
    let inet = Internet::start(&format!("bbt-inet-{}", std::process::id())).unwrap();
    let cfg = config(&inet, "policy");
    let (a, b) = (id(1), id(2));
    let guard = Sandboxes { cfg: &cfg, ids: vec![a.clone(), b.clone()] };
    cfg.setup(&a, &Egress::Internet, &cfg.state_dir).unwrap();
    let b_net = cfg.setup(&b, &Egress::Internet, &cfg.state_dir).unwrap();

    assert_eq!(curl_in(&guest(&a), PUBLIC).unwrap(), "200");
    assert_eq!(curl_in(&guest(&b), OTHER_PUBLIC).unwrap(), "200");
    for blocked in [PRIVATE, METADATA, b_net.egress_addr] {
        let e = curl_in(&guest(&a), blocked).unwrap_err().to_string();
        assert_eq!(e, REFUSED, "{blocked} was not refused at once");
    }
    let counted = cfg.counters(&a).unwrap();
    assert!(counted.allowed_packets >= 1 && counted.denied_packets >= 3, "{counted:?}");

    cfg.set_egress(&a, &Egress::DenyAll).unwrap();
    assert_eq!(curl_in(&guest(&a), PUBLIC).unwrap_err().to_string(), REFUSED);
    assert_eq!(curl_in(&guest(&b), PUBLIC).unwrap(), "200", "b's policy changed with a's");

    let list = AllowList::parse(&["10.9.9.9/32", "203.0.113.0/24"]).unwrap();
    cfg.set_egress(&a, &Egress::AllowList(list)).unwrap();
    assert_eq!(curl_in(&guest(&a), PRIVATE).unwrap(), "200", "a listed private address is allowed");
    assert_eq!(curl_in(&guest(&a), PUBLIC).unwrap(), "200");
    assert_eq!(curl_in(&guest(&a), OTHER_PUBLIC).unwrap_err().to_string(), REFUSED);
    assert_eq!(curl_in(&guest(&a), METADATA).unwrap_err().to_string(), REFUSED);
    drop(guard);
}

#[test]
fn teardown_leaves_no_namespace_link_rule_or_slot_and_can_repeat() {
    let inet = Internet::start(&format!("bbt-inet2-{}", std::process::id())).unwrap();
    let cfg = config(&inet, "teardown");
    let a = id(3);
    let guard = Sandboxes { cfg: &cfg, ids: vec![a.clone()] };
    cfg.setup(&a, &Egress::Internet, &cfg.state_dir).unwrap();
    let hex = &a[4..];
    let link = branchbox_net::Names::of(&a).unwrap().uplink_link;
    let links = |ns: &str| {
        let out = std::process::Command::new("ip").args(["-n", ns, "-o", "link"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(links(&inet.netns).contains(&link));
    assert!(branchbox_net::leftovers().contains(&hex.to_string()));

    cfg.teardown(&a).unwrap();
    assert!(!links(&inet.netns).contains(&link), "the uplink is left:\n{}", links(&inet.netns));
    for ns in [format!("bbg-{hex}"), format!("bbr-{hex}")] {
        assert!(!std::path::Path::new("/run/netns").join(&ns).exists(), "{ns} is left");
    }
    assert!(!branchbox_net::leftovers().contains(&hex.to_string()));
    let slots = std::fs::read_dir(cfg.state_dir.join("slots")).unwrap().count();
    assert_eq!(slots, 0, "a slot is left");
    cfg.teardown(&a).unwrap();

    // Set up again after teardown: every name and address is free again.
    cfg.setup(&a, &Egress::Internet, &cfg.state_dir).unwrap();
    assert_eq!(curl_in(&guest(&a), PUBLIC).unwrap(), "200");
    drop(guard);
    assert!(!branchbox_net::leftovers().contains(&hex.to_string()));
}

#[test]
fn a_tap_guest_namespace_bridges_the_tap_to_the_router_link_and_holds_no_address() {
    let inet = Internet::start(&format!("bbt-inet4-{}", std::process::id())).unwrap();
    let cfg = config(&inet, "tap");
    let a = id(7);
    let guard = Sandboxes { cfg: &cfg, ids: vec![a.clone()] };
    cfg.setup_for(&a, &Egress::Internet, &cfg.state_dir, GuestSide::Tap).unwrap();
    let ip = |args: &[&str]| {
        let out = std::process::Command::new("ip").args(["-n", &guest(&a)]).args(args).output().unwrap();
        assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let tap = ip(&["-d", "-o", "link", "show", GUEST_TAP]);
    assert!(tap.contains("master br0") && tap.contains("tun type tap pi off vnet_hdr off"), "{tap}");
    let eth0 = ip(&["-o", "link", "show", "eth0"]);
    assert!(eth0.contains("master br0"), "{eth0}");
    assert!(
        !eth0.contains(GUEST_MAC),
        "a bridge port with the guest's MAC would keep the guest's frames: {eth0}"
    );
    let addrs = ip(&["-4", "-o", "addr"]);
    assert!(
        addrs.lines().all(|l| l.contains(" lo ")),
        "the namespace holds an address beside loopback: {addrs}"
    );
    assert_eq!(ip(&["-4", "route"]), "", "the guest's routes belong to its kernel");
    // The router side is the runsc one, with its egress policy.
    let router = format!("bbr-{}", &a[4..]);
    let tables = std::process::Command::new("ip")
        .args(["netns", "exec", &router, "nft", "list", "tables"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&tables.stdout).contains("inet branchbox"),
        "the router has no egress policy"
    );
    cfg.teardown(&a).unwrap();
    assert!(!std::path::Path::new("/run/netns").join(guest(&a)).exists(), "the guest namespace is left");
    drop(guard);
}

#[test]
fn a_sweep_removes_networks_whose_sandbox_directory_is_gone_and_nothing_else() {
    let inet = Internet::start(&format!("bbt-inet3-{}", std::process::id())).unwrap();
    let cfg = config(&inet, "sweep");
    let (gone, kept, foreign) = (id(4), id(5), id(6));
    let guard = Sandboxes { cfg: &cfg, ids: vec![gone.clone(), kept.clone(), foreign.clone()] };
    let dirs = PathBuf::from(format!("/tmp/bbnet-sweep-{}", std::process::id()));
    let (gone_dir, kept_dir) = (dirs.join("sandboxes").join(&gone), dirs.join("sandboxes").join(&kept));
    std::fs::create_dir_all(&gone_dir).unwrap();
    std::fs::create_dir_all(&kept_dir).unwrap();
    cfg.setup(&gone, &Egress::Internet, &gone_dir).unwrap();
    cfg.setup(&kept, &Egress::Internet, &kept_dir).unwrap();
    // A network another tool (or an older branchbox) made, with no owner record.
    cfg.setup(&foreign, &Egress::Internet, &kept_dir).unwrap();
    std::fs::remove_file(cfg.state_dir.join("owners").join(&foreign[4..])).unwrap();

    std::fs::remove_dir_all(&gone_dir).unwrap();
    assert_eq!(cfg.sweep(true).unwrap(), vec![gone.clone()], "the dry run");
    assert!(branchbox_net::leftovers().contains(&gone[4..].to_string()), "a dry run removed something");
    assert_eq!(cfg.sweep(false).unwrap(), vec![gone.clone()]);
    let left = branchbox_net::leftovers();
    assert!(!left.contains(&gone[4..].to_string()), "the orphan's namespaces are left");
    assert!(left.contains(&kept[4..].to_string()) && left.contains(&foreign[4..].to_string()), "{left:?}");
    assert_eq!(curl_in(&guest(&kept), PUBLIC).unwrap(), "200", "a live sandbox lost its network");
    assert_eq!(cfg.sweep(false).unwrap(), Vec::<String>::new(), "a second sweep found more");
    drop(guard);
    let _ = std::fs::remove_dir_all(&dirs);
}
