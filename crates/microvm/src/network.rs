//! A microvm sandbox's network (docs/network.md): the same guest and router namespaces as the
//! gvisor backend's, with the guest namespace made for a VMM (`GuestSide::Tap`: a tap bridged
//! to the router link). The VMM attaches the guest's virtio-net device to that tap and serves
//! the sandbox's resolver; the guest kernel takes its address from the command line, so a
//! boot and every restore of its snapshots have the same one. The policy record beside the
//! sandbox travels into its snapshots, so children get the network their source had.

use branchbox_model::{Error, Result};
use branchbox_net::record::{record, recorded};
use branchbox_net::{Egress, GuestSide, NetConfig, GUEST_TAP};
use branchbox_vmm::linux::NetAttach;
use std::path::Path;

fn map(e: branchbox_net::Error) -> Error {
    match e {
        branchbox_net::Error::Invalid(m) => Error::InvalidInput(m),
        other => Error::Backend(format!("sandbox networking: {other}")),
    }
}

/// Creates sandbox `id`'s network with `egress`, records the policy in its directory `dir`,
/// and returns where its VMM attaches the guest.
pub(crate) fn attach(id: &str, dir: &Path, egress: &Egress) -> Result<NetAttach> {
    let cfg = NetConfig::from_env().map_err(map)?;
    cfg.setup_for(id, egress, dir, GuestSide::Tap).map_err(map)?;
    if let Err(e) = record(dir, egress) {
        let _ = cfg.teardown(id);
        return Err(map(e));
    }
    Ok(NetAttach { sandbox: id.into(), tap: GUEST_TAP.into(), policy_dir: dir.to_path_buf() })
}

/// The network a restore of the snapshot in `src` needs, made for sandbox `id` in `dir`: a
/// snapshot of a networked guest gives its child a network of its own with the same policy;
/// one without gives `None`.
pub(crate) fn attach_restored(id: &str, dir: &Path, src: &Path) -> Result<Option<NetAttach>> {
    match recorded(src).map_err(map)? {
        Some(egress) => attach(id, dir, &egress).map(Some),
        None => Ok(None),
    }
}

/// Whether the sandbox or snapshot in `dir` has a network.
pub(crate) fn is_networked(dir: &Path) -> Result<bool> {
    recorded(dir).map(|r| r.is_some()).map_err(map)
}

/// Copies sandbox `dir`'s policy record, if any, into the snapshot directory `dest`.
pub(crate) fn carry(dir: &Path, dest: &Path) -> Result<()> {
    match recorded(dir).map_err(map)? {
        Some(egress) => record(dest, &egress).map_err(map),
        None => Ok(()),
    }
}

/// Removes sandbox `id`'s namespaces, links, rules and uplink slot, and its resolver's CPU
/// cgroup (its VMM process, which served the resolver, has stopped); nothing there is fine.
pub(crate) fn detach(id: &str) -> Result<()> {
    branchbox_net::resolver_cgroup::remove(id);
    NetConfig::from_env().unwrap_or_default().teardown(id).map_err(map)
}

/// The guest kernel's arguments for a networked sandbox.
pub(crate) fn cmdline(net: Option<&NetAttach>) -> String {
    net.map(|_| format!(" {}", branchbox_net::guest_ip_arg())).unwrap_or_default()
}
