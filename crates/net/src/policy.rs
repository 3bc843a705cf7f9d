//! The egress policy of one sandbox and its nftables rendering. Everything rendered comes from
//! typed values (addresses, prefix lengths, fixed interface names), never from text a client
//! gave, so no rule can be smuggled in.

use crate::learned::MAX_LEARNED;
use crate::Error;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

/// Most CIDRs one allow-list may hold: each is one set element; the bound keeps a policy
/// change one small nftables transaction.
pub const MAX_ALLOW: usize = 256;

/// An IPv4 network, `a.b.c.d/len`, with no host bits set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Cidr {
    addr: Ipv4Addr,
    len: u8,
}

impl Cidr {
    /// The network `addr/len`; `len` at most 32 and `addr` without host bits.
    pub fn new(addr: Ipv4Addr, len: u8) -> Result<Cidr, Error> {
        if len > 32 {
            return Err(Error::Invalid(format!("{addr}/{len}: the prefix length is at most 32")));
        }
        let mask = if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len)) };
        let net = u32::from(addr) & mask;
        if net != u32::from(addr) {
            return Err(Error::Invalid(format!(
                "{addr}/{len} has host bits set; did you mean {}/{len}?",
                Ipv4Addr::from(net)
            )));
        }
        Ok(Cidr { addr, len })
    }

    /// The network address.
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.len
    }
}

impl FromStr for Cidr {
    type Err = Error;
    fn from_str(s: &str) -> Result<Cidr, Error> {
        if s.len() > 18 {
            return Err(Error::Invalid(format!("{s:?} is not an IPv4 CIDR (a.b.c.d/len)")));
        }
        let (a, l) = match s.split_once('/') {
            Some((a, l)) => (a, l),
            None => (s, "32"),
        };
        let addr: Ipv4Addr =
            a.parse().map_err(|_| Error::Invalid(format!("{s:?} is not an IPv4 CIDR (a.b.c.d/len)")))?;
        let len: u8 = l
            .parse()
            .map_err(|_| Error::Invalid(format!("{s:?}: the prefix length must be a number from 0 to 32")))?;
        Cidr::new(addr, len)
    }
}

impl TryFrom<String> for Cidr {
    type Error = Error;
    fn try_from(s: String) -> Result<Cidr, Error> {
        s.parse()
    }
}

