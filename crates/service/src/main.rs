//! `branchboxd`: serves the branchbox API for one data directory.

use anyhow::Context;
use branchbox_chunks::s3::StoreSettings;
use branchbox_chunks::signing::ManifestKey;
use branchbox_service::auth::Tokens;
use branchbox_service::serve::{self, ServeLimits};
use branchbox_service::{backups, ttl, AppState, ServiceConfig};
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

/// branchboxd: the branchbox service (HTTP+JSON; OpenAPI at /openapi.json).
#[derive(Debug, Parser)]
#[command(name = "branchboxd", version, about)]
struct Args {
    /// Data directory (the same one the `branchbox` command uses).
    #[arg(long, env = "BRANCHBOX_DATA")]
    data_dir: Option<PathBuf>,
    /// Address to listen on (port 0 picks a free one; the URL is written to <data>/service/url).
    #[arg(long, env = "BRANCHBOXD_LISTEN", default_value = "127.0.0.1:7420")]
    listen: String,
    /// Most sandboxes (running or paused) at once; more answer 503.
    #[arg(long, env = "BRANCHBOXD_MAX_SANDBOXES", default_value_t = 64)]
    max_sandboxes: usize,
    /// Token file, one token per line (created with a random token when missing).
    #[arg(long, env = "BRANCHBOXD_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Serve without authentication (only for a socket no one else can reach).
    #[arg(long)]
    insecure_no_auth: bool,
    /// Sandbox timeout when a client names none, seconds.
    #[arg(long, default_value_t = 300)]
    default_timeout: u64,
    /// Time limit of control requests (create, fork, snapshot, ...), seconds.
    #[arg(long, default_value_t = 600)]
    request_timeout: u64,
    /// Largest file upload or download, MiB.
    #[arg(long, default_value_t = 512)]
    max_file_mib: u64,
    /// Most client connections at once; more are answered 503.
    #[arg(long, default_value_t = 512)]
    max_connections: usize,
    /// Longest a client may take to send a request's headers, seconds.
    #[arg(long, default_value_t = 30)]
    header_timeout: u64,
    /// Longest a sandbox's agent may stay silent in a call (beyond the call's own time, such as
    /// a command's timeout) before the call fails and frees its worker, seconds.
    #[arg(long, default_value_t = 60)]
    agent_stall: u64,
    /// A host name clients may use in the Host header besides IP addresses and localhost
    /// (repeatable); other names are refused, which stops DNS rebinding.
    #[arg(long)]
    allowed_host: Vec<String>,
    /// Fleet peers file (JSON `{"node": NAME, "peers": [{name, url, token}]}`, `node` optional,
    /// mode 0600, re-read when it changes): requests naming a sandbox a peer holds are forwarded
    /// to it, listings cover every peer, and a create this node has no room for goes to the peer
    /// with the most (docs/fleet.md).
    #[arg(long, env = "BRANCHBOXD_PEERS")]
    peers: Option<PathBuf>,
    #[command(flatten)]
    store: StoreArgs,
}

/// The S3-compatible store of portable snapshots (docs/remote.md); credentials come only from
/// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY. A flag wins over its variable.
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Snapshot store")]
struct StoreArgs {
    /// The store for pushed snapshots: s3://BUCKET[/PREFIX].
    #[arg(long, env = "BRANCHBOX_REMOTE")]
    remote: Option<String>,
    /// The S3 endpoint: http://HOST:PORT (path-style addressing).
    #[arg(long, env = "BRANCHBOX_S3_ENDPOINT")]
    s3_endpoint: Option<String>,
    /// The S3 signing region [default: us-east-1].
    #[arg(long, env = "BRANCHBOX_S3_REGION")]
    s3_region: Option<String>,
    /// The fleet's manifest key: a file (mode 0600) of 32 random bytes or 64 hex digits. Pushes
    /// sign manifests with it; pulls refuse a manifest unsigned or not signed with it. Checked
    /// at start. Without it the store is trusted.
    #[arg(long, env = "BRANCHBOX_MANIFEST_KEY_FILE")]
    manifest_key_file: Option<PathBuf>,
}

impl StoreArgs {
    fn settings(&self) -> StoreSettings {
        StoreSettings {
            remote: self.remote.clone(),
            s3_endpoint: self.s3_endpoint.clone(),
            s3_region: self.s3_region.clone(),
            manifest_key_file: self.manifest_key_file.clone(),
        }
    }
}

