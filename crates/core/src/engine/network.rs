//! Reading and changing a networked sandbox's egress policy while it runs (docs/network.md).
//! The policy's record in the sandbox's directory is `branchbox_net::record`'s, the same for
//! every backend.

use super::Engine;
use branchbox_model::{Error, Result, SandboxId};
use branchbox_net::{Counters, Egress, NetConfig};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

pub(super) fn net_error(e: branchbox_net::Error) -> Error {
    match e {
        branchbox_net::Error::Invalid(m) => Error::InvalidInput(m),
        other => Error::Backend(format!("sandbox networking: {other}")),
    }
}

impl Engine {
    /// The policy of sandbox `id`, refused for a sandbox without a network.
    fn networked(&self, id: &SandboxId) -> Result<Egress> {
        let sandbox = self.store.sandbox(id)?;
        let dir = self.sandbox_dir(id);
        match branchbox_net::record::recorded(&dir).map_err(net_error)? {
            Some(egress) => Ok(egress),
            None => Err(Error::InvalidInput(format!(
                "sandbox {id} ({} backend) has no network; create one with `branchbox create --network`",
                sandbox.backend
            ))),
        }
    }

    /// Sandbox `id`'s egress policy, `None` for a sandbox without a network.
    pub fn egress_policy(&self, id: &SandboxId) -> Result<Option<Egress>> {
        self.store.sandbox(id)?;
        branchbox_net::record::recorded(&self.sandbox_dir(id)).map_err(net_error)
    }

    /// Sandbox `id`'s egress policy and counters.
    pub fn egress(&self, id: &SandboxId) -> Result<(Egress, Counters)> {
        let egress = self.networked(id)?;
        let counters = NetConfig::from_env().map_err(net_error)?.counters(id.as_str()).map_err(net_error)?;
        Ok((egress, counters))
    }

    /// The address at which sandbox `id`'s TCP servers are reached from the host: every port
    /// a process in the sandbox listens on (on all addresses or on `10.200.0.2`) answers there.
    pub fn address(&self, id: &SandboxId) -> Result<Ipv4Addr> {
        self.networked(id)?;
        NetConfig::from_env().map_err(net_error)?.address(id.as_str()).map_err(net_error)
    }

    /// A TCP connection to `port` of sandbox `id`, from where [`Engine::address`] answers
    /// (the service's proxy to exposed ports). The inner error is the connection's own:
    /// refused when nothing listens on the port.
    pub fn connect_port(
        &self,
        id: &SandboxId,
        port: u16,
        timeout: Duration,
    ) -> Result<std::io::Result<TcpStream>> {
        self.networked(id)?;
        NetConfig::from_env().map_err(net_error)?.connect(id.as_str(), port, timeout).map_err(net_error)
    }

    /// A UDP socket connected to `port` of sandbox `id`, opened where [`Engine::connect_port`]
    /// connects (the host, or inside the uplink namespace), so it sends to that port and takes
    /// datagrams from it only (the service's UDP relay). The inner error is the socket's own.
    pub fn udp_port(&self, id: &SandboxId, port: u16) -> Result<std::io::Result<UdpSocket>> {
        self.networked(id)?;
        let net = NetConfig::from_env().map_err(net_error)?;
        let to = SocketAddr::from((net.address(id.as_str()).map_err(net_error)?, port));
        let open = move || {
            let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
            socket.connect(to)?;
            Ok(socket)
        };
        match net.uplink_ns() {
            None => Ok(open()),
            Some(ns) => branchbox_net::in_netns(ns, open).map_err(net_error),
        }
    }

    /// Opens sandbox `id`'s exposed ports to every local user of the host at its router
    /// address (`NetConfig::open_ports`); a network starts with them open only to root and
    /// the service's user, everyone else going through the service's token-protected proxy.
    pub fn open_ports(&self, id: &SandboxId) -> Result<()> {
        self.networked(id)?;
        NetConfig::from_env().map_err(net_error)?.open_ports(id.as_str(), true).map_err(net_error)
    }

    /// Replaces sandbox `id`'s egress policy at once (one nftables transaction) and records it,
    /// so snapshots and forks taken from now on carry it.
    pub fn set_egress(&self, id: &SandboxId, egress: &Egress) -> Result<()> {
        self.networked(id)?;
        NetConfig::from_env().map_err(net_error)?.set_egress(id.as_str(), egress).map_err(net_error)?;
        branchbox_net::record::record(&self.sandbox_dir(id), egress).map_err(net_error)
    }
}
