//! Sandbox networking (docs/network.md): for each sandbox a guest network namespace holding
//! only the guest-facing interface (the same addresses in every sandbox, so forked children
//! keep the source's), and a router namespace with the NAT and the egress policy, linked to
//! an uplink by a veth with a per-sandbox address. Built with iproute2's `ip` and nftables'
//! `nft`; everything of a sandbox is found again from its id, so teardown needs nothing else.

pub mod conns;
pub mod dns;
mod exec;
pub mod learned;
pub mod policy;
pub mod ports;
pub mod record;
pub mod resolver_cgroup;
mod sandbox;
mod slots;
pub mod testing;

pub use exec::in_netns;
pub use policy::{AllowList, Cidr, Egress, MAX_ALLOW};
pub use sandbox::{
    guest_ip_arg, leftovers, Attached, Counters, GuestSide, NetConfig, Uplink, GATEWAY, GUEST_ADDR,
    GUEST_MAC, GUEST_PREFIX, GUEST_TAP,
};

/// What went wrong; each message names the input or the command and what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An input was refused (a CIDR, a list, an id, a namespace name).
    #[error("{0}")]
    Invalid(String),
    /// `ip` or `nft` failed or could not be started.
    #[error("{0}")]
    Command(String),
    /// Every uplink address of the pool is taken.
    #[error("{0}")]
    Exhausted(String),
    /// A file of the state directory could not be used.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// The names of one sandbox's network objects, all derived from its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// The guest namespace (`bbg-<16 hex>`), where runsc runs.
    pub guest_ns: String,
    /// The router namespace (`bbr-<16 hex>`).
    pub router_ns: String,
    /// The uplink's far end (`bbx` and 12 hex digits of a hash of the id: 15 characters, the
    /// interface name limit), in the host or the configured uplink namespace.
    pub uplink_link: String,
}

impl Names {
    /// The names for sandbox `id` (`sbx-<16 hex>`, or the 16 hex digits alone).
    pub fn of(id: &str) -> Result<Names> {
        let hex = id.strip_prefix("sbx-").unwrap_or(id);
        if hex.len() != 16 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(Error::Invalid(format!(
                "{id:?} is not a sandbox id (expected sbx-<16 lowercase hex digits>)"
            )));
        }
        Ok(Names {
            guest_ns: format!("bbg-{hex}"),
            router_ns: format!("bbr-{hex}"),
            uplink_link: format!("bbx{}", &link_hash(hex)[..12]),
        })
    }

    /// The guest namespace's path, for the OCI bundle.
    pub fn guest_ns_path(&self) -> std::path::PathBuf {
        std::path::Path::new(exec::NETNS_DIR).join(&self.guest_ns)
    }
}

/// Hex of the SHA-256 of `hex`: ids that share a prefix still get different link names.
fn link_hash(hex: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(hex.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_id_and_fit_the_kernel_limits() {
        let n = Names::of("sbx-0123456789abcdef").unwrap();
        assert_eq!(n.guest_ns, "bbg-0123456789abcdef");
        assert_eq!(n.router_ns, "bbr-0123456789abcdef");
        assert!(n.uplink_link.starts_with("bbx") && n.uplink_link.len() == 15, "{}", n.uplink_link);
        let sibling = Names::of("sbx-0123456789abcdee").unwrap();
        assert_ne!(sibling.uplink_link, n.uplink_link, "ids with a common prefix share a link name");
        assert_eq!(Names::of("0123456789abcdef").unwrap(), n);
        for bad in ["sbx-0123", "sbx-0123456789ABCDEF", "sbx-../../etc/pas", "", "sbx-0123456789abcdeg"] {
            assert!(Names::of(bad).is_err(), "{bad:?} accepted");
        }
    }
}
