//! The network flags of `create` and the `egress` command (docs/network.md).

use crate::args::CreateArgs;
use crate::output::print;
use anyhow::{anyhow, Result};
use branchbox_core::Engine;
use branchbox_model::SandboxId;
use branchbox_net::{AllowList, Egress};

/// The network policy the create flags ask for, if any.
pub(crate) fn egress(c: &CreateArgs) -> Result<Option<Egress>> {
    policy(c.network, &c.allow, c.deny_all)
}

/// The policy `--network`/`--internet`, `--allow` and `--deny-all` ask for, if any.
pub(crate) fn policy(internet: bool, allow: &[String], deny_all: bool) -> Result<Option<Egress>> {
    if deny_all {
        return Ok(Some(Egress::DenyAll));
    }
    if !allow.is_empty() {
        let list = AllowList::parse(allow).map_err(|e| anyhow!("--allow: {e}"))?;
        return Ok(Some(Egress::AllowList(list)));
    }
    Ok(internet.then_some(Egress::Internet))
}

pub(crate) fn egress_cmd(engine: &Engine, id: &SandboxId, change: Option<Egress>, json: bool) -> Result<i32> {
    if let Some(egress) = &change {
        engine.set_egress(id, egress)?;
    }
    let (egress, counters) = engine.egress(id)?;
    let v = serde_json::json!({
        "policy": egress,
        "allowed_packets": counters.allowed_packets,
        "denied_packets": counters.denied_packets,
    });
    print(json, &v, || {
        let mode = match &egress {
            Egress::Internet => "internet (private ranges refused)".to_string(),
            Egress::DenyAll => "deny-all".to_string(),
            Egress::AllowList(list) => format!("allow-list {}", list.entries().join(" ")),
        };
        format!(
            "policy: {mode}\nnew flows allowed: {} packets, refused: {} packets",
            counters.allowed_packets, counters.denied_packets
        )
    });
    Ok(0)
}

pub(crate) fn host_cmd(engine: &Engine, id: &SandboxId, port: u16, json: bool) -> Result<i32> {
    if port == 0 {
        return Err(anyhow!("port 0 is not a port a server listens on; give 1 to 65535"));
    }
    let addr = std::net::SocketAddrV4::new(engine.address(id)?, port);
    let v = serde_json::json!({ "host": addr.ip().to_string(), "port": port, "address": addr.to_string() });
    print(json, &v, || addr.to_string());
    Ok(0)
}
