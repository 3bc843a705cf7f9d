//! E2B's network options on branchbox's egress policy (docs/e2b.md, docs/network.md): the
//! create's `allow_internet_access` and `network` object (`allowOut`, `denyOut`, `dnsServers`,
//! and the public-traffic settings) and `PUT /sandboxes/{id}/network` (`Sandbox.update_network`),
//! each mapped onto one [`Egress`] and enforced by the sandbox's router; and back, the rules
//! that stand for a sandbox's policy in E2B's sandbox detail ([`detail`]).
//!
//! E2B's rules are an allow list that takes precedence over a deny list. branchbox's policy is
//! one of three modes: the public internet (private ranges refused), nothing, or only a list.
//! So a deny of all traffic (`0.0.0.0/0`, or `allow_internet_access: false`) with `allowOut` is
//! branchbox's allow-list, without `allowOut` its deny-all; no deny at all is its internet
//! mode, which `allowOut` of public destinations leaves as it is. What falls between (a deny of
//! some public networks only, an allowed private network without the deny of all) and what
//! branchbox has no part for (an egress proxy, request rewriting, public URLs) is refused with a
//! 400 that names the option, never left out.

use super::E2bError;
use crate::error::ApiError;
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::put;
use axum::Router;
use branchbox_model::SandboxId;
use branchbox_net::policy::PRIVATE;
use branchbox_net::{AllowList, Cidr, Egress, MAX_ALLOW};
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;

type E2bResult<T> = Result<T, E2bError>;

/// Most DNS servers one policy names (E2B's own bound).
const MAX_DNS_SERVERS: usize = 10;

/// The routes under [`super::PREFIX`] this module serves.
pub fn routes() -> Router<AppState> {
    Router::new().route("/sandboxes/{id}/network", put(update))
}

/// E2B's `SandboxNetworkConfig` (create) and `SandboxNetworkUpdateConfig` (update), every field
/// either SDK sends. A field of neither is refused by name.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Rules {
    allow_out: Option<Vec<String>>,
    deny_out: Option<Vec<String>>,
    dns_servers: Option<Vec<String>>,
    egress_proxy: Option<serde_json::Value>,
    rules: Option<serde_json::Value>,
    allow_public_traffic: Option<bool>,
    mask_request_host: Option<String>,
    https_ports: Option<Vec<serde_json::Value>>,
    /// Only in the update's body (on create it stands beside `network`).
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
}

/// A sandbox id from E2B's wire: one not shaped like branchbox's names no sandbox (404), as in
/// the control plane's other routes.
pub(super) fn e2b_id(id: &str) -> E2bResult<SandboxId> {
    SandboxId::parse(id)
        .map_err(|_| E2bError(ApiError::not_found(format!("sandbox {:?} not found", shown(id)))))
}

fn refused(what: &str, why: &str) -> E2bError {
    E2bError(ApiError::bad_request(
        "not_served",
        format!("{what} is not served by branchboxd's E2B API: {why} (docs/e2b.md)"),
    ))
}

fn bad(what: &str, why: impl std::fmt::Display) -> E2bError {
    E2bError(ApiError::bad_request("bad_network", format!("{what}: {why}")))
}

fn shown(v: &str) -> String {
    v.chars().take(64).collect()
}

/// True when every address of `c` lies in one of the ranges branchbox's internet mode refuses.
fn within_private(c: &Cidr) -> bool {
    PRIVATE.iter().any(|(net, len)| c.prefix_len() >= *len && masked(c.addr(), *len) == *net)
}

/// True when `c` shares an address with one of those ranges.
fn touches_private(c: &Cidr) -> bool {
    PRIVATE.iter().any(|(net, len)| {
        let l = c.prefix_len().min(*len);
        masked(c.addr(), l) == masked(*net, l)
    })
}

fn masked(a: Ipv4Addr, len: u8) -> Ipv4Addr {
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len)) };
    Ipv4Addr::from(u32::from(a) & mask)
}

