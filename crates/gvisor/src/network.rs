//! A gvisor sandbox's network (docs/network.md): its namespaces, links and policy come from
//! `branchbox-net`, which also keeps the policy record beside the sandbox and its snapshots, so
//! children and restores get the network their checkpoint was taken with.

use branchbox_model::{Error, Result};
use branchbox_net::{Egress, NetConfig};
use std::path::{Path, PathBuf};

fn map(e: branchbox_net::Error) -> Error {
    match e {
        branchbox_net::Error::Invalid(m) => Error::InvalidInput(m),
        other => Error::Backend(format!("sandbox networking: {other}")),
    }
}

/// What the bundle needs of a networked sandbox.
pub struct Attached {
    /// The guest namespace.
    pub netns: PathBuf,
    /// The resolver file: the sandbox's DNS forwarder, on its gateway (`branchbox_net::dns`).
    pub resolv_conf: PathBuf,
}

/// Creates sandbox `id`'s network with `egress` and records the policy in `dir`.
pub fn attach(id: &str, dir: &Path, egress: &Egress) -> Result<Attached> {
    let cfg = NetConfig::from_env().map_err(map)?;
    let attached = cfg.setup(id, egress, dir).map_err(map)?;
    record(dir, egress)?;
    let path = dir.join("resolv.conf");
    let text = format!("nameserver {}\n", branchbox_net::GATEWAY);
    std::fs::write(&path, text).map_err(|e| Error::io(&path, e))?;
    Ok(Attached { netns: attached.guest_ns_path, resolv_conf: path })
}

/// Readies sandbox `id`'s guest namespace for another runsc once the last one is gone
/// (`NetConfig::readdress_guest`).
pub fn readdress(id: &str) -> Result<()> {
    NetConfig::from_env().map_err(map)?.readdress_guest(id).map_err(map)
}

/// Serves sandbox `id`'s resolver from this process (its shim) until it exits: the policy of
/// each query is the one recorded in `dir` then. Its threads, and the `nft`s they run, live in
/// the resolver's CPU cgroup (`branchbox_net::resolver_cgroup`).
pub fn serve_dns(id: &str, dir: &Path) -> Result<()> {
    let cfg = NetConfig::from_env().map_err(map)?;
    let (sid, dir) = (id.to_string(), dir.to_path_buf());
    branchbox_net::resolver_cgroup::start_inside(id, "branchbox-shim", move || {
        branchbox_net::dns::start(cfg, &sid, Box::new(move || recorded(&dir).ok().flatten())).map_err(map)
    })
    .map_err(|_| Error::Backend("the sandbox's resolver panicked while starting".into()))?
}

/// Records `egress` as the policy of the sandbox or snapshot in `dir`
/// (`branchbox_net::record`).
pub fn record(dir: &Path, egress: &Egress) -> Result<()> {
    branchbox_net::record::record(dir, egress).map_err(map)
}

/// The policy recorded in `dir`, or `None` for a sandbox or snapshot without a network.
pub fn recorded(dir: &Path) -> Result<Option<Egress>> {
    branchbox_net::record::recorded(dir).map_err(map)
}

/// Copies sandbox `dir`'s policy record, if any, into the snapshot directory `dest`.
pub fn carry(dir: &Path, dest: &Path) -> Result<()> {
    match recorded(dir)? {
        None => Ok(()),
        Some(egress) => record(dest, &egress),
    }
}

/// Removes sandbox `id`'s namespaces, links, rules and uplink slot; nothing there is fine.
pub fn detach(id: &str) -> Result<()> {
    NetConfig::from_env().unwrap_or_default().teardown(id).map_err(map)
}