impl From<Cidr> for String {
    fn from(c: Cidr) -> String {
        c.to_string()
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// Destinations no sandbox reaches unless an allow-list names them: private (RFC 1918),
/// shared (RFC 6598), link-local (with the cloud metadata address 169.254.169.254), loopback,
/// "this network", IETF protocol assignments (RFC 6890, 192.0.0.0/24), benchmarking (RFC 2544,
/// 198.18.0.0/15, used for internal networks by some providers), and multicast plus reserved.
pub const PRIVATE: [(Ipv4Addr, u8); 10] = [
    (Ipv4Addr::new(10, 0, 0, 0), 8),
    (Ipv4Addr::new(172, 16, 0, 0), 12),
    (Ipv4Addr::new(192, 168, 0, 0), 16),
    (Ipv4Addr::new(100, 64, 0, 0), 10),
    (Ipv4Addr::new(169, 254, 0, 0), 16),
    (Ipv4Addr::new(127, 0, 0, 0), 8),
    (Ipv4Addr::new(0, 0, 0, 0), 8),
    (Ipv4Addr::new(192, 0, 0, 0), 24),
    (Ipv4Addr::new(198, 18, 0, 0), 15),
    (Ipv4Addr::new(224, 0, 0, 0), 3),
];

/// The default uplink pool: 32,768 `/31`s out of the shared range (RFC 6598), which every
/// policy refuses to guests.
pub const DEFAULT_POOL: Cidr = Cidr { addr: Ipv4Addr::new(100, 127, 0, 0), len: 16 };

/// What a sandbox may reach.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode", content = "allow")]
pub enum Egress {
    /// Every public IPv4 destination; the [`PRIVATE`] ranges are refused.
    Internet,
    /// Nothing.
    DenyAll,
    /// Only these networks (private ones too, when listed).
    AllowList(AllowList),
}

/// A host name an allow-list names, in lowercase without a trailing dot: `pypi.org` allows
/// that name, `*.github.com` every name under it (not itself). The sandbox's resolver (the
/// forwarder, `dns.rs`) asks upstream only for such names and lets their answers through.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostName {
    name: String,
    subdomains: bool,
}

/// The longest host name (RFC 1035: 253 characters written out).
const MAX_NAME: usize = 253;

impl HostName {
    /// True when `query` (any case, with or without the trailing dot) is a name this allows.
    pub fn matches(&self, query: &str) -> bool {
        let q = query.strip_suffix('.').unwrap_or(query);
        if self.subdomains {
            q.len() > self.name.len() + 1
                && q[q.len() - self.name.len()..].eq_ignore_ascii_case(&self.name)
                && q.as_bytes()[q.len() - self.name.len() - 1] == b'.'
        } else {
            q.eq_ignore_ascii_case(&self.name)
        }
    }
}

impl FromStr for HostName {
    type Err = Error;
    fn from_str(s: &str) -> Result<HostName, Error> {
        let bad = |why: &str| Error::Invalid(format!("{s:?} is not a host name: {why}"));
        let (subdomains, rest) = match s.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        let name = rest.strip_suffix('.').unwrap_or(rest).to_ascii_lowercase();
        if name.is_empty() || name.len() > MAX_NAME {
            return Err(bad("it must hold 1 to 253 characters"));
        }
        for label in name.split('.') {
            if label.is_empty() || label.len() > 63 {
                return Err(bad("each dot-separated label holds 1 to 63 characters"));
            }
            if !label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
                return Err(bad("only letters, digits, '-' and '_' (and a leading '*.') are taken"));
            }
            if label.starts_with('-') || label.ends_with('-') {
                return Err(bad("a label may not begin or end with '-'"));
            }
        }
        if subdomains && !name.contains('.') {
            return Err(bad("a wildcard needs a domain of two labels or more under it (*.example.com)"));
        }
        if name.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
            return Err(bad("it is all digits; give an address as a CIDR (a.b.c.d/len)"));
        }
        Ok(HostName { name, subdomains })
    }
}

impl fmt::Display for HostName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.subdomains {
            write!(f, "*.{}", self.name)
        } else {
            f.write_str(&self.name)
        }
    }
}

/// A bounded list ([`MAX_ALLOW`] entries at most) of networks and host names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<String>", into = "Vec<String>")]
pub struct AllowList {
    nets: Vec<Cidr>,
    hosts: Vec<HostName>,
}

impl AllowList {
    /// `nets` and `hosts` as an allow-list; refused past [`MAX_ALLOW`] entries in all.
    pub fn new(nets: Vec<Cidr>, hosts: Vec<HostName>) -> Result<AllowList, Error> {
        let n = nets.len() + hosts.len();
        if n > MAX_ALLOW {
            return Err(Error::Invalid(format!(
                "an allow-list holds at most {MAX_ALLOW} entries; {n} were given: merge networks into wider ones, names under a wildcard"
            )));
        }
        Ok(AllowList { nets, hosts })
    }

    /// Parses each item as a CIDR (`192.0.2.0/24`, or one address) or else as a host name
    /// (`pypi.org`, `*.github.com`); the error names the item.
    pub fn parse<S: AsRef<str>>(items: &[S]) -> Result<AllowList, Error> {
        if items.len() > MAX_ALLOW {
            return Err(Error::Invalid(format!(
                "an allow-list holds at most {MAX_ALLOW} entries; {} were given",
                items.len()
            )));
        }
        let (mut nets, mut hosts) = (Vec::new(), Vec::new());
        for item in items {
            let s = item.as_ref().trim();
            let looks_like_address = s.bytes().all(|b| b.is_ascii_digit() || b == b'.' || b == b'/');
            if looks_like_address || s.contains('/') {
                nets.push(s.parse::<Cidr>()?);
            } else {
                hosts.push(s.parse::<HostName>()?);
            }
        }
        AllowList::new(nets, hosts)
    }

    /// The networks.
    pub fn cidrs(&self) -> &[Cidr] {
        &self.nets
    }