fn main() -> anyhow::Result<()> {
    // The service writes its database (sandboxes' environments), token and the engine's files:
    // none of them is for other users, whatever umask it was started with.
    // SAFETY: umask has no preconditions.
    unsafe { libc::umask(0o077) };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let a = Args::parse();
    let mut cfg = ServiceConfig::new(branchbox_core::Config::from_env(a.data_dir.as_deref()));
    cfg.max_sandboxes = a.max_sandboxes;
    cfg.auth = !a.insecure_no_auth;
    cfg.default_timeout_s = a.default_timeout.max(1);
    cfg.request_timeout = Duration::from_secs(a.request_timeout.max(1));
    cfg.max_upload_bytes = a.max_file_mib << 20;
    cfg.max_download_bytes = a.max_file_mib << 20;
    cfg.max_connections = a.max_connections.max(1);
    cfg.header_timeout = Duration::from_secs(a.header_timeout.max(1));
    cfg.allowed_hosts = a.allowed_host.clone();
    cfg.peers = a.peers.clone();
    cfg.agent_stall = Duration::from_secs(a.agent_stall.max(1));
    cfg.store = a.store.settings();
    // A key that cannot be used would fail every push and pull: refuse to start instead.
    if let Some(path) = &cfg.store.manifest_key_file {
        ManifestKey::load(path).context("the manifest key (--manifest-key-file)")?;
    }
    // Bound before anything else, so the address (port 0 picks one) is known to the challenge.
    let listener =
        std::net::TcpListener::bind(&a.listen).with_context(|| format!("listening on {}", a.listen))?;
    listener.set_nonblocking(true)?;
    cfg.listen = Some(listener.local_addr()?.to_string());
    let service_dir = cfg.service_dir();
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(&service_dir)
        .with_context(|| format!("creating {}", service_dir.display()))?;
    let tokens = if cfg.auth {
        let path = a.token_file.clone().unwrap_or_else(|| service_dir.join("token"));
        Some(Tokens::load_or_create(&path).with_context(|| format!("token file {}", path.display()))?)
    } else {
        tracing::warn!(
            "authentication is off: anyone who can reach {} controls every sandbox",
            cfg.listen.as_deref().unwrap_or(&a.listen)
        );
        None
    };
    // A corrupt store is refused before anything writes to it (the message names the backup).
    let dbs = backups::databases(&cfg.engine.data_dir, &service_dir);
    backups::check(&dbs).map_err(anyhow::Error::msg).context("checking the metadata databases")?;
    let st = AppState::open(cfg, tokens).context("opening the data directory")?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let served = runtime.block_on(serve(st, listener));
    // A blocking worker still in a call (a foreground command waiting for its timeout) must
    // not hold the stop: dropping the runtime would wait for it without bound.
    runtime.shutdown_timeout(Duration::from_secs(2));
    served
}

async fn serve(st: AppState, listener: std::net::TcpListener) -> anyhow::Result<()> {
    let (alive, lost, dropped) = st.blocking(ttl::reconcile).await?;
    tracing::info!("found {alive} sandboxes alive, {lost} lost; dropped {dropped} stale records");
    let (adopted, discarded) = st.blocking(branchbox_service::pool::adopt).await?;
    tracing::info!("pools: re-adopted {adopted} ready sandboxes, destroyed {discarded} that were gone");
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let url = format!("http://{}", listener.local_addr()?);
    let url_file = st.cfg.service_dir().join("url");
    let tmp = url_file.with_extension("tmp");
    std::fs::write(&tmp, format!("{url}\n"))?;
    std::fs::rename(&tmp, &url_file)?;
    tracing::info!("branchboxd serving {} at {url}", st.cfg.engine.data_dir.display());
    tokio::spawn(ttl::run(st.clone()));
    // The warm pools' run-time state, shared by their refill loop and their routes.
    let pools = std::sync::Arc::new(branchbox_service::pool::Pools::default());
    tokio::spawn(branchbox_service::pool::run(st.clone(), pools.clone()));
    let dbs = backups::databases(&st.cfg.engine.data_dir, &st.cfg.service_dir());
    tokio::spawn(backups::run(dbs.clone()));
    let (router, _) = serve::router(st.clone(), pools);
    let limits =
        ServeLimits { header_timeout: st.cfg.header_timeout, max_connections: st.cfg.max_connections };
    // Streams end as soon as the stop comes, so the drain waits only for ordinary requests.
    let stopping = {
        let st = st.clone();
        async move {
            stop_signal().await;
            st.streams.stop();
        }
    };
    serve::serve(listener, router, limits, stopping, DRAIN).await;
    // Restore shells are a cache this service started: a stopped service leaves none running.
    let engine_cfg = st.cfg.engine.clone();
    match tokio::task::spawn_blocking(move || {
        branchbox_core::Engine::open(engine_cfg).map(|e| e.end_shells(true))
    })
    .await
    {
        Ok(Ok(ended)) if !ended.is_empty() => tracing::info!("ended {} restore shell(s)", ended.len()),
        Ok(Err(e)) => tracing::warn!("cannot end the restore shells: {e}"),
        _ => {}
    }
    let _ = tokio::task::spawn_blocking(move || backups::backup_changed(&dbs)).await;
    // Only our own URL is removed: another branchboxd may have started on this directory since.
    if std::fs::read_to_string(&url_file).is_ok_and(|u| u.trim() == url) {
        let _ = std::fs::remove_file(&url_file);
    }
    Ok(())
}

/// How long open requests may run on after SIGTERM before the service stops anyway.
const DRAIN: Duration = Duration::from_secs(10);

async fn stop_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("stopping");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_flags_reach_the_service_settings() {
        let a = Args::try_parse_from([
            "branchboxd",
            "--remote",
            "s3://fleet/snaps",
            "--s3-endpoint",
            "http://127.0.0.1:8333",
            "--s3-region",
            "eu-west-3",
            "--manifest-key-file",
            "/etc/branchbox/manifest.key",
        ])
        .unwrap();
        assert_eq!(
            a.store.settings(),
            StoreSettings {
                remote: Some("s3://fleet/snaps".into()),
                s3_endpoint: Some("http://127.0.0.1:8333".into()),
                s3_region: Some("eu-west-3".into()),
                manifest_key_file: Some("/etc/branchbox/manifest.key".into()),
            }
        );
    }
}
