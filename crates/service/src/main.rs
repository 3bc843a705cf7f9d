//! `branchboxd`: serves the branchbox API for one data directory.

use anyhow::Context;
use branchbox_service::auth::Tokens;
use branchbox_service::{api, ttl, AppState, ServiceConfig};
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
}

fn main() -> anyhow::Result<()> {
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
    let service_dir = cfg.service_dir();
    std::fs::create_dir_all(&service_dir).with_context(|| format!("creating {}", service_dir.display()))?;
    let tokens = if cfg.auth {
        let path = a.token_file.clone().unwrap_or_else(|| service_dir.join("token"));
        Some(Tokens::load_or_create(&path).with_context(|| format!("token file {}", path.display()))?)
    } else {
        tracing::warn!("authentication is off: anyone who can reach {} controls every sandbox", a.listen);
        None
    };
    let st = AppState::open(cfg, tokens).context("opening the data directory")?;
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(serve(st, &a.listen))
}

async fn serve(st: AppState, listen: &str) -> anyhow::Result<()> {
    let (alive, lost, dropped) = st.blocking(ttl::reconcile).await?;
    tracing::info!("found {alive} sandboxes alive, {lost} lost; dropped {dropped} stale records");
    let listener =
        tokio::net::TcpListener::bind(listen).await.with_context(|| format!("listening on {listen}"))?;
    let url = format!("http://{}", listener.local_addr()?);
    let url_file = st.cfg.service_dir().join("url");
    let tmp = url_file.with_extension("tmp");
    std::fs::write(&tmp, format!("{url}\n"))?;
    std::fs::rename(&tmp, &url_file)?;
    tracing::info!("branchboxd serving {} at {url}", st.cfg.engine.data_dir.display());
    tokio::spawn(ttl::run(st.clone()));
    let (router, _) = api::router(st.clone());
    let r = axum::serve(listener, router).with_graceful_shutdown(stop_signal()).await;
    // Only our own URL is removed: another branchboxd may have started on this directory since.
    if std::fs::read_to_string(&url_file).is_ok_and(|u| u.trim() == url) {
        let _ = std::fs::remove_file(&url_file);
    }
    r.context("serving")
}

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
