//! `branchbox remote push|pull|gc`: portable snapshots in an S3-compatible store
//! (docs/remote.md).

use crate::output::print;
use anyhow::Result;
use branchbox_chunks::peer::{ChunkSource, Peer};
use branchbox_chunks::s3::{Remote, RemoteConfig, StoreSettings};
use branchbox_chunks::Progress;
use branchbox_core::Engine;
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::ops::ControlFlow;

/// Where the store is.
#[derive(Debug, Args)]
pub struct RemoteArgs {
    /// The store: s3://BUCKET[/PREFIX].
    #[arg(long, global = true, env = "BRANCHBOX_REMOTE")]
    remote: Option<String>,
    /// The S3 endpoint (http://HOST:PORT; path-style addressing). Credentials come only from
    /// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
    #[arg(long, global = true, env = "BRANCHBOX_S3_ENDPOINT")]
    s3_endpoint: Option<String>,
    /// The S3 signing region [default: us-east-1].
    #[arg(long, global = true, env = "BRANCHBOX_S3_REGION")]
    s3_region: Option<String>,
    /// The fleet's manifest key: a file (mode 0600) of 32 random bytes or 64 hex digits. A push
    /// signs the manifest with it; a pull refuses a manifest that is unsigned or not signed with
    /// it. Without it the store is trusted (docs/remote.md, "Signed manifests").
    #[arg(long, global = true, env = "BRANCHBOX_MANIFEST_KEY_FILE")]
    manifest_key_file: Option<std::path::PathBuf>,
}

/// What to do with the store.
#[derive(Debug, Subcommand)]
pub enum RemoteCmd {
    /// Send a snapshot's chunks the store lacks, then its manifest.
    Push {
        /// Snapshot id, name or ref.
        snapshot: String,
    },
    /// Fetch a pushed snapshot into this data directory under the same id (each chunk checked
    /// against its hash); `restore` and `fork` then work from it.
    Pull {
        /// Snapshot id.
        snapshot: String,
        /// Ask this branchboxd (http://HOST:PORT, one that holds the snapshot) for each chunk
        /// before the store; its token is BRANCHBOX_PEER_TOKEN. Any failure of the peer sends
        /// the pull to the store.
        #[arg(long)]
        peer: Option<String>,
    },
    /// Delete a snapshot's manifest from the store; the next gc sweeps the chunks only it named.
    Rm {
        /// Snapshot id.
        snapshot: String,
    },
    /// Delete the chunks no manifest names (not while a push or pull holds a lease).
    Gc {
        /// Only report.
        #[arg(long)]
        dry_run: bool,
    },
}

fn remote(args: &RemoteArgs) -> Result<Remote> {
    let cfg = RemoteConfig::from_env(&StoreSettings {
        remote: args.remote.clone(),
        s3_endpoint: args.s3_endpoint.clone(),
        s3_region: args.s3_region.clone(),
        manifest_key_file: args.manifest_key_file.clone(),
    })?;
    Ok(Remote::new(&cfg)?)
}

/// The peer of `remote pull --peer URL`, once it has proved it holds the token
/// (BRANCHBOX_PEER_TOKEN) for the address it is asked at; else why it is not used (the pull
/// then takes every chunk from the store, and says why).
fn checked_peer(url: &str) -> Result<std::result::Result<Peer, String>> {
    let token = std::env::var("BRANCHBOX_PEER_TOKEN").ok().filter(|t| !t.is_empty());
    // A malformed address or token is the caller's mistake, not the peer's.
    let peer = Peer::new(url, token.clone())?;
    if let Some(t) = &token {
        let agent = ureq::AgentBuilder::new().timeout_connect(std::time::Duration::from_secs(3)).build();
        let listen = peer.url().strip_prefix("http://");
        if let Err(why) = crate::challenge::verify(&agent, peer.url(), t, listen) {
            return Ok(Err(format!(
                "peer {} was not asked (its token was not sent to it): {why}",
                peer.url()
            )));
        }
    }
    Ok(Ok(peer))
}

