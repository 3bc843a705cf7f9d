//! `branchbox-vhost`: serves one branchbox device back end on a vhost-user socket, for the
//! QEMU end-to-end test and for developers (docs/vhost-user.md has the QEMU command line).

use std::path::{Path, PathBuf};

use anyhow::Context;
use branchbox_disk::{LayeredBackend, OverlayBackend, Store};
use branchbox_vhost::{Backend, ServedDevice, VhostServer};
use branchbox_virtio::blk::Block;
use branchbox_virtio::net::{Net, Tap, GUEST_MAC};
use branchbox_virtio::rng::Rng;
use branchbox_virtio::vsock::Vsock;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "branchbox-vhost", about = "Serve a branchbox virtio device over vhost-user")]
struct Cli {
    /// The vhost-user Unix socket to create (a stale file there is replaced).
    #[arg(long)]
    socket: PathBuf,
    /// Serve one front-end connection, then exit (default: serve one after another).
    #[arg(long)]
    once: bool,
    #[command(subcommand)]
    device: DeviceArgs,
}

#[derive(Subcommand)]
enum DeviceArgs {
    /// virtio-blk over a read-only base disk and a writable overlay (QEMU: vhost-user-blk-pci).
    Blk {
        /// The base disk image; never written.
        #[arg(long)]
        base: PathBuf,
        /// The overlay that takes the guest's writes; created sparse if missing.
        #[arg(long)]
        overlay: PathBuf,
        /// The id the guest reads with VIRTIO_BLK_T_GET_ID (at most 20 bytes used).
        #[arg(long, default_value = "branchbox")]
        id: String,
    },
    /// virtio-blk over a layered disk (docs/disk-layers.md): chain CHAIN of the layer store
    /// STORE, whose writable top takes the guest's writes (QEMU: vhost-user-blk-pci).
    BlkLayers {
        /// The layer store directory (created if missing).
        #[arg(long)]
        store: PathBuf,
        /// The chain to serve; it must have a writable top (a frozen chain is forked first).
        #[arg(long)]
        chain: String,
        /// Create the chain over this read-only base disk if the store has none of that name.
        #[arg(long)]
        create_over: Option<PathBuf>,
        /// The id the guest reads with VIRTIO_BLK_T_GET_ID (at most 20 bytes used).
        #[arg(long, default_value = "branchbox")]
        id: String,
    },
    /// virtio-rng fed by the host kernel's random pool (QEMU: vhost-user-rng-pci).
    Rng,
    /// virtio-net over a tap device of the server's network namespace (QEMU: `-netdev
    /// vhost-user` with `virtio-net-pci,mac=02:62:62:00:00:02`, the MAC every guest has).
    Net {
        /// The tap to attach to (created if missing; one made beforehand must be a plain tap,
        /// `ip tuntap add NAME mode tap`).
        #[arg(long)]
        tap: String,
    },
    /// virtio-vsock whose host side is a Unix socket: connect, send `CONNECT <port>\n`, read
    /// `OK <port>\n`, then the stream is the guest connection (QEMU: vhost-user-vsock-pci).
    Vsock {
        /// The guest's context id (3 or more).
        #[arg(long, default_value_t = 3)]
        guest_cid: u64,
        /// The host-side Unix socket to create.
        #[arg(long)]
        host_socket: PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let mut server = VhostServer::bind(&cli.socket)?;
    loop {
        // A fresh device per session: a front end that reconnects gets a reset device.
        match &cli.device {
            DeviceArgs::Blk { base, overlay, id } => {
                let disk = OverlayBackend::open(base, overlay)
                    .with_context(|| format!("opening disk {} over {}", overlay.display(), base.display()))?;
                serve(&mut server, Block::new(Box::new(disk), id))?
            }
            DeviceArgs::BlkLayers { store, chain, create_over, id } => {
                let disk = open_layers(store, chain, create_over.as_deref())?;
                serve(&mut server, Block::new(Box::new(disk), id))?
            }
            DeviceArgs::Rng => serve(&mut server, Rng::new())?,
            DeviceArgs::Net { tap } => {
                let port = Tap::open(tap).with_context(|| format!("opening tap {tap}"))?;
                serve(&mut server, Net::new(Box::new(port), GUEST_MAC))?
            }
            DeviceArgs::Vsock { guest_cid, host_socket } => {
                serve(&mut server, Vsock::new(*guest_cid, host_socket)?)?
            }
        }
        if cli.once {
            return Ok(());
        }
    }
}

/// Opens `chain` in the store at `store`, creating it over `create_over` if it does not exist.
/// The top is closed (its pending index slots written, its lock released) when the session's
/// device is dropped, so the next session reopens it.
fn open_layers(store: &Path, chain: &str, create_over: Option<&Path>) -> anyhow::Result<LayeredBackend> {
    let layers = Store::open(store).with_context(|| format!("opening layer store {}", store.display()))?;
    let exists = layers.has_chain(chain)?;
    let disk = match create_over {
        Some(base) if !exists => LayeredBackend::create(&layers, chain, base),
        _ => LayeredBackend::open(&layers, chain),
    };
    disk.with_context(|| format!("opening chain {chain} of layer store {}", store.display()))
}

fn serve<D: ServedDevice>(server: &mut VhostServer, device: D) -> anyhow::Result<()> {
    let backend = Backend::new(device);
    let counters = backend.counters();
    server.serve(backend)?;
    let queues: Vec<String> = (0..counters.queues.len())
        .map(|q| {
            format!(
                "queue {q}: {} chains, {} bytes to the guest, {} refused",
                counters.chains(q),
                counters.bytes_to_guest(q),
                counters.rejected(q)
            )
        })
        .collect();
    eprintln!(
        "branchbox-vhost: {} session on {} ended; {}",
        D::NAME,
        server.path().display(),
        queues.join("; ")
    );
    Ok(())
}
