//! A networked sandbox's egress policy and exposed ports (docs/network.md): the policy's wire
//! form, its reading and change while the sandbox runs, and where a port is reached.

use super::extract::{sandbox_id, ApiJson};
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::Json;
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

/// A networked sandbox's policy and what it has done.
#[derive(Debug, Serialize, ToSchema)]
pub struct NetworkInfo {
    /// The policy in force.
    pub policy: NetworkPolicy,
    /// Packets of new outbound flows the policy let through.
    pub allowed_packets: u64,
    /// Packets of new outbound flows the policy refused.
    pub denied_packets: u64,
}

fn network_info(engine: &branchbox_core::Engine, id: &branchbox_model::SandboxId) -> ApiResult<NetworkInfo> {
    let (egress, counters) = engine.egress(id)?;
    Ok(NetworkInfo {
        policy: NetworkPolicy::of(&egress),
        allowed_packets: counters.allowed_packets,
        denied_packets: counters.denied_packets,
    })
}

/// A networked sandbox's egress policy and counters.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/network", tag = "network",
    params(("id" = String, Path, description = "sandbox id")),
    responses((status = 200, body = NetworkInfo),
              (status = "4XX", body = ErrorBody, description = "bad id, not found, or no network")))]
pub async fn get(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<NetworkInfo>> {
    let id = sandbox_id(&id)?;
    Ok(Json(st.blocking(move |engine, _| network_info(engine, &id)).await?))
}

/// Replaces a networked sandbox's egress policy at once; snapshots and forks taken from now
/// on carry it.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/network", tag = "network", request_body = NetworkPolicy,
    params(("id" = String, Path, description = "sandbox id")),
    responses((status = 200, body = NetworkInfo),
              (status = "4XX", body = ErrorBody, description = "bad id or policy, not found, or no network")))]
pub async fn set(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(policy): ApiJson<NetworkPolicy>,
) -> ApiResult<Json<NetworkInfo>> {
    let id = sandbox_id(&id)?;
    let egress = policy.egress()?;
    Ok(Json(
        st.blocking(move |engine, _| {
            engine.set_egress(&id, &egress)?;
            network_info(engine, &id)
        })
        .await?,
    ))
}

/// Where a server listening on a port of a networked sandbox is reached.
#[derive(Debug, Serialize, ToSchema)]
pub struct HostInfo {
    /// The sandbox's router address, which passes every TCP port on to the sandbox; reached
    /// from the host branchboxd runs on (its uplink side), not from other machines.
    pub host: String,
    /// The port.
    pub port: u16,
    /// `host:port`.
    pub address: String,
    /// The same server through this service, behind its token: a path on the service's
    /// address.
    pub proxy_path: String,
}

/// Where a server on `port` of a networked sandbox is reached: directly from the host, and
/// through the service's proxy.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/hosts/{port}", tag = "network",
    params(("id" = String, Path, description = "sandbox id"), ("port" = u16, Path, description = "1 to 65535")),
    responses((status = 200, body = HostInfo),
              (status = "4XX", body = ErrorBody, description = "bad id or port, not found, or no network")))]
pub async fn host(
    State(st): State<AppState>,
    Path((id, port)): Path<(String, String)>,
) -> ApiResult<Json<HostInfo>> {
    let id = sandbox_id(&id)?;
    let port = port_number(&port)?;
    let proxy_path = format!("/v1/sandboxes/{id}/ports/{port}/");
    let ip = st.blocking(move |engine, _| Ok(engine.address(&id)?)).await?;
    Ok(Json(HostInfo { host: ip.to_string(), port, address: format!("{ip}:{port}"), proxy_path }))
}

/// A port a server listens on, from a path segment: 1 to 65535.
pub fn port_number(s: &str) -> ApiResult<u16> {
    s.parse()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| ApiError::bad_request("invalid_port", format!("{s:?} is not a port; give 1 to 65535")))
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

    #[test]
    fn ports_are_one_to_65535() {
        assert_eq!(port_number("8080").unwrap(), 8080);
        for bad in ["0", "65536", "-1", "http", ""] {
            assert_eq!(port_number(bad).unwrap_err().code, "invalid_port", "{bad}");
        }
    }
}