/// A byte progress bar on a terminal (nothing otherwise, and nothing with --json).
fn bar(json: bool) -> Option<ProgressBar> {
    (!json && std::io::stderr().is_terminal()).then(|| {
        let b = ProgressBar::new(0);
        b.set_style(
            ProgressStyle::with_template("{bar:30} {bytes}/{total_bytes} {bytes_per_sec} {msg}")
                .unwrap_or(ProgressStyle::default_bar()),
        );
        b
    })
}

fn show(bar: &Option<ProgressBar>, p: Progress) {
    if let Some(b) = bar {
        b.set_length(p.total_bytes);
        b.set_position(p.done_bytes);
        b.set_message(format!("{} chunks", p.chunks));
    }
}

const MIB: f64 = 1048576.0;

/// Runs one `remote` subcommand.
pub fn run(engine: &Engine, args: &RemoteArgs, command: RemoteCmd, json: bool) -> Result<i32> {
    let remote = remote(args)?;
    let pb = bar(json);
    match command {
        RemoteCmd::Push { snapshot } => {
            let r = engine.push_snapshot(&remote, &snapshot, &mut |p| {
                show(&pb, p);
                ControlFlow::Continue(())
            });
            if let Some(b) = &pb {
                b.finish_and_clear();
            }
            let r = r?;
            print(json, &r, || {
                format!(
                    "pushed {} to {}: {} chunks, sent {} ({:.1} MiB), {:.1} MiB already there, {:.1} s",
                    r.snapshot,
                    remote.url(),
                    r.chunks,
                    r.sent_chunks,
                    r.sent_bytes as f64 / MIB,
                    r.skipped_bytes as f64 / MIB,
                    r.seconds
                )
            });
        }
        RemoteCmd::Pull { snapshot, peer: peer_url } => {
            let (peer, unused) = match peer_url.as_deref().map(checked_peer).transpose()? {
                Some(Ok(p)) => (Some(p), None),
                Some(Err(why)) => (None, Some(why)),
                None => (None, None),
            };
            let r = engine.pull_snapshot(
                &remote,
                &snapshot,
                peer.as_ref().map(|p| p as &dyn ChunkSource),
                &mut |p| show(&pb, p),
            );
            if let Some(b) = &pb {
                b.finish_and_clear();
            }
            let mut r = r?;
            if r.peer_error.is_none() {
                r.peer_error = unused;
            }
            print(json, &r, || {
                let from_peer = match &peer {
                    Some(p) => format!(" ({:.1} MiB from peer {})", r.peer_bytes as f64 / MIB, p.url()),
                    None => String::new(),
                };
                let why =
                    r.peer_error.as_deref().map(|w| format!("; the peer failed: {w}")).unwrap_or_default();
                format!(
                    "pulled {} from {}: {} chunks, fetched {:.1} MiB{from_peer}, reused {:.1} MiB from snapshots here, {:.1} s{why}",
                    r.snapshot,
                    remote.url(),
                    r.chunks,
                    r.fetched_bytes as f64 / MIB,
                    r.reused_bytes as f64 / MIB,
                    r.seconds
                )
            });
        }
        RemoteCmd::Rm { snapshot } => {
            let id = branchbox_model::SnapshotId::parse(&snapshot)?;
            branchbox_chunks::remove(&remote, &id)?;
            print(json, &serde_json::json!({ "removed": id }), || {
                format!("removed {id} from {}", remote.url())
            });
        }
        RemoteCmd::Gc { dry_run } => {
            let r = branchbox_chunks::gc(&remote, dry_run)?;
            print(json, &r, || {
                if !r.swept {
                    return format!(
                        "nothing swept: {} live lease(s) of pushes, pulls or another gc in {}; try again when they end",
                        r.live_leases,
                        remote.url()
                    );
                }
                let verb = if r.dry_run { "would delete" } else { "deleted" };
                format!(
                    "{verb} {} unreferenced chunk(s) ({:.1} MiB), {} expired lease(s) and {} orphaned signature(s); {} manifest(s) name {} chunk(s)",
                    r.deleted_chunks.len(),
                    r.deleted_bytes as f64 / MIB,
                    r.expired_leases,
                    r.deleted_signatures,
                    r.manifests,
                    r.live_chunks
                )
            });
        }
    }
    Ok(0)
}
