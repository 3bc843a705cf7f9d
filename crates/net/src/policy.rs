//! The egress policy of one sandbox and its nftables rendering. Everything rendered comes from
//! typed values (addresses, prefix lengths, fixed interface names), never from text a client
//! gave, so no rule can be smuggled in.

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
/// "this network", and multicast plus reserved.
pub const PRIVATE: [(Ipv4Addr, u8); 8] = [
    (Ipv4Addr::new(10, 0, 0, 0), 8),
    (Ipv4Addr::new(172, 16, 0, 0), 12),
    (Ipv4Addr::new(192, 168, 0, 0), 16),
    (Ipv4Addr::new(100, 64, 0, 0), 10),
    (Ipv4Addr::new(169, 254, 0, 0), 16),
    (Ipv4Addr::new(127, 0, 0, 0), 8),
    (Ipv4Addr::new(0, 0, 0, 0), 8),
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

/// A bounded list of networks ([`MAX_ALLOW`] at most).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<Cidr>", into = "Vec<Cidr>")]
pub struct AllowList(Vec<Cidr>);

impl AllowList {
    /// `cidrs` as an allow-list; refused past [`MAX_ALLOW`] entries.
    pub fn new(cidrs: Vec<Cidr>) -> Result<AllowList, Error> {
        if cidrs.len() > MAX_ALLOW {
            return Err(Error::Invalid(format!(
                "an allow-list holds at most {MAX_ALLOW} networks; {} were given: merge them into wider ones",
                cidrs.len()
            )));
        }
        Ok(AllowList(cidrs))
    }

    /// The networks.
    pub fn cidrs(&self) -> &[Cidr] {
        &self.0
    }
}

impl TryFrom<Vec<Cidr>> for AllowList {
    type Error = Error;
    fn try_from(v: Vec<Cidr>) -> Result<AllowList, Error> {
        AllowList::new(v)
    }
}

impl From<AllowList> for Vec<Cidr> {
    fn from(a: AllowList) -> Vec<Cidr> {
        a.0
    }
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
/// refused in every mode, `resolvers` are allowed on port 53 in every mode. Refusals reject
/// (TCP reset, else ICMP administratively prohibited) so a denied connection fails at once.
pub fn egress_rules(egress: &Egress, pool: Cidr, resolvers: &[Ipv4Addr]) -> String {
    let mut r = String::new();
    r.push_str(&format!("ip daddr {pool} counter name denied meta l4proto tcp reject with tcp reset\n"));
    r.push_str(&format!("ip daddr {pool} counter name denied reject with icmpx type admin-prohibited\n"));
    if !resolvers.is_empty() {
        let list: Vec<String> = resolvers.iter().map(Ipv4Addr::to_string).collect();
        let set = list.join(", ");
        r.push_str(&format!("ip daddr {{ {set} }} udp dport 53 counter name allowed accept\n"));
        r.push_str(&format!("ip daddr {{ {set} }} tcp dport 53 counter name allowed accept\n"));
    }
    match egress {
        Egress::Internet => r.push_str("ip daddr @private counter name denied meta l4proto tcp reject with tcp reset\nip daddr @private counter name denied reject with icmpx type admin-prohibited\nmeta nfproto ipv4 counter name allowed accept\n"),
        Egress::DenyAll => {}
        Egress::AllowList(list) if list.cidrs().is_empty() => {}
        Egress::AllowList(_) => r.push_str("ip daddr @allowed counter name allowed accept\n"),
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

/// The whole table of a router namespace: forwarding from the guest through `egress`, replies
/// only, nothing into the router itself from the guest, and NAT out of the uplink. A TCP
/// connection that arrives on the uplink, at the router's own uplink address, is passed on to
/// the guest's `guest` address at the same port: the sandbox's exposed ports. Only the uplink's
/// far side reaches that address (the host, or a test's namespace); the pool is refused to
/// every guest, and the host refuses flows into uplinks from anywhere but itself.
pub fn router_table(egress: &Egress, pool: Cidr, resolvers: &[Ipv4Addr], guest: Ipv4Addr) -> String {
    format!(
        "table inet {TABLE} {{
  counter allowed {{ }}
  counter denied {{ }}
  set private {{ type ipv4_addr; flags interval; {private} }}
  set allowed {{ type ipv4_addr; flags interval; {allowed} }}
  chain egress {{
{rules}  }}
  chain forward {{
    type filter hook forward priority filter; policy drop;
    ct state established,related accept
    iifname \"{GUEST_SIDE}\" oifname \"{UPLINK_SIDE}\" jump egress
    iifname \"{UPLINK_SIDE}\" oifname \"{GUEST_SIDE}\" ct status dnat meta l4proto tcp ip daddr {guest} accept
  }}
  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    iifname \"{UPLINK_SIDE}\" meta l4proto tcp dnat ip to {guest}
  }}
  chain input {{
    type filter hook input priority filter; policy drop;
    ct state established,related accept
    iifname \"lo\" accept
  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    oifname \"{UPLINK_SIDE}\" masquerade
  }}
}}
",
        private = set_body(&private()),
        allowed = set_body(allowed(egress)),
        rules = indent(&egress_rules(egress, pool, resolvers)),
    )
}