    /// The host names.
    pub fn hosts(&self) -> &[HostName] {
        &self.hosts
    }

    /// True when `name` is one of the listed host names.
    pub fn allows_name(&self, name: &str) -> bool {
        self.hosts.iter().any(|h| h.matches(name))
    }

    /// Every entry as text: the networks, then the names.
    pub fn entries(&self) -> Vec<String> {
        self.nets.iter().map(Cidr::to_string).chain(self.hosts.iter().map(HostName::to_string)).collect()
    }
}

impl TryFrom<Vec<String>> for AllowList {
    type Error = Error;
    fn try_from(v: Vec<String>) -> Result<AllowList, Error> {
        AllowList::parse(&v)
    }
}

impl From<AllowList> for Vec<String> {
    fn from(a: AllowList) -> Vec<String> {
        a.entries()
    }
}

/// True when `addr` is in one of the [`PRIVATE`] ranges.
pub fn is_private(addr: Ipv4Addr) -> bool {
    PRIVATE.iter().any(|(net, len)| {
        let mask = if *len == 0 { 0 } else { u32::MAX << (32 - u32::from(*len)) };
        u32::from(addr) & mask == u32::from(*net)
    })
}

/// The interface facing the guest, in the router namespace.
pub const GUEST_SIDE: &str = "gw0";
/// The uplink, in the router namespace.
pub const UPLINK_SIDE: &str = "up0";
/// The router namespace's nftables table (family `inet`).
pub const TABLE: &str = "branchbox";

fn set_body(cidrs: &[Cidr]) -> String {
    let items: Vec<String> = cidrs.iter().map(Cidr::to_string).collect();
    if items.is_empty() {
        String::new()
    } else {
        format!("elements = {{ {} }}", items.join(", "))
    }
}

/// The rules of the `egress` chain for `egress`: `pool` (the uplinks of every sandbox) is
/// refused in every mode. An allow-list accepts its networks (the set `allowed`) and the
/// addresses its host names resolved to (the set `resolved`, filled by the sandbox's DNS
/// forwarder as it answers, each element timing out with its record). Refusals reject (TCP
/// reset, else ICMP administratively prohibited) so a denied connection fails at once.
pub fn egress_rules(egress: &Egress, pool: Cidr) -> String {
    let mut r = String::new();
    r.push_str(&format!("ip daddr {pool} counter name denied meta l4proto tcp reject with tcp reset\n"));
    r.push_str(&format!("ip daddr {pool} counter name denied reject with icmpx type admin-prohibited\n"));
    match egress {
        Egress::Internet => r.push_str("ip daddr @private counter name denied meta l4proto tcp reject with tcp reset\nip daddr @private counter name denied reject with icmpx type admin-prohibited\nmeta nfproto ipv4 counter name allowed accept\n"),
        Egress::DenyAll => {}
        Egress::AllowList(list) => {
            if !list.cidrs().is_empty() {
                r.push_str("ip daddr @allowed counter name allowed accept\n");
            }
            if !list.hosts().is_empty() {
                r.push_str("ip daddr @resolved counter name allowed accept\n");
            }
        }
    }
    r.push_str("meta l4proto tcp counter name denied reject with tcp reset\n");
    r.push_str("counter name denied reject with icmpx type admin-prohibited\n");
    r
}

/// The allowed set's elements for `egress` (empty unless it is an allow-list).
fn allowed(egress: &Egress) -> &[Cidr] {
    match egress {
        Egress::AllowList(list) => list.cidrs(),
        _ => &[],
    }
}

fn private() -> Vec<Cidr> {
    PRIVATE.iter().filter_map(|(a, l)| Cidr::new(*a, *l).ok()).collect()
}

/// The set of addresses the forwarder resolved for an allow-list's host names.
pub const RESOLVED_SET: &str = "resolved";