impl Rules {
    /// Refuses what branchbox has no part for; the settings it already keeps pass.
    fn check_served(&self) -> E2bResult<()> {
        if self.egress_proxy.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(refused(
                "network egressProxy (a SOCKS5 proxy for egress)",
                "a sandbox's traffic leaves through its own router and NAT; leave it out",
            ));
        }
        if self.rules.as_ref().is_some_and(|v| !v.is_null() && v.as_object().is_none_or(|m| !m.is_empty())) {
            return Err(refused(
                "network rules (rewriting the sandbox's outbound HTTPS requests)",
                "branchbox filters traffic by destination and never rewrites it",
            ));
        }
        if self.allow_public_traffic == Some(true) {
            return Err(refused(
                "network allowPublicTraffic: true (sandbox URLs without a token)",
                "a sandbox's ports are reached through branchboxd's proxy behind its token, or from \
                 the host it runs on (docs/network.md); false, which is what branchbox does, is taken",
            ));
        }
        if self.mask_request_host.is_some() {
            return Err(refused(
                "network maskRequestHost",
                "branchbox has no public host names for sandboxes' ports",
            ));
        }
        if self.https_ports.as_ref().is_some_and(|p| !p.is_empty()) {
            return Err(refused(
                "network httpsPorts",
                "branchboxd's proxy passes HTTP to a sandbox's ports; a server speaking TLS is reached \
                 from the host",
            ));
        }
        Ok(())
    }

    /// Whether these rules say anything about egress.
    fn about_egress(&self) -> bool {
        self.allow_out.is_some() || self.deny_out.is_some() || self.dns_servers.is_some()
    }

    /// The policy these rules stand for; `deny_everything` adds E2B's
    /// `allow_internet_access: false` (a deny of `0.0.0.0/0`).
    fn egress(&self, deny_everything: bool) -> E2bResult<Egress> {
        self.check_served()?;
        let denied = self.deny_out.as_deref().unwrap_or_default();
        if denied.len() > MAX_ALLOW {
            return Err(bad(
                "network denyOut",
                format!("at most {MAX_ALLOW} entries; {} were given", denied.len()),
            ));
        }
        let denied: Vec<Cidr> = denied
            .iter()
            .map(|d| {
                d.trim().parse::<Cidr>().map_err(|e| {
                    bad("network denyOut", format!("{e}; it takes networks and addresses only, as on E2B"))
                })
            })
            .collect::<E2bResult<_>>()?;
        let allowed = AllowList::parse(self.allow_out.as_deref().unwrap_or_default())
            .map_err(|e| bad("network allowOut", e))?;
        // E2B opens its name servers only for an allowOut that holds a domain. Unlike E2B, none
        // is opened unless named: the sandbox's own resolver answers for the listed names, and
        // an open server address is a way out on every port, not only DNS's.
        let servers = self.dns_servers()?;
        let dns: Vec<Cidr> = if allowed.hosts().is_empty() { Vec::new() } else { servers };
        if deny_everything || denied.iter().any(|c| c.prefix_len() == 0) {
            if allowed.cidrs().is_empty() && allowed.hosts().is_empty() {
                return Ok(Egress::DenyAll);
            }
            let mut nets = allowed.cidrs().to_vec();
            nets.extend(dns.into_iter().filter(|c| !allowed.cidrs().contains(c)));
            let list =
                AllowList::new(nets, allowed.hosts().to_vec()).map_err(|e| bad("network allowOut", e))?;
            return Ok(Egress::AllowList(list));
        }
        // No deny of everything: branchbox's internet mode, which already refuses the private
        // ranges and lets every public destination through.
        if let Some(d) = denied.iter().find(|c| !within_private(c)) {
            return Err(refused(
                &format!("network denyOut {d} without 0.0.0.0/0"),
                "branchbox denies everything (denyOut 0.0.0.0/0, or allow_internet_access false, with \
                 allowOut naming what may be reached) or only private ranges; a deny of some public \
                 networks alone has no policy here",
            ));
        }
        let private = |what: &str, c: &Cidr| {
            refused(
                &format!("network {what} {c} without denyOut 0.0.0.0/0"),
                "with no deny of everything the sandbox gets branchbox's internet policy, which refuses \
                 private, link-local and metadata ranges; deny 0.0.0.0/0 and list the network to reach it",
            )
        };
        if let Some(c) = allowed.cidrs().iter().find(|c| touches_private(c)) {
            return Err(private("allowOut", c));
        }
        if let Some(c) = dns.iter().find(|c| touches_private(c)) {
            return Err(private("dnsServers", c));
        }
        Ok(Egress::Internet)
    }

    /// `dnsServers` (each one address); none when it is left out (E2B opens 8.8.8.8 then).
    fn dns_servers(&self) -> E2bResult<Vec<Cidr>> {
        let Some(given) = &self.dns_servers else { return Ok(Vec::new()) };
        if given.len() > MAX_DNS_SERVERS {
            return Err(bad(
                "network dnsServers",
                format!("at most {MAX_DNS_SERVERS} servers; {} were given", given.len()),
            ));
        }
        given
            .iter()
            .map(|s| match s.trim().parse::<Ipv4Addr>() {
                Ok(a) => host(a),
                Err(_) => Err(bad("network dnsServers", format!("{:?} is not an IPv4 address", shown(s)))),
            })
            .collect()
    }
}