/// One nftables transaction that replaces the policy of a running router namespace.
pub fn change(egress: &Egress, pool: Cidr, resolvers: &[Ipv4Addr]) -> String {
    format!(
        "flush chain inet {TABLE} egress
flush set inet {TABLE} allowed
table inet {TABLE} {{
  set allowed {{ type ipv4_addr; flags interval; {allowed} }}
  chain egress {{
{rules}  }}
}}
",
        allowed = set_body(allowed(egress)),
        rules = indent(&egress_rules(egress, pool, resolvers)),
    )
}

fn indent(rules: &str) -> String {
    rules.lines().map(|l| format!("    {l}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GUEST: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 2);

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
        assert!(AllowList::new(vec![one; MAX_ALLOW]).is_ok());
        let e = AllowList::new(vec![one; MAX_ALLOW + 1]).unwrap_err().to_string();
        assert!(e.contains("256") && e.contains("257"), "{e}");
        let json = serde_json::to_string(&vec!["192.0.2.0/24"; MAX_ALLOW + 1]).unwrap();
        assert!(serde_json::from_str::<AllowList>(&json).is_err());
        assert!(serde_json::from_str::<Egress>(r#"{"mode":"allow_list","allow":["10.0.0.1/8"]}"#).is_err());
    }

    #[test]
    fn the_default_refuses_private_ranges_and_allows_the_rest() {
        let t = router_table(&Egress::Internet, pool(), &[], GUEST);
        for net in [
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
            "100.64.0.0/10",
            "169.254.0.0/16",
            "127.0.0.0/8",
        ] {
            assert!(t.contains(net), "{net} missing from the private set:\n{t}");
        }
        let rules = egress_rules(&Egress::Internet, pool(), &[]);
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
        let deny = egress_rules(&Egress::DenyAll, pool(), &[]);
        assert!(!deny.contains("accept"), "{deny}");
        let list = Egress::AllowList(AllowList::new(vec!["192.0.2.0/24".parse().unwrap()]).unwrap());
        let rules = egress_rules(&list, pool(), &[]);
        assert_eq!(rules.matches("accept").count(), 1, "{rules}");
        assert!(rules.contains("ip daddr @allowed counter name allowed accept"));
        assert!(router_table(&list, pool(), &[], GUEST).contains("elements = { 192.0.2.0/24 }"));
        let empty = Egress::AllowList(AllowList::new(vec![]).unwrap());
        assert!(!egress_rules(&empty, pool(), &[]).contains("accept"));
    }

    #[test]
    fn only_tcp_from_the_uplink_is_passed_to_the_guest() {
        let t = router_table(&Egress::DenyAll, pool(), &[], GUEST);
        assert!(t.contains("iifname \"up0\" meta l4proto tcp dnat ip to 10.200.0.2"), "{t}");
        let inbound: Vec<&str> = t.lines().filter(|l| l.contains("iifname \"up0\"")).collect();
        assert_eq!(inbound.len(), 2, "{t}");
        assert!(
            inbound.iter().all(|l| l.contains("meta l4proto tcp")),
            "something but TCP enters from the uplink:\n{t}"
        );
        assert!(inbound[0].contains("ct status dnat") && inbound[0].ends_with("accept"), "{t}");
    }

    #[test]
    fn resolvers_are_allowed_on_port_53_only() {
        let r = egress_rules(&Egress::DenyAll, pool(), &[Ipv4Addr::new(192, 0, 2, 53)]);
        assert!(r.contains("ip daddr { 192.0.2.53 } udp dport 53 counter name allowed accept"), "{r}");
        assert_eq!(r.matches("accept").count(), 2, "{r}");
    }

    #[test]
    fn a_change_replaces_the_chain_and_the_set_in_one_input() {
        let c = change(&Egress::DenyAll, pool(), &[]);
        assert!(
            c.starts_with("flush chain inet branchbox egress\nflush set inet branchbox allowed\n"),
            "{c}"
        );
        assert!(!c.contains("hook"), "a change must not redefine base chains:\n{c}");
    }
}
