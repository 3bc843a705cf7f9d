//! A sandbox's egress policy in its wire form (docs/network.md), shared by the create of every
//! surface and by `/v1/sandboxes/{id}/network`: the policy a client names, the engine's
//! [`Egress`] it stands for, and which one a create asks for.

use crate::error::{ApiError, ApiResult};
use branchbox_net::{AllowList, Egress};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What a networked sandbox may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// Every public IPv4 address; private, link-local, shared and metadata ranges are refused.
    Internet,
    /// Nothing (its exposed ports still answer).
    DenyAll,
    /// Only the networks and host names in `allow` (private networks too, when listed).
    AllowList,
}

/// A sandbox's egress policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicy {
    /// The mode.
    pub mode: NetworkMode,
    /// With `allow_list`: IPv4 networks (`192.0.2.0/24`) and host names (`pypi.org`,
    /// `*.github.com`: what the sandbox's resolver answers for them), at most 256 in all;
    /// refused with any other mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<String>>,
}

impl NetworkPolicy {
    /// The engine's policy, every network parsed and bounded.
    pub fn egress(&self) -> ApiResult<Egress> {
        match (self.mode, &self.allow) {
            (NetworkMode::Internet, None) => Ok(Egress::Internet),
            (NetworkMode::DenyAll, None) => Ok(Egress::DenyAll),
            (NetworkMode::AllowList, Some(list)) => Ok(Egress::AllowList(
                AllowList::parse(list).map_err(|e| ApiError::invalid(format!("allow: {e}")))?,
            )),
            (NetworkMode::AllowList, None) => Err(ApiError::invalid(
                "mode allow_list needs allow, the networks and host names it may reach",
            )),
            (_, Some(_)) => Err(ApiError::invalid("allow is only taken with mode allow_list")),
        }
    }

    /// The wire form of the engine's policy.
    pub fn of(egress: &Egress) -> NetworkPolicy {
        match egress {
            Egress::Internet => NetworkPolicy { mode: NetworkMode::Internet, allow: None },
            Egress::DenyAll => NetworkPolicy { mode: NetworkMode::DenyAll, allow: None },
            Egress::AllowList(list) => {
                NetworkPolicy { mode: NetworkMode::AllowList, allow: Some(list.entries()) }
            }
        }
    }
}

/// The network a create asks for: `network`, or E2B's `allow_internet_access` (true: the
/// internet, false: nothing), never both; `None` when neither is given (no network).
pub fn requested(
    network: Option<&NetworkPolicy>,
    allow_internet_access: Option<bool>,
) -> ApiResult<Option<Egress>> {
    match (network, allow_internet_access) {
        (Some(_), Some(_)) => Err(ApiError::invalid("give network or allow_internet_access, not both")),
        (Some(n), None) => n.egress().map(Some),
        (None, Some(true)) => Ok(Some(Egress::Internet)),
        (None, Some(false)) => Ok(Some(Egress::DenyAll)),
        (None, None) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(json: &str) -> Result<NetworkPolicy, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn policies_parse_typed_and_bad_ones_are_refused_with_the_reason() {
        assert_eq!(policy(r#"{"mode":"internet"}"#).unwrap().egress().unwrap(), Egress::Internet);
        assert_eq!(policy(r#"{"mode":"deny_all"}"#).unwrap().egress().unwrap(), Egress::DenyAll);
        let list = policy(r#"{"mode":"allow_list","allow":["192.0.2.0/24"]}"#).unwrap();
        assert_eq!(NetworkPolicy::of(&list.egress().unwrap()), list);
        assert!(policy(r#"{"mode":"everything"}"#).is_err());
        assert!(policy(r#"{"mode":"internet","extra":1}"#).is_err());
        for (json, says) in [
            (r#"{"mode":"allow_list"}"#, "needs allow"),
            (r#"{"mode":"internet","allow":[]}"#, "only taken with"),
            (r#"{"mode":"allow_list","allow":["192.0.2.1/24"]}"#, "192.0.2.1/24"),
            (r#"{"mode":"allow_list","allow":["not a network"]}"#, "not a network"),
        ] {
            let e = policy(json).unwrap().egress().unwrap_err();
            assert_eq!(e.status.as_u16(), 422, "{json}");
            assert!(e.message.contains(says), "{json}: {}", e.message);
        }
        let many: Vec<String> = (0..257).map(|i| format!("\"10.{}.{}.0/24\"", i / 256, i % 256)).collect();
        let e = policy(&format!(r#"{{"mode":"allow_list","allow":[{}]}}"#, many.join(","))).unwrap().egress();
        assert!(e.unwrap_err().message.contains("at most 256"));
    }

    #[test]
    fn a_create_asks_for_a_network_one_way_only() {
        assert_eq!(requested(None, None).unwrap(), None);
        assert_eq!(requested(None, Some(true)).unwrap(), Some(Egress::Internet));
        assert_eq!(requested(None, Some(false)).unwrap(), Some(Egress::DenyAll));
        let deny = NetworkPolicy { mode: NetworkMode::DenyAll, allow: None };
        assert_eq!(requested(Some(&deny), None).unwrap(), Some(Egress::DenyAll));
        assert!(requested(Some(&deny), Some(true)).unwrap_err().message.contains("not both"));
    }
}