/// One address as a network.
fn host(a: Ipv4Addr) -> E2bResult<Cidr> {
    Cidr::new(a, 32).map_err(|e| bad("network dnsServers", e))
}

/// The network a create asks for (`None`: none, branchbox's default for E2B's creates too):
/// `allow_internet_access` alone is the internet (true) or nothing (false); a `network` object
/// with egress rules is their policy, `allow_internet_access: false` beside it a deny of
/// everything. A sandbox made from a snapshot keeps the snapshot's network, so rules for it are
/// refused (`allow_internet_access` is not applied there, as before).
pub fn on_create(
    network: Option<&serde_json::Value>,
    allow_internet_access: Option<bool>,
    from_snapshot: bool,
) -> E2bResult<Option<Egress>> {
    let network = network.filter(|v| !v.is_null());
    if from_snapshot {
        return match network {
            Some(_) => Err(refused(
                "network with a snapshot",
                "a sandbox made from a snapshot keeps the snapshot's network; change it afterwards with \
                 update_network",
            )),
            None => Ok(None),
        };
    }
    let rules: Rules = match network {
        Some(v) => Rules::deserialize(v).map_err(|e| bad("network", e))?,
        None => Rules::default(),
    };
    if rules.allow_internet_access.is_some() {
        return Err(bad("network", "allow_internet_access goes beside network, not in it"));
    }
    rules.check_served()?;
    if !rules.about_egress() && allow_internet_access.is_none() {
        return Ok(None);
    }
    rules.egress(allow_internet_access == Some(false)).map(Some)
}

/// E2B's `SandboxNetworkConfig` as its sandbox detail answers it (`get_info().network`).
#[derive(Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Shown {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    allow_out: Vec<String>,
    deny_out: Vec<String>,
    /// Always given with an allow list: branchbox opens no name server unless it is listed,
    /// where E2B's SDK reads a missing field as its default, 8.8.8.8, opened.
    #[serde(skip_serializing_if = "Option::is_none")]
    dns_servers: Option<Vec<String>>,
    /// Always false: a sandbox's ports are reached only behind its token.
    allow_public_traffic: bool,
}

/// How E2B's sandbox detail shows a policy: the `network` rules that stand for it (which,
/// given back to `update_network`, set the same policy), `None` for a sandbox without a
/// network, and `allowInternetAccess`, false unless the sandbox reaches the internet.
/// branchbox's internet mode is the deny of the private ranges it refuses; a deny of
/// everything is `denyOut` `0.0.0.0/0`, with the allow list as `allowOut`.
pub fn detail(egress: Option<&Egress>) -> (Option<Shown>, bool) {
    let everything = || vec!["0.0.0.0/0".to_string()];
    let net = match egress {
        None => return (None, false),
        Some(Egress::Internet) => Shown {
            allow_out: Vec::new(),
            deny_out: PRIVATE.iter().map(|(a, len)| format!("{a}/{len}")).collect(),
            dns_servers: None,
            allow_public_traffic: false,
        },
        Some(Egress::DenyAll) => Shown {
            allow_out: Vec::new(),
            deny_out: everything(),
            dns_servers: None,
            allow_public_traffic: false,
        },
        Some(Egress::AllowList(list)) => Shown {
            allow_out: list.entries(),
            deny_out: everything(),
            dns_servers: Some(Vec::new()),
            allow_public_traffic: false,
        },
    };
    let internet = matches!(egress, Some(Egress::Internet));
    (Some(net), internet)
}

