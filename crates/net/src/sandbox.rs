//! Creating, changing and removing one sandbox's namespaces, links, addresses and rules.

use crate::exec::{in_netns, run, sysctl_in, NETNS_DIR};
use crate::policy::{self, DEFAULT_POOL, GUEST_SIDE, TABLE, UPLINK_SIDE};
use crate::slots::{self, Slot};
use crate::{Cidr, Egress, Error, Names, Result};
use serde::Deserialize;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The guest's address, the same in every sandbox (forked children keep it).
pub const GUEST_ADDR: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 2);
/// The guest's gateway: the router namespace's end of the guest link.
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 1);
/// The guest link's prefix length.
pub const GUEST_PREFIX: u8 = 30;
/// The guest's MAC address, the same in every sandbox.
pub const GUEST_MAC: &str = "02:62:62:00:00:02";
/// The guest's interface name.
const GUEST_IF: &str = "eth0";
/// The tap a microVM's VMM attaches to in the guest namespace ([`GuestSide::Tap`]).
pub const GUEST_TAP: &str = "tap0";
/// The bridge that joins [`GUEST_TAP`] and the guest link ([`GuestSide::Tap`]).
const GUEST_BRIDGE: &str = "br0";
/// Most upstream resolvers a forwarder is given (it asks them in turn).
const MAX_RESOLVERS: usize = 8;
/// Where slot files live unless `BRANCHBOX_NET_STATE` says otherwise.
const DEFAULT_STATE: &str = "/run/branchbox/net";
/// The host-namespace table that masquerades the pool (the product's host uplink).
const HOST_TABLE: &str = "branchbox-uplink";

/// Where a sandbox's uplink ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Uplink {
    /// The host's own namespace: the host masquerades the pool out of its routes.
    Host,
    /// A named namespace (under /run/netns) that routes the pool itself; tests give their own
    /// "internet" namespace here, so nothing reaches the host's real interface.
    Netns(String),
}

/// What holds the guest's end of the network in its namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestSide {
    /// The runtime takes the interface itself (runsc's `--network=sandbox`): `eth0` gets the
    /// guest's MAC, address and default route, which runsc moves into its own stack.
    Interface,
    /// A VMM serves virtio-net over the tap [`GUEST_TAP`], bridged to `eth0` with no address:
    /// the guest kernel holds the address (from its command line), and frames pass between
    /// it and the router exactly as they do for runsc.
    Tap,
}

/// The guest kernel's `ip=` argument for [`GuestSide::Tap`]: the guest's address, gateway and
/// netmask on `eth0`, set by the kernel before init runs, with no autoconfiguration, and the
/// gateway as its name server (the sandbox's resolver; the kernel lists it in
/// `/proc/net/pnp`, which the agent turns into `/etc/resolv.conf`). A restored or forked guest
/// keeps what it booted with, so every child has the same addresses.
pub fn guest_ip_arg() -> String {
    let mask = Ipv4Addr::from(u32::MAX << (32 - u32::from(GUEST_PREFIX)));
    format!("ip={GUEST_ADDR}::{GATEWAY}:{mask}::{GUEST_IF}:off:{GATEWAY}")
}

/// How sandboxes are networked on this host.
#[derive(Debug, Clone)]
pub struct NetConfig {
    /// Where uplinks end.
    pub uplink: Uplink,
    /// The uplink addresses: one `/31` per sandbox; refused to every guest.
    pub pool: Cidr,
    /// Slot files (`<state>/slots`).
    pub state_dir: PathBuf,
    /// The resolvers each sandbox's DNS forwarder asks (from the host, or from inside the
    /// uplink namespace); empty: the host's own, from `/etc/resolv.conf`.
    pub resolvers: Vec<Ipv4Addr>,
}

/// What a networked sandbox's runtime needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attached {
    /// The guest namespace's path (the OCI bundle's network namespace).
    pub guest_ns_path: PathBuf,
    /// The router's uplink address: what the sandbox's traffic comes from, seen upstream.
    pub egress_addr: Ipv4Addr,
}

/// Packets and bytes the egress policy let through and refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Packets of new flows allowed.
    pub allowed_packets: u64,
    /// Packets refused.
    pub denied_packets: u64,
}

fn valid_ns_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "{name:?} is not a network namespace name (letters, digits, '-', '_', '.', at most 64)"
        )))
    }
}