/// The whole table of a router namespace: forwarding from the guest through `egress`, replies
/// only, nothing into the router itself from the guest but DNS (UDP and TCP) to `resolver`
/// (the forwarder on the router's guest-side address), and NAT out of the uplink. A TCP
/// connection or a UDP flow that arrives on the uplink, at the router's own uplink address, is
/// passed on to the guest's `guest` address at the same port: the sandbox's exposed ports. Only the uplink's far side reaches that address (the host, or a test's
/// namespace); the pool is refused to every guest, and the host refuses flows into uplinks
/// from anywhere but itself.
pub fn router_table(egress: &Egress, pool: Cidr, resolver: Ipv4Addr, guest: Ipv4Addr) -> String {
    format!(
        "table inet {TABLE} {{
  counter allowed {{ }}
  counter denied {{ }}
  set private {{ type ipv4_addr; flags interval; {private} }}
  set allowed {{ type ipv4_addr; flags interval; {allowed} }}
  set {RESOLVED_SET} {{ type ipv4_addr; flags timeout; size {MAX_LEARNED}; }}
  chain egress {{
{rules}  }}
  chain forward {{
    type filter hook forward priority filter; policy drop;
    ct state established,related accept
    iifname \"{GUEST_SIDE}\" oifname \"{UPLINK_SIDE}\" jump egress
    iifname \"{UPLINK_SIDE}\" oifname \"{GUEST_SIDE}\" ct status dnat meta l4proto {{ tcp, udp }} ip daddr {guest} accept
  }}
  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    iifname \"{UPLINK_SIDE}\" meta l4proto {{ tcp, udp }} dnat ip to {guest}
  }}
  chain input {{
    type filter hook input priority filter; policy drop;
    ct state established,related accept
    iifname \"lo\" accept
    iifname \"{GUEST_SIDE}\" ip daddr {resolver} udp dport 53 accept
    iifname \"{GUEST_SIDE}\" ip daddr {resolver} tcp dport 53 accept
  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    oifname \"{UPLINK_SIDE}\" masquerade
  }}
}}
",
        private = set_body(&private()),
        allowed = set_body(allowed(egress)),
        rules = indent(&egress_rules(egress, pool)),
    )
}

/// One nftables transaction that replaces the policy of a running router namespace: the
/// addresses resolved under the old one go with it.
pub fn change(egress: &Egress, pool: Cidr) -> String {
    format!(
        "flush chain inet {TABLE} egress
flush set inet {TABLE} allowed
flush set inet {TABLE} {RESOLVED_SET}
table inet {TABLE} {{
  set allowed {{ type ipv4_addr; flags interval; {allowed} }}
  chain egress {{
{rules}  }}
}}
",
        allowed = set_body(allowed(egress)),
        rules = indent(&egress_rules(egress, pool)),
    )
}

/// One nftables transaction that lets the guest reach each address of `batch` (resolved for
/// a listed host name) for its number of seconds.
pub fn resolved(batch: &[(Ipv4Addr, u32)]) -> String {
    let items: Vec<String> = batch.iter().map(|(a, ttl)| format!("{a} timeout {ttl}s")).collect();
    format!("add element inet {TABLE} {RESOLVED_SET} {{ {} }}\n", items.join(", "))
}

