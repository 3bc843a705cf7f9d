//! The service's settings: where the data lives and every limit a client runs into.

use branchbox_core::Config as EngineConfig;
use std::time::Duration;

/// Settings of one branchboxd.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// The engine's configuration (data directory, runsc, agent, shim).
    pub engine: EngineConfig,
    /// Most sandboxes (running or paused) at once; more answer 503.
    pub max_sandboxes: usize,
    /// Largest JSON request body.
    pub max_json_bytes: usize,
    /// Largest file upload.
    pub max_upload_bytes: u64,
    /// Largest file download.
    pub max_download_bytes: u64,
    /// Most output bytes (stdout and stderr together) one command returns.
    pub max_output_bytes: u64,
    /// Sandbox timeout when the creator names none, seconds.
    pub default_timeout_s: u64,
    /// Longest sandbox timeout, seconds.
    pub max_timeout_s: u64,
    /// Longest command run time, seconds.
    pub max_exec_timeout_s: u64,
    /// Command run time when the caller names none, seconds.
    pub default_exec_timeout_s: u64,
    /// Time limit of every request that is not a command or a file stream.
    pub request_timeout: Duration,
    /// Require a bearer token (on unless explicitly turned off).
    pub auth: bool,
    /// How often the TTL task looks for expired sandboxes.
    pub ttl_tick: Duration,
    /// Longest a connection may take to send a request's headers (and longest an idle
    /// kept-alive connection is held); slower ones are closed.
    pub header_timeout: Duration,
    /// Most client connections at once; more are answered 503 and closed.
    pub max_connections: usize,
    /// Longest the agent of a sandbox may stay silent during a call (and a streamed download
    /// may wait for its client) before the call fails and its worker is freed.
    pub agent_stall: Duration,
    /// The address the service listens on, as written to `<data>/service/url`; it is part of
    /// the challenge proof, so a relay on another address cannot pass one on.
    pub listen: Option<String>,
    /// Host names accepted in the `Host` header besides IP addresses and `localhost`
    /// (any other name is how a DNS-rebinding page would reach the service).
    pub allowed_hosts: Vec<String>,
    /// The fleet's peers file (`--peers`): other nodes this one forwards requests to.
    pub peers: Option<std::path::PathBuf>,
    /// The snapshot store's settings from the flags (`--remote`, `--s3-endpoint`, ...); what
    /// they leave out is read from the environment at each push or pull (docs/remote.md).
    pub store: branchbox_chunks::s3::StoreSettings,
}

impl ServiceConfig {
    /// Defaults over an engine configuration.
    pub fn new(engine: EngineConfig) -> ServiceConfig {
        ServiceConfig {
            engine,
            max_sandboxes: 64,
            max_json_bytes: 1 << 20,
            max_upload_bytes: 512 << 20,
            max_download_bytes: 512 << 20,
            max_output_bytes: branchbox_protocol::MAX_EXEC_OUTPUT,
            default_timeout_s: 300,
            max_timeout_s: 24 * 3600,
            max_exec_timeout_s: 3600,
            default_exec_timeout_s: 60,
            request_timeout: Duration::from_secs(600),
            auth: true,
            ttl_tick: Duration::from_millis(500),
            header_timeout: Duration::from_secs(30),
            max_connections: 512,
            agent_stall: Duration::from_secs(60),
            listen: None,
            allowed_hosts: Vec::new(),
            peers: None,
            store: Default::default(),
        }
    }

    /// `<data>/service`, the service's own directory.
    pub fn service_dir(&self) -> std::path::PathBuf {
        self.engine.data_dir.join("service")
    }
}