impl Default for NetConfig {
    /// The host uplink, the default pool and state directory, no resolvers.
    fn default() -> NetConfig {
        NetConfig {
            uplink: Uplink::Host,
            pool: DEFAULT_POOL,
            state_dir: PathBuf::from(DEFAULT_STATE),
            resolvers: Vec::new(),
        }
    }
}

impl NetConfig {
    /// The configuration from the environment: `BRANCHBOX_NET_UPLINK_NETNS` (a namespace to
    /// end uplinks in; unset: the host), `BRANCHBOX_NET_POOL` (a CIDR of at most /30),
    /// `BRANCHBOX_NET_STATE` (default /run/branchbox/net), `BRANCHBOX_NET_RESOLVERS`
    /// (comma-separated IPv4 addresses).
    pub fn from_env() -> Result<NetConfig> {
        let uplink = match std::env::var("BRANCHBOX_NET_UPLINK_NETNS") {
            Ok(ns) if !ns.is_empty() => {
                valid_ns_name(&ns)?;
                Uplink::Netns(ns)
            }
            _ => Uplink::Host,
        };
        let pool = match std::env::var("BRANCHBOX_NET_POOL") {
            Ok(p) if !p.is_empty() => p.parse::<Cidr>()?,
            _ => DEFAULT_POOL,
        };
        if pool.prefix_len() > 30 {
            return Err(Error::Invalid(format!(
                "BRANCHBOX_NET_POOL {pool} holds no two /31s; give a /30 or larger"
            )));
        }
        let state_dir = std::env::var_os("BRANCHBOX_NET_STATE")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE));
        let mut resolvers = Vec::new();
        if let Ok(list) = std::env::var("BRANCHBOX_NET_RESOLVERS") {
            let items: Vec<&str> = list.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
            if items.len() > MAX_RESOLVERS {
                return Err(Error::Invalid(format!(
                    "BRANCHBOX_NET_RESOLVERS names {} resolvers; at most {MAX_RESOLVERS} are used",
                    items.len()
                )));
            }
            for item in items {
                resolvers.push(item.parse::<Ipv4Addr>().map_err(|_| {
                    Error::Invalid(format!("BRANCHBOX_NET_RESOLVERS: {item:?} is not an IPv4 address"))
                })?);
            }
        }
        Ok(NetConfig { uplink, pool, state_dir, resolvers })
    }

    /// The uplink namespace's name, or `None` for the host's: where exposed ports are
    /// reached from and the DNS forwarders' upstream sockets are opened.
    pub fn uplink_ns(&self) -> Option<&str> {
        match &self.uplink {
            Uplink::Host => None,
            Uplink::Netns(ns) => Some(ns),
        }
    }

    /// Creates sandbox `id`'s namespaces, links, addresses, routes, NAT and `egress` policy,
    /// recording `owner` (the sandbox's directory) as the one that holds them, for
    /// [`NetConfig::sweep`]. On failure everything created is removed again. The guest
    /// namespace is made for a runtime that takes its interface ([`GuestSide::Interface`]).
    pub fn setup(&self, id: &str, egress: &Egress, owner: &Path) -> Result<Attached> {
        self.setup_for(id, egress, owner, GuestSide::Interface)
    }

    /// [`NetConfig::setup`] with the guest namespace made for `side`.
    pub fn setup_for(&self, id: &str, egress: &Egress, owner: &Path, side: GuestSide) -> Result<Attached> {
        let names = Names::of(id)?;
        if let Some(ns) = self.uplink_ns() {
            valid_ns_name(ns)?;
            if !std::path::Path::new(NETNS_DIR).join(ns).exists() {
                return Err(Error::Invalid(format!(
                    "the uplink namespace {ns:?} does not exist; create it (`ip netns add {ns}`) or unset BRANCHBOX_NET_UPLINK_NETNS"
                )));
            }
        }
        // A crash may have left a half of this id behind.
        self.teardown(id)?;
        let slot = slots::reserve(&self.state_dir, self.pool, id)?;
        let built = self.record_owner(&names, owner).and_then(|()| self.build(&names, slot, egress, side));
        match built {
            Ok(()) => Ok(Attached { guest_ns_path: names.guest_ns_path(), egress_addr: slot.router }),
            Err(e) => {
                let _ = self.teardown(id);
                Err(e)
            }
        }
    }

    fn build(&self, n: &Names, slot: Slot, egress: &Egress, side: GuestSide) -> Result<()> {
        let uplink_netns = match self.uplink_ns() {
            Some(ns) => format!(" netns {ns}"),
            None => String::new(),
        };
        let root = format!(
            "netns add {g}\nnetns add {r}\nlink add {GUEST_IF} netns {g} type veth peer name {GUEST_SIDE} netns {r}\nlink add {UPLINK_SIDE} netns {r} type veth peer name {u}{uplink_netns}\n",
            g = n.guest_ns,
            r = n.router_ns,
            u = n.uplink_link,
        );
        run("ip", &["-batch", "-"], &root, None, "create the sandbox's namespaces and links")?;
        let guest = match side {
            GuestSide::Interface => format!(
                "link set lo up\nlink set {GUEST_IF} address {GUEST_MAC}\naddr add {GUEST_ADDR}/{GUEST_PREFIX} dev {GUEST_IF}\nlink set {GUEST_IF} up\nroute add default via {GATEWAY}\n"
            ),
            // eth0 keeps its own MAC: a bridge port with the guest's MAC would take the
            // guest's frames for itself instead of passing them to the tap.
            GuestSide::Tap => format!(
                "link set lo up\ntuntap add {GUEST_TAP} mode tap\nlink add {GUEST_BRIDGE} type bridge\nlink set {GUEST_IF} master {GUEST_BRIDGE}\nlink set {GUEST_TAP} master {GUEST_BRIDGE}\nlink set {GUEST_IF} up\nlink set {GUEST_TAP} up\nlink set {GUEST_BRIDGE} up\n"
            ),
        };
        run("ip", &["-n", &n.guest_ns, "-batch", "-"], &guest, None, "address the guest's interface")?;
        let router = format!(
            "link set lo up\naddr add {GATEWAY}/{GUEST_PREFIX} dev {GUEST_SIDE}\nlink set {GUEST_SIDE} up\naddr add {r}/31 dev {UPLINK_SIDE}\nlink set {UPLINK_SIDE} up\nroute add default via {u}\n",
            r = slot.router,
            u = slot.uplink,
        );
        run("ip", &["-n", &n.router_ns, "-batch", "-"], &router, None, "address the router's links")?;
        let far = format!("addr add {}/31 dev {u}\nlink set {u} up\n", slot.uplink, u = n.uplink_link);
        match self.uplink_ns() {
            Some(ns) => run("ip", &["-n", ns, "-batch", "-"], &far, None, "address the uplink")?,
            None => run("ip", &["-batch", "-"], &far, None, "address the uplink")?,
        };
        sysctl_in(&n.router_ns, "/proc/sys/net/ipv4/ip_forward", "1")?;
        let table = policy::router_table(egress, self.pool, GATEWAY, GUEST_ADDR);
        run("nft", &["-f", "-"], &table, Some(&n.router_ns), "load the sandbox's egress policy")?;
        self.ports(slot.router, false)?;
        if self.uplink == Uplink::Host {
            self.host_uplink()?;
        }
        Ok(())
    }

    /// The host's side of the product uplink: masquerade the pool out of every other
    /// interface, refuse traffic between two sandbox uplinks and from them into the host, and
    /// let no other machine open a connection into an uplink (the host's own connections to a
    /// sandbox's exposed ports do not pass the forward hook).
    /// Created once (the table is replaced whole, so repeating it is harmless).
    fn host_uplink(&self) -> Result<()> {
        let table = format!(
            "table ip {HOST_TABLE} {{}}\ndelete table ip {HOST_TABLE}\ntable ip {HOST_TABLE} {{
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr {pool} oifname != \"bbx*\" masquerade
  }}
  chain forward {{
    type filter hook forward priority filter; policy accept;
    iifname \"bbx*\" oifname \"bbx*\" drop
    oifname \"bbx*\" ct state new drop
  }}
  chain input {{
    type filter hook input priority filter; policy accept;
    iifname \"bbx*\" ct state established,related accept
    iifname \"bbx*\" drop
  }}
}}
",
            pool = self.pool
        );
        run("nft", &["-f", "-"], &table, None, "load the host's uplink NAT")?;
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")
            .map_err(|e| Error::Io { path: PathBuf::from("/proc/sys/net/ipv4/ip_forward"), source: e })
    }

    /// Runs `text` through `nft` on the uplink's far side (the host, or the uplink namespace).
    fn uplink_nft(&self, text: &str, what: &str) -> Result<String> {
        match self.uplink_ns() {
            Some(ns) => run("nft", &["-f", "-"], text, Some(ns), what),
            None => run("nft", &["-f", "-"], text, None, what),
        }
    }

    /// Lets every local user reach `router`'s ports (`open`), or only root and this process's
    /// user, the service's (`crate::ports`).
    fn ports(&self, router: Ipv4Addr, open: bool) -> Result<()> {
        // SAFETY: geteuid(2) cannot fail.
        let me = unsafe { libc::geteuid() };
        let text = crate::ports::rules(self.pool, &[0, me], router, open);
        self.uplink_nft(&text, "limit who reaches the sandbox's ports").map(drop)
    }

    /// Opens sandbox `id`'s exposed ports to every local user of the host (`open`), or closes
    /// them again to all but root and the service's user, the default of every new network.
    /// The service's token-protected proxy reaches them either way.
    pub fn open_ports(&self, id: &str, open: bool) -> Result<()> {
        let router = self.address(id)?;
        self.ports(router, open)
    }

    /// Gives sandbox `id`'s guest interface its address and default route again. runsc takes
    /// them off the interface when it starts on it (so the host's stack stays out of the
    /// guest's traffic), and a rollback restores a new runsc into the same namespace once the
    /// old one is gone.
    pub fn readdress_guest(&self, id: &str) -> Result<()> {
        let n = Names::of(id)?;
        let guest = format!(
            "link set {GUEST_IF} up\naddr replace {GUEST_ADDR}/{GUEST_PREFIX} dev {GUEST_IF}\nroute replace default via {GATEWAY}\n"
        );
        run("ip", &["-n", &n.guest_ns, "-batch", "-"], &guest, None, "address the guest's interface again")
            .map(drop)
    }

    /// Replaces sandbox `id`'s egress policy in one nftables transaction.
    pub fn set_egress(&self, id: &str, egress: &Egress) -> Result<()> {
        let n = Names::of(id)?;
        let change = policy::change(egress, self.pool);
        run("nft", &["-f", "-"], &change, Some(&n.router_ns), "change the sandbox's egress policy").map(drop)
    }

    /// Lets sandbox `id` reach each address of `batch` for its number of seconds: what its
    /// forwarder resolved for host names of its allow-list (`learned`), in one `nft`.
    pub fn allow_resolved(&self, id: &str, batch: &[(Ipv4Addr, u32)]) -> Result<()> {
        let n = Names::of(id)?;
        if batch.is_empty() {
            return Ok(());
        }
        let add = policy::resolved(batch);
        run("nft", &["-f", "-"], &add, Some(&n.router_ns), "allow a resolved address").map(drop)
    }

    /// The resolvers a forwarder asks: [`NetConfig::resolvers`], else the IPv4 name servers of
    /// the host's `/etc/resolv.conf` (at most [`MAX_RESOLVERS`]). Asked from the host's own
    /// namespace, a host resolver on loopback (`127.0.0.53`) works.
    pub fn upstreams(&self) -> Vec<Ipv4Addr> {
        if !self.resolvers.is_empty() {
            return self.resolvers.clone();
        }
        let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
        name_servers(&text)
    }

    /// The address at which sandbox `id`'s TCP servers are reached from the uplink's far side
    /// (the host, or the named uplink namespace): its router's uplink address, which passes
    /// every TCP port on to the guest.
    pub fn address(&self, id: &str) -> Result<Ipv4Addr> {
        Names::of(id)?;
        slots::find(&self.state_dir, self.pool, id).map(|s| s.router).ok_or_else(|| {
            Error::Invalid(format!(
                "sandbox {id} holds no uplink address in {}; is it networked, and is BRANCHBOX_NET_STATE the one it was created with?",
                self.state_dir.display()
            ))
        })
    }

    /// A TCP connection to `port` of sandbox `id`, opened from the uplink's far side (the
    /// host, or inside the named uplink namespace), where its router passes the port on to the
    /// guest. The outer error is about the sandbox's network (no uplink address); the inner
    /// one is the connection's own (refused: nothing listens there; timed out).
    pub fn connect(&self, id: &str, port: u16, timeout: Duration) -> Result<std::io::Result<TcpStream>> {
        let to = SocketAddr::from((self.address(id)?, port));
        match &self.uplink {
            Uplink::Host => Ok(TcpStream::connect_timeout(&to, timeout)),
            Uplink::Netns(ns) => in_netns(ns, move || TcpStream::connect_timeout(&to, timeout)),
        }
    }

    /// Sandbox `id`'s egress counters.
    pub fn counters(&self, id: &str) -> Result<Counters> {
        let n = Names::of(id)?;
        let json = run(
            "nft",
            &["-j", "list", "counters", "table", "inet", TABLE],
            "",
            Some(&n.router_ns),
            "read the sandbox's counters",
        )?;
        parse_counters(&json)
    }

    /// Removes everything of sandbox `id`: its links (at once, so their names and addresses are
    /// free on return), both namespaces (their rules go with them) and its uplink slot.
    /// Idempotent: nothing left is success.
    pub fn teardown(&self, id: &str) -> Result<()> {
        let n = Names::of(id)?;
        let router = std::path::Path::new(NETNS_DIR).join(&n.router_ns);
        if router.exists() {
            // Deleting one end of a veth deletes both, synchronously; the namespace's own
            // interfaces would only go when the kernel gets to the namespace's cleanup. The
            // uplink's far end is never deleted by name: it cannot outlive this namespace,
            // and its name, a hash of the id, is not proof that it is ours.
            let links = format!("link del {UPLINK_SIDE}\nlink del {GUEST_SIDE}\n");
            let _ =
                run("ip", &["-force", "-n", &n.router_ns, "-batch", "-"], &links, None, "remove the links");
        }
        for ns in [&n.guest_ns, &n.router_ns] {
            if std::path::Path::new(NETNS_DIR).join(ns).exists() {
                run("ip", &["netns", "del", ns], "", None, "remove the sandbox's namespace")?;
            }
        }
        if let Some(slot) = slots::find(&self.state_dir, self.pool, id) {
            // Best effort: the table is missing when no network was ever set up here, and the
            // next sandbox of this slot resets its element anyway.
            let _ = self.uplink_nft(&crate::ports::forget(slot.router), "forget the sandbox's open ports");
        }
        slots::release(&self.state_dir, id)?;
        match std::fs::remove_file(self.owner_file(&n)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::Io { path: self.owner_file(&n), source: e })
            }
            _ => Ok(()),
        }
    }

    /// Where sandbox `n`'s owner record lives: `<state>/owners/<16 hex>`.
    fn owner_file(&self, n: &Names) -> PathBuf {
        self.state_dir.join("owners").join(&n.guest_ns[4..])
    }

    fn record_owner(&self, n: &Names, owner: &Path) -> Result<()> {
        let path = self.owner_file(n);
        let dir = self.state_dir.join("owners");
        std::fs::create_dir_all(&dir).map_err(|e| Error::Io { path: dir, source: e })?;
        let owner =
            std::path::absolute(owner).map_err(|e| Error::Io { path: owner.to_path_buf(), source: e })?;
        std::fs::write(&path, owner.as_os_str().as_bytes()).map_err(|e| Error::Io { path, source: e })
    }

    /// Tears down the networks on this host whose owner (the sandbox directory recorded at
    /// [`NetConfig::setup`]) is gone: what a data directory deleted under running sandboxes,
    /// or a teardown that failed, leaves. Networks whose owner still exists are their store's
    /// to clean (its `gc`), and those with no owner record are never touched: nothing proves
    /// whose they are. With `dry_run`, only lists them. Returns their sandbox ids.
    pub fn sweep(&self, dry_run: bool) -> Result<Vec<String>> {
        let mut swept = Vec::new();
        for hex in leftovers() {
            let id = format!("sbx-{hex}");
            let n = Names::of(&id)?;
            let Ok(owner) = std::fs::read(self.owner_file(&n)) else { continue };
            let owner = PathBuf::from(std::ffi::OsString::from_vec(owner));
            if owner.as_os_str().is_empty() || owner.exists() {
                continue;
            }
            if !dry_run {
                self.teardown(&id)?;
            }
            swept.push(id);
        }
        Ok(swept)
    }
}