/// `PUT /sandboxes/{id}/network` (`Sandbox.update_network`): replaces a networked sandbox's
/// policy at once with the one the body stands for; as on E2B, a field left out is cleared,
/// so an empty body is the internet.
async fn update(State(st): State<AppState>, Path(id): Path<String>, raw: Bytes) -> E2bResult<StatusCode> {
    let sid = e2b_id(&id)?;
    let text: &[u8] = if raw.iter().all(u8::is_ascii_whitespace) { b"{}" } else { &raw };
    let rules: Rules = serde_json::from_slice(text).map_err(|e| bad("the network body", e))?;
    let egress = rules.egress(rules.allow_internet_access == Some(false))?;
    st.blocking(move |engine, _| Ok(engine.set_egress(&sid, &egress)?)).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn create(v: serde_json::Value, internet: Option<bool>) -> Result<Option<Egress>, String> {
        on_create(Some(&v), internet, false).map_err(|e| e.0.message)
    }

    fn list(items: &[&str]) -> Egress {
        Egress::AllowList(AllowList::parse(items).unwrap())
    }

    #[test]
    fn a_deny_of_everything_makes_allow_out_the_allow_list() {
        let v = json!({"allowOut": ["203.0.113.10", "10.1.0.0/16"], "denyOut": ["0.0.0.0/0"]});
        assert_eq!(create(v, None).unwrap(), Some(list(&["203.0.113.10/32", "10.1.0.0/16"])));
        let v = json!({"allowOut": ["203.0.113.10"]});
        assert_eq!(create(v, Some(false)).unwrap(), Some(list(&["203.0.113.10/32"])));
        assert_eq!(
            create(json!({"denyOut": ["0.0.0.0/0", "192.0.2.0/24"]}), None).unwrap(),
            Some(Egress::DenyAll)
        );
    }

    #[test]
    fn a_listed_domain_opens_only_the_name_servers_named() {
        let v = json!({"allowOut": ["pypi.org"], "denyOut": ["0.0.0.0/0"]});
        assert_eq!(create(v, None).unwrap(), Some(list(&["pypi.org"])), "no 8.8.8.8 unless named");
        let v = json!({"allowOut": ["pypi.org"], "denyOut": ["0.0.0.0/0"], "dnsServers": ["192.0.2.53"]});
        assert_eq!(create(v, None).unwrap(), Some(list(&["192.0.2.53/32", "pypi.org"])));
        let v = json!({"allowOut": ["pypi.org"], "denyOut": ["0.0.0.0/0"], "dnsServers": []});
        assert_eq!(create(v, None).unwrap(), Some(list(&["pypi.org"])));
        let v = json!({"allowOut": ["192.0.2.1"], "denyOut": ["0.0.0.0/0"], "dnsServers": ["192.0.2.53"]});
        assert_eq!(create(v, None).unwrap(), Some(list(&["192.0.2.1/32"])), "no domain: no effect");
        let v = json!({"allowOut": ["pypi.org"], "denyOut": ["0.0.0.0/0"], "dnsServers": ["dns.google"]});
        assert!(create(v, None).unwrap_err().contains("not an IPv4 address"));
    }

    #[test]
    fn without_a_deny_of_everything_the_sandbox_has_the_internet() {
        assert_eq!(
            create(json!({"allowOut": ["198.51.100.0/24", "pypi.org"]}), None).unwrap(),
            Some(Egress::Internet)
        );
        assert_eq!(
            create(json!({"denyOut": ["10.0.0.0/8", "169.254.169.254"]}), None).unwrap(),
            Some(Egress::Internet)
        );
        assert_eq!(create(json!({}), Some(true)).unwrap(), Some(Egress::Internet));
        assert_eq!(create(json!({}), Some(false)).unwrap(), Some(Egress::DenyAll));
        assert_eq!(on_create(None, None, false).unwrap(), None, "no network asked: none, as before");
        assert_eq!(create(json!({"allowPublicTraffic": false}), None).unwrap(), None);
    }

    #[test]
    fn what_branchbox_cannot_honour_is_refused_by_name() {
        let cases = [
            (json!({"denyOut": ["198.51.100.0/24"]}), "denyOut 198.51.100.0/24"),
            (json!({"denyOut": ["8.0.0.0/6"]}), "denyOut 8.0.0.0/6"),
            (json!({"allowOut": ["10.0.0.0/8"]}), "allowOut 10.0.0.0/8"),
            (json!({"allowOut": ["0.0.0.0/0"]}), "allowOut 0.0.0.0/0"),
            (json!({"allowOut": ["pypi.org"], "dnsServers": ["10.0.0.53"]}), "dnsServers 10.0.0.53/32"),
            (json!({"denyOut": ["example.com"]}), "networks and addresses only"),
            (json!({"egressProxy": {"address": "proxy:1080"}}), "egressProxy"),
            (json!({"rules": {"api.example.com": [{}]}}), "network rules"),
            (json!({"allowPublicTraffic": true}), "allowPublicTraffic"),
            (json!({"maskRequestHost": "${PORT}-x.example.com"}), "maskRequestHost"),
            (json!({"httpsPorts": [3000]}), "httpsPorts"),
            (json!({"volumes": []}), "unknown field `volumes`"),
            (json!({"allow_internet_access": true}), "beside network"),
            (json!({"allowOut": ["pypi.org; flush ruleset"], "denyOut": ["0.0.0.0/0"]}), "not a host name"),
        ];
        for (v, named) in cases {
            let e = create(v.clone(), None).unwrap_err();
            assert!(e.contains(named), "{v}: {e}");
        }
        let many: Vec<String> = (0..300).map(|i| format!("192.0.2.{}", i % 256)).collect();
        assert!(create(json!({"denyOut": many}), None).unwrap_err().contains("at most 256"));
        let e = on_create(Some(&json!({"allowOut": ["192.0.2.1"]})), None, true).unwrap_err().0.message;
        assert!(e.contains("snapshot"), "{e}");
        assert_eq!(on_create(None, Some(true), true).unwrap(), None, "a snapshot keeps its network");
        assert_eq!(
            create(json!({"egressProxy": null, "rules": {}, "httpsPorts": []}), Some(true)).unwrap(),
            Some(Egress::Internet)
        );
    }

    #[test]
    fn the_detail_shows_rules_that_set_the_same_policy_again() {
        let policies = [
            Egress::Internet,
            Egress::DenyAll,
            list(&["203.0.113.10/32", "10.1.0.0/16", "pypi.org", "*.github.com"]),
        ];
        for egress in policies {
            let (net, internet) = detail(Some(&egress));
            let v = serde_json::to_value(net.unwrap()).unwrap();
            assert_eq!(v["allowPublicTraffic"], json!(false), "{v}");
            assert_eq!(internet, egress == Egress::Internet, "{v}");
            let again: Rules = serde_json::from_value(v.clone()).unwrap();
            assert_eq!(again.egress(false).unwrap(), egress, "{v}");
        }
        let (net, _) = detail(Some(&list(&["pypi.org"])));
        let v = serde_json::to_value(net.unwrap()).unwrap();
        assert_eq!(
            v,
            json!({"allowOut": ["pypi.org"], "denyOut": ["0.0.0.0/0"], "dnsServers": [], "allowPublicTraffic": false})
        );
        let (net, _) = detail(Some(&Egress::Internet));
        let deny = serde_json::to_value(net.unwrap()).unwrap()["denyOut"].clone();
        assert!(deny.as_array().unwrap().contains(&json!("169.254.0.0/16")), "{deny}");
        assert_eq!(detail(None), (None, false), "no network: no rules and no internet");
    }

    #[test]
    fn ranges_are_private_only_when_inside_the_refused_set() {
        let c = |s: &str| s.parse::<Cidr>().unwrap();
        assert!(within_private(&c("10.9.0.0/16")) && within_private(&c("169.254.169.254/32")));
        assert!(!within_private(&c("8.0.0.0/6")) && !within_private(&c("203.0.113.0/24")));
        assert!(touches_private(&c("0.0.0.0/4")) && touches_private(&c("0.0.0.0/0")));
        assert!(!touches_private(&c("192.0.2.0/24")) && !touches_private(&c("198.51.100.0/24")));
    }
}
