//! A networked sandbox's egress policy and exposed ports (docs/network.md): the policy's
//! reading and change while the sandbox runs, and where a port is reached. The policy's wire
//! form is `crate::ops::network`'s.

use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{sandbox_id, ApiJson};
use crate::ops::network::NetworkPolicy;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

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

    #[test]
    fn ports_are_one_to_65535() {
        assert_eq!(port_number("8080").unwrap(), 8080);
        for bad in ["0", "65536", "-1", "http", ""] {
            assert_eq!(port_number(bad).unwrap_err().code, "invalid_port", "{bad}");
        }
    }
}