/// The IPv4 `nameserver` lines of a resolv.conf text, at most [`MAX_RESOLVERS`].
fn name_servers(text: &str) -> Vec<Ipv4Addr> {
    text.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next()? == "nameserver").then_some(())?;
            words.next()?.parse::<Ipv4Addr>().ok()
        })
        .take(MAX_RESOLVERS)
        .collect()
}

#[derive(Deserialize)]
struct NftList {
    nftables: Vec<serde_json::Value>,
}

fn parse_counters(json: &str) -> Result<Counters> {
    let list: NftList = serde_json::from_str(json)
        .map_err(|e| Error::Command(format!("nft printed counters this version does not read: {e}")))?;
    let mut c = Counters::default();
    for item in &list.nftables {
        let Some(counter) = item.get("counter") else { continue };
        let packets = counter.get("packets").and_then(|p| p.as_u64()).unwrap_or(0);
        match counter.get("name").and_then(|n| n.as_str()) {
            Some("allowed") => c.allowed_packets = packets,
            Some("denied") => c.denied_packets = packets,
            _ => {}
        }
    }
    Ok(c)
}

/// Sandbox ids (the 16 hex digits) that have a namespace of this crate's form on this host:
/// what a sweep compares with the sandboxes it knows.
pub fn leftovers() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else { return Vec::new() };
    let mut ids: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter_map(|name| {
            let hex = name.strip_prefix("bbg-").or_else(|| name.strip_prefix("bbr-"))?;
            Names::of(hex).ok().map(|_| hex.to_string())
        })
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tap_guest_is_addressed_by_its_kernel_as_the_runsc_guest_is_by_the_namespace() {
        assert_eq!(guest_ip_arg(), "ip=10.200.0.2::10.200.0.1:255.255.255.252::eth0:off:10.200.0.1");
    }

    #[test]
    fn counters_are_read_from_nfts_json() {
        let json = r#"{"nftables":[{"metainfo":{"version":"1.0.6"}},{"counter":{"family":"inet","name":"allowed","table":"branchbox","handle":1,"packets":3,"bytes":180}},{"counter":{"family":"inet","name":"denied","table":"branchbox","handle":2,"packets":7,"bytes":420}}]}"#;
        assert_eq!(parse_counters(json).unwrap(), Counters { allowed_packets: 3, denied_packets: 7 });
        assert!(parse_counters("not json").is_err());
    }

    #[test]
    fn the_environment_is_parsed_strictly() {
        // One test touches these variables, so no other test sees them change.
        std::env::set_var("BRANCHBOX_NET_RESOLVERS", "192.0.2.53, 198.51.100.53");
        std::env::set_var("BRANCHBOX_NET_POOL", "100.127.0.0/31");
        assert!(NetConfig::from_env().unwrap_err().to_string().contains("/30"));
        std::env::set_var("BRANCHBOX_NET_POOL", "100.126.0.0/16");
        let cfg = NetConfig::from_env().unwrap();
        assert_eq!(cfg.resolvers, vec![Ipv4Addr::new(192, 0, 2, 53), Ipv4Addr::new(198, 51, 100, 53)]);
        assert_eq!(cfg.pool.to_string(), "100.126.0.0/16");
        std::env::set_var("BRANCHBOX_NET_RESOLVERS", ["192.0.2.53"; 9].join(","));
        assert!(NetConfig::from_env().unwrap_err().to_string().contains("at most 8"));
        std::env::set_var("BRANCHBOX_NET_RESOLVERS", "resolver.example");
        assert!(NetConfig::from_env().unwrap_err().to_string().contains("resolver.example"));
        std::env::remove_var("BRANCHBOX_NET_RESOLVERS");
        std::env::remove_var("BRANCHBOX_NET_POOL");
    }

    #[test]
    fn name_servers_are_read_from_resolv_conf() {
        let text = "# generated\nsearch example\nnameserver 127.0.0.53\nnameserver ::1\nnameserver  192.0.2.53 \nnameserverx 1.1.1.1\n";
        assert_eq!(name_servers(text), vec![Ipv4Addr::new(127, 0, 0, 53), Ipv4Addr::new(192, 0, 2, 53)]);
        assert_eq!(name_servers(&"nameserver 192.0.2.1\n".repeat(20)).len(), MAX_RESOLVERS);
    }

    #[test]
    fn namespace_names_from_the_environment_are_checked() {
        for bad in ["", "../x", ".hidden", "a b", "x;y"] {
            assert!(valid_ns_name(bad).is_err(), "{bad:?} accepted");
        }
        valid_ns_name("bbtest-inet.1").unwrap();
    }
}
