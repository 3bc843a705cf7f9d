//! Who on the host reaches a sandbox's exposed ports at its router address: root and the
//! service's own user, and every local user only for a sandbox created with its ports open to
//! the host on purpose. The token-protected proxy through the service is the way in for
//! everyone else; without this rule any local account could talk to every port of every
//! networked sandbox, bypassing the token.
//!
//! A table of the uplink side's namespace (the host, or the configured uplink namespace)
//! drops, on its output hook, packets to the pool from a socket whose owner is neither root
//! nor the service (`meta skuid`), unless the destination is in the set of open sandboxes.
//! The table is shared by every sandbox of the host; a sandbox's setup resets its own address
//! in the set (slots are reused), so a stale element never opens a new sandbox.

use crate::Cidr;
use std::net::Ipv4Addr;

/// The uplink side's table (family `ip`).
pub const PORTS_TABLE: &str = "branchbox-ports";
/// Its set of router addresses whose ports are open to every local user.
pub const OPEN_SET: &str = "open";

/// One nftables transaction that makes sure the table and its rule exist (rewriting the rule,
/// never the set: other sandboxes' elements stay) and then sets whether `router`'s ports are
/// open to every local user. `uids` are the owners allowed in any case (root, the service).
pub fn rules(pool: Cidr, uids: &[u32], router: Ipv4Addr, open: bool) -> String {
    let mut uids: Vec<String> = uids.iter().map(u32::to_string).collect();
    uids.sort();
    uids.dedup();
    let uids = uids.join(", ");
    let add = if open {
        format!("add element ip {PORTS_TABLE} {OPEN_SET} {{ {router} }}\n")
    } else {
        String::new()
    };
    format!(
        "table ip {PORTS_TABLE} {{
  set {OPEN_SET} {{ type ipv4_addr; }}
  chain output {{ type filter hook output priority filter; policy accept; }}
}}
flush chain ip {PORTS_TABLE} output
table ip {PORTS_TABLE} {{
  chain output {{
    ip daddr {pool} ip daddr != @{OPEN_SET} meta skuid != {{ {uids} }} meta l4proto tcp reject with tcp reset
    ip daddr {pool} ip daddr != @{OPEN_SET} meta skuid != {{ {uids} }} reject with icmp type admin-prohibited
  }}
}}
{}{add}",
        forget(router)
    )
}

/// The commands that take `router` out of the open set, whether it is there or not (adding
/// first makes the delete always find it).
pub fn forget(router: Ipv4Addr) -> String {
    format!(
        "add element ip {PORTS_TABLE} {OPEN_SET} {{ {router} }}\ndelete element ip {PORTS_TABLE} {OPEN_SET} {{ {router} }}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> Cidr {
        "100.127.0.0/16".parse().unwrap()
    }

    #[test]
    fn other_users_are_refused_unless_the_sandbox_is_open_and_setup_resets_its_address() {
        let router = Ipv4Addr::new(100, 127, 0, 1);
        let closed = rules(pool(), &[0, 0], router, false);
        assert!(
            closed.contains(
                "ip daddr 100.127.0.0/16 ip daddr != @open meta skuid != { 0 } meta l4proto tcp reject with tcp reset"
            ),
            "{closed}"
        );
        assert!(closed.ends_with(
            "add element ip branchbox-ports open { 100.127.0.1 }\ndelete element ip branchbox-ports open { 100.127.0.1 }\n"
        ));
        assert!(closed.contains("flush chain ip branchbox-ports output\n"), "the rule would be added twice");
        assert!(!closed.contains("flush set"), "other sandboxes' openings would be lost:\n{closed}");
        let open = rules(pool(), &[1001, 0], router, true);
        assert!(open.contains("meta skuid != { 0, 1001 }"), "{open}");
        assert!(open.ends_with("add element ip branchbox-ports open { 100.127.0.1 }\n"), "{open}");
    }
}
