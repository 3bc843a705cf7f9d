//! `branchbox remote push|pull|gc`: portable snapshots in an S3-compatible store
//! (docs/remote.md).

use crate::output::print;
use anyhow::{Context, Result};
use branchbox_chunks::s3::{Remote, RemoteConfig};
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
    /// The S3 endpoint (http://HOST:PORT; path-style addressing). The region is
    /// BRANCHBOX_S3_REGION (default us-east-1); credentials AWS_ACCESS_KEY_ID and
    /// AWS_SECRET_ACCESS_KEY.
    #[arg(long, global = true, env = "BRANCHBOX_S3_ENDPOINT")]
    s3_endpoint: Option<String>,
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
    let url = args
        .remote
        .clone()
        .context("no store named: pass --remote s3://BUCKET/PREFIX or set BRANCHBOX_REMOTE")?;
    let endpoint = args
        .s3_endpoint
        .clone()
        .context("no S3 endpoint: pass --s3-endpoint http://HOST:PORT or set BRANCHBOX_S3_ENDPOINT")?;
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let cfg = RemoteConfig {
        url,
        endpoint,
        region: env("BRANCHBOX_S3_REGION").unwrap_or_else(|| "us-east-1".into()),
        access_key: env("AWS_ACCESS_KEY_ID").context("AWS_ACCESS_KEY_ID is not set")?,
        secret_key: env("AWS_SECRET_ACCESS_KEY").context("AWS_SECRET_ACCESS_KEY is not set")?,
    };
    Ok(Remote::new(&cfg)?)
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
        RemoteCmd::Pull { snapshot } => {
            let r = engine.pull_snapshot(&remote, &snapshot, &mut |p| show(&pb, p));
            if let Some(b) = &pb {
                b.finish_and_clear();
            }
            let r = r?;
            print(json, &r, || {
                format!(
                    "pulled {} from {}: {} chunks, fetched {:.1} MiB, reused {:.1} MiB from snapshots here, {:.1} s",
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
                    "{verb} {} unreferenced chunk(s) ({:.1} MiB) and {} expired lease(s); {} manifest(s) name {} chunk(s)",
                    r.deleted_chunks.len(),
                    r.deleted_bytes as f64 / MIB,
                    r.expired_leases,
                    r.manifests,
                    r.live_chunks
                )
            });
        }
    }
    Ok(0)
}