fn indent(rules: &str) -> String {
    rules.lines().map(|l| format!("    {l}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GUEST: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 2);
    const RESOLVER: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 1);

    fn pool() -> Cidr {
        "100.127.0.0/16".parse().unwrap()
    }

    #[test]
    fn cidrs_parse_strictly() {
        assert_eq!("10.0.0.0/8".parse::<Cidr>().unwrap().to_string(), "10.0.0.0/8");
        assert_eq!("203.0.113.7".parse::<Cidr>().unwrap().to_string(), "203.0.113.7/32");
        for bad in
            ["10.0.0.1/8", "10.0.0.0/33", "10.0.0/8", "x", "10.0.0.0/", "10.0.0.0/8 accept", "::1/128", ""]
        {
            assert!(bad.parse::<Cidr>().is_err(), "{bad:?} accepted");
        }
        let e = "10.0.0.1/8".parse::<Cidr>().unwrap_err().to_string();
        assert!(e.contains("10.0.0.0/8"), "the error does not suggest the network: {e}");
    }

    #[test]
    fn allow_lists_are_bounded() {
        let one: Cidr = "192.0.2.0/24".parse().unwrap();
        assert!(AllowList::new(vec![one; MAX_ALLOW], vec![]).is_ok());
        let e =
            AllowList::new(vec![one; MAX_ALLOW], vec!["pypi.org".parse().unwrap()]).unwrap_err().to_string();
        assert!(e.contains("256") && e.contains("257"), "{e}");
        let json = serde_json::to_string(&vec!["192.0.2.0/24"; MAX_ALLOW + 1]).unwrap();
        assert!(serde_json::from_str::<AllowList>(&json).is_err());
        assert!(serde_json::from_str::<Egress>(r#"{"mode":"allow_list","allow":["10.0.0.1/8"]}"#).is_err());
    }

    #[test]
    fn the_default_refuses_private_ranges_and_allows_the_rest() {
        let t = router_table(&Egress::Internet, pool(), RESOLVER, GUEST);
        for net in [
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
            "100.64.0.0/10",
            "169.254.0.0/16",
            "127.0.0.0/8",
            "192.0.0.0/24",
            "198.18.0.0/15",
        ] {
            assert!(t.contains(net), "{net} missing from the private set:\n{t}");
        }
        let rules = egress_rules(&Egress::Internet, pool());
        let deny = rules.find("@private").unwrap();
        let allow = rules.find("counter name allowed accept").unwrap();
        assert!(deny < allow, "private destinations are accepted before they are refused:\n{rules}");
        assert!(
            rules.starts_with("ip daddr 100.127.0.0/16"),
            "the uplink pool is not refused first:\n{rules}"
        );
    }

    #[test]
    fn deny_all_accepts_nothing_and_allow_lists_only_their_set() {
        let deny = egress_rules(&Egress::DenyAll, pool());
        assert!(!deny.contains("accept"), "{deny}");
        let list = Egress::AllowList(AllowList::new(vec!["192.0.2.0/24".parse().unwrap()], vec![]).unwrap());
        let rules = egress_rules(&list, pool());
        assert_eq!(rules.matches("accept").count(), 1, "{rules}");
        assert!(rules.contains("ip daddr @allowed counter name allowed accept"));
        assert!(router_table(&list, pool(), RESOLVER, GUEST).contains("elements = { 192.0.2.0/24 }"));
        let empty = Egress::AllowList(AllowList::new(vec![], vec![]).unwrap());
        assert!(!egress_rules(&empty, pool()).contains("accept"));
    }

    #[test]
    fn only_tcp_and_udp_from_the_uplink_are_passed_to_the_guest() {
        let t = router_table(&Egress::DenyAll, pool(), RESOLVER, GUEST);
        assert!(t.contains("iifname \"up0\" meta l4proto { tcp, udp } dnat ip to 10.200.0.2"), "{t}");
        let inbound: Vec<&str> = t.lines().filter(|l| l.contains("iifname \"up0\"")).collect();
        assert_eq!(inbound.len(), 2, "{t}");
        assert!(
            inbound.iter().all(|l| l.contains("meta l4proto { tcp, udp }")),
            "something but TCP and UDP enters from the uplink:\n{t}"
        );
        assert!(inbound[0].contains("ct status dnat") && inbound[0].ends_with("accept"), "{t}");
    }

    #[test]
    fn only_the_forwarder_is_reachable_in_the_router() {
        let t = router_table(&Egress::DenyAll, pool(), RESOLVER, GUEST);
        let input = &t[t.find("chain input").unwrap()..];
        let input = &input[..input.find('}').unwrap()];
        assert!(input.contains("policy drop"), "{input}");
        let accepts: Vec<&str> = input.lines().filter(|l| l.trim_end().ends_with("accept")).collect();
        assert_eq!(accepts.len(), 4, "{input}");
        assert!(accepts[2].contains("iifname \"gw0\" ip daddr 10.200.0.1 udp dport 53"), "{input}");
        assert!(accepts[3].contains("iifname \"gw0\" ip daddr 10.200.0.1 tcp dport 53"), "{input}");
    }

    #[test]
    fn host_names_parse_strictly_and_match_case_blind() {
        let exact: HostName = "PyPI.org.".parse().unwrap();
        assert_eq!(exact.to_string(), "pypi.org");
        assert!(exact.matches("pypi.org") && exact.matches("PYPI.ORG.") && !exact.matches("files.pypi.org"));
        assert!(!exact.matches("evilpypi.org"));
        let wild: HostName = "*.github.com".parse().unwrap();
        assert!(wild.matches("api.github.com") && wild.matches("a.b.github.com."));
        assert!(
            !wild.matches("github.com")
                && !wild.matches("evilgithub.com")
                && !wild.matches("x.github.com.evil")
        );
        for bad in [
            "",
            "*.com",
            "a..b",
            "-a.com",
            "a-.com",
            "a b.com",
            "a.com;drop",
            "*",
            "**.a.com",
            "1.2.3.4",
            &"a".repeat(64),
        ] {
            assert!(bad.parse::<HostName>().is_err(), "{bad:?} accepted");
        }
        assert!(format!("{}.com", "a.".repeat(130)).parse::<HostName>().is_err(), "a name past 253 accepted");
    }

    #[test]
    fn allow_lists_take_networks_and_names_and_round_trip() {
        let list = AllowList::parse(&["203.0.113.0/24", "198.51.100.7", "pypi.org", "*.github.com"]).unwrap();
        assert_eq!(list.cidrs().len(), 2);
        assert_eq!(list.hosts().len(), 2);
        assert!(list.allows_name("api.github.com") && !list.allows_name("example.com"));
        let json = serde_json::to_string(&Egress::AllowList(list.clone())).unwrap();
        assert_eq!(
            json,
            r#"{"mode":"allow_list","allow":["203.0.113.0/24","198.51.100.7/32","pypi.org","*.github.com"]}"#
        );
        assert_eq!(serde_json::from_str::<Egress>(&json).unwrap(), Egress::AllowList(list.clone()));
        let rules = egress_rules(&Egress::AllowList(list), pool());
        assert!(rules.contains("@allowed") && rules.contains("@resolved"), "{rules}");
        let names_only = AllowList::parse(&["pypi.org"]).unwrap();
        let rules = egress_rules(&Egress::AllowList(names_only), pool());
        assert!(
            !rules.contains("@allowed") && rules.contains("ip daddr @resolved counter name allowed accept")
        );
        let e = AllowList::parse(&["10.0.0.1/8"]).unwrap_err().to_string();
        assert!(e.contains("10.0.0.0/8"), "{e}");
        assert!(AllowList::parse(&["pypi.org; flush ruleset"]).is_err());
    }

    #[test]
    fn resolved_addresses_are_added_with_their_timeout_and_a_change_forgets_them() {
        let add = resolved(&[(Ipv4Addr::new(203, 0, 113, 10), 60), (Ipv4Addr::new(203, 0, 113, 11), 300)]);
        assert_eq!(
            add,
            "add element inet branchbox resolved { 203.0.113.10 timeout 60s, 203.0.113.11 timeout 300s }\n"
        );
        assert!(change(&Egress::DenyAll, pool()).contains("flush set inet branchbox resolved\n"));
        assert!(router_table(&Egress::DenyAll, pool(), RESOLVER, GUEST)
            .contains("set resolved { type ipv4_addr; flags timeout; size 4096; }"));
    }

    #[test]
    fn private_addresses_are_told_apart() {
        for a in [
            "10.1.2.3",
            "169.254.169.254",
            "127.0.0.1",
            "192.168.1.1",
            "172.31.0.1",
            "100.64.0.1",
            "224.0.0.1",
            "192.0.0.170",
            "198.18.0.1",
            "198.19.255.254",
        ] {
            assert!(is_private(a.parse().unwrap()), "{a}");
        }
        for a in [
            "203.0.113.10",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "192.0.1.1",
            "198.20.0.1",
            "198.17.255.255",
        ] {
            assert!(!is_private(a.parse().unwrap()), "{a}");
        }
    }

    #[test]
    fn a_change_replaces_the_chain_and_the_set_in_one_input() {
        let c = change(&Egress::DenyAll, pool());
        assert!(
            c.starts_with("flush chain inet branchbox egress\nflush set inet branchbox allowed\n"),
            "{c}"
        );
        assert!(!c.contains("hook"), "a change must not redefine base chains:\n{c}");
    }
}
