//! branchbox's sandboxes as Model Context Protocol tools, for agents that speak MCP: create,
//! run (with output), read and write files, fork, checkpoint, rollback, lineage, list and
//! kill. Built on rmcp; `branchbox mcp` serves them over stdio and branchboxd over streamable
//! HTTP at `/mcp` (docs/mcp.md).
//!
//! Every tool takes typed arguments (unknown fields refused, each bounded) and answers
//! structured JSON; a failure is a tool error whose text says what to do next, as the CLI's
//! errors do. Each call opens the engine over the configured data directory on a blocking
//! thread, so tools run side by side with the CLI and the service on the same sandboxes.

use base64::Engine as _;
use branchbox_core::{BackendChoice, Config, Engine};
use branchbox_model::{BackendKind, SandboxId};
use branchbox_protocol::limits::check_guest_path;
use branchbox_protocol::{Command, ExecSpec, OutStream};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{tool, tool_handler, tool_router, Json, ServerHandler, ServiceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Most bytes of a command's output returned (stdout and stderr together); the rest is
/// dropped and the result says `truncated`.
pub const MAX_OUTPUT: u64 = 1 << 20;
/// Most bytes of a file `read_file` returns.
pub const MAX_READ: u64 = 1 << 20;
/// Most bytes of a file `write_file` takes (after base64 decoding).
pub const MAX_WRITE: usize = 4 << 20;
/// A command's time limit when the call gives none, and the longest it may give.
const DEFAULT_TIMEOUT_S: u64 = 60;
const MAX_TIMEOUT_S: u64 = 3600;
/// Most environment variables one command may add.
const MAX_ENV: usize = 64;
/// Most children one fork may ask for here (the engine's own limit may be lower).
const MAX_FORK: usize = 16;

const INSTRUCTIONS: &str = "branchbox sandboxes: isolated Linux computers (Debian 12 with python3, pip, git, \
curl and node) that can be forked and rolled back. `create` one, `run` commands in it, `read_file`/`write_file`, \
`checkpoint` before a risky step and `rollback` to it if the step fails, or `fork` to try several paths at once \
from the same state; `lineage` shows the tree of snapshots and sandboxes; `kill` each sandbox when done.";

/// What the program serving the tools adds around the sandboxes they start and kill:
/// branchboxd holds its capacity limit and records its timeout; `branchbox mcp` adds nothing.
pub trait Host: Send + Sync + 'static {
    /// Called before `n` sandboxes start; an error refuses the call. What it returns (a
    /// reservation) is held until they are recorded.
    fn admit(&self, engine: &Engine, n: usize) -> anyhow::Result<Box<dyn std::any::Any>>;
    /// Called for each sandbox that started.
    fn started(&self, engine: &Engine, id: &SandboxId) -> anyhow::Result<()>;
    /// Called for each sandbox killed.
    fn killed(&self, engine: &Engine, id: &SandboxId);
}

/// The host of `branchbox mcp`: no limits beyond the engine's, no records beyond its own.
pub struct Local;

impl Host for Local {
    fn admit(&self, _: &Engine, _: usize) -> anyhow::Result<Box<dyn std::any::Any>> {
        Ok(Box::new(()))
    }
    fn started(&self, _: &Engine, _: &SandboxId) -> anyhow::Result<()> {
        Ok(())
    }
    fn killed(&self, _: &Engine, _: &SandboxId) {}
}

/// The tools, over one data directory.
#[derive(Clone)]
pub struct Sandboxes {
    cfg: Config,
    host: Arc<dyn Host>,
    tool_router: ToolRouter<Self>,
}

/// Arguments of `create`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateArgs {
    /// The image: "default" (when absent), "minimal" (python3 only), or one imported with
    /// `branchbox image import`.
    pub image: Option<String>,
    /// A template (`branchbox template ls`) to start from instead of an image.
    pub template: Option<String>,
    /// Give the sandbox the public internet (private ranges refused); without it the sandbox
    /// has no network.
    pub internet: Option<bool>,
}

/// A sandbox's id.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxArg {
    /// The sandbox's id (`sbx-` and 16 hex digits), as `create` or `fork` returned it.
    pub sandbox_id: String,
}

/// Arguments of `run`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunArgs {
    /// The sandbox.
    pub sandbox_id: String,
    /// A shell command line (run by /bin/sh -c, as root).
    pub command: String,
    /// Seconds before the command's whole process group is killed (default 60, at most 3600).
    pub timeout_s: Option<u64>,
    /// Working directory (absolute; `/` when absent).
    pub cwd: Option<String>,
    /// Environment variables to add (at most 64).
    pub env: Option<BTreeMap<String, String>>,
}

/// What a command did.
#[derive(Debug, Serialize, JsonSchema)]
pub struct RunResult {
    /// Its exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// It ran past its timeout and was killed.
    pub timed_out: bool,
    /// A process of it was killed because the sandbox reached its memory limit.
    pub oom_killed: bool,
    /// Standard output (UTF-8, invalid bytes replaced).
    pub stdout: String,
    /// Standard error (UTF-8, invalid bytes replaced).
    pub stderr: String,
    /// Output past 1 MiB was dropped.
    pub truncated: bool,
    /// The checkpoint taken after it, in step-history mode.
    pub checkpoint: Option<String>,
}

/// Arguments of `read_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadArgs {
    /// The sandbox.
    pub sandbox_id: String,
    /// Absolute path of the file.
    pub path: String,
}

/// A file's content.
#[derive(Debug, Serialize, JsonSchema)]
pub struct FileContent {
    /// The path read.
    pub path: String,
    /// "utf-8" when the file is text, else "base64".
    pub encoding: String,
    /// The content, in that encoding.
    pub content: String,
    /// Its size in bytes.
    pub size: u64,
}

/// Arguments of `write_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteArgs {
    /// The sandbox.
    pub sandbox_id: String,
    /// Absolute path; missing parent directories are made.
    pub path: String,
    /// The content: text, or base64 with `base64: true` (at most 4 MiB).
    pub content: String,
    /// `content` is base64.
    pub base64: Option<bool>,
}

/// A file written.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Written {
    /// The path written.
    pub path: String,
    /// Bytes written.
    pub size: u64,
}

/// Arguments of `fork`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkArgs {
    /// The sandbox to fork; it keeps running.
    pub sandbox_id: String,
    /// How many children (1 to 16; default 1).
    pub count: Option<usize>,
}

/// One child of a fork.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Child {
    /// The child's id, when it started.
    pub sandbox_id: Option<String>,
    /// Why it did not, when it did not.
    pub error: Option<String>,
}

/// What a fork made.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Forked {
    /// The fork point: a snapshot of the source at the fork's instant.
    pub fork_point: String,
    /// One entry per child asked for.
    pub children: Vec<Child>,
}

/// Arguments of `checkpoint`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointArgs {
    /// The sandbox; it keeps running.
    pub sandbox_id: String,
    /// A name to find it by later (letters, digits, `.`, `_`, `-`).
    pub name: Option<String>,
}

/// A snapshot taken or returned to.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SnapshotRef {
    /// The sandbox.
    pub sandbox_id: String,
    /// The snapshot's id.
    pub snapshot_id: String,
}

/// Arguments of `rollback`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RollbackArgs {
    /// The sandbox; it keeps its id.
    pub sandbox_id: String,
    /// One of its checkpoints: the id `checkpoint` returned, or its name.
    pub snapshot: String,
}

/// Arguments of `lineage`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LineageArgs {
    /// Only the tree this sandbox is in (all trees when absent).
    pub sandbox_id: Option<String>,
}

/// The lineage: trees of snapshots with the sandboxes started from them.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Lineage {
    /// The roots, each with its `children`.
    pub trees: Vec<serde_json::Value>,
}

/// One sandbox in a listing.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Listed {
    /// Its id.
    pub sandbox_id: String,
    /// "running", "paused" or "lost".
    pub state: String,
    /// True when its runtime answers.
    pub alive: bool,
    /// The snapshot it started from, or its last checkpoint.
    pub parent_snapshot: Option<String>,
}

/// The sandboxes.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Listing {
    /// Every sandbox, oldest first.
    pub sandboxes: Vec<Listed>,
}

/// A sandbox made or removed.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SandboxDone {
    /// Its id.
    pub sandbox_id: String,
}

/// A tool's answer: structured on success, a message to act on otherwise.
type Answer<T> = Result<Json<T>, String>;

fn parse_id(s: &str) -> Result<SandboxId, String> {
    SandboxId::parse(s).map_err(|e| format!("{e}; `list` shows the sandboxes"))
}

#[tool_router]
impl Sandboxes {
    /// The tools over the data directory and settings of `cfg`, served by `host`.
    pub fn new(cfg: Config, host: Arc<dyn Host>) -> Self {
        Sandboxes { cfg, host, tool_router: Self::tool_router() }
    }

    /// Runs `f` with an engine (and the host) on a blocking thread; its error becomes the
    /// tool's message.
    async fn engine<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Engine, &dyn Host) -> anyhow::Result<T> + Send + 'static,
    ) -> Result<T, String> {
        let (cfg, host) = (self.cfg.clone(), self.host.clone());
        tokio::task::spawn_blocking(move || f(&Engine::open(cfg)?, host.as_ref()))
            .await
            .map_err(|e| format!("the call failed inside the server ({e}); nothing was reported done"))?
            .map_err(|e| format!("{e:#}"))
    }

    #[tool(
        description = "Create and start a sandbox: a Linux computer of its own (Debian 12 with python3, pip, \
        git, curl and node in the default image). Returns its sandbox_id; kill it when done."
    )]
    async fn create(&self, Parameters(a): Parameters<CreateArgs>) -> Answer<SandboxDone> {
        if a.template.is_some() && (a.image.is_some() || a.internet.is_some()) {
            return Err("a template brings its own image and network; give template alone".into());
        }
        let s = self
            .engine(move |e, host| {
                let _held = host.admit(e, 1)?;
                let s = match &a.template {
                    Some(t) => e.create_from_template(t)?.sandbox,
                    None => {
                        let image = a.image.as_deref().unwrap_or(branchbox_core::DEFAULT_IMAGE);
                        let (choice, net) = match a.internet {
                            Some(true) => (
                                BackendChoice::Exactly(BackendKind::Gvisor),
                                Some(branchbox_net::Egress::Internet),
                            ),
                            _ => (BackendChoice::Auto, None),
                        };
                        e.create_networked(choice, None, image, net, &mut |_| {})?
                    }
                };
                host.started(e, &s.id)?;
                Ok(s)
            })
            .await?;
        Ok(Json(SandboxDone { sandbox_id: s.id.to_string() }))
    }

    #[tool(description = "Run a shell command in a sandbox and return its exit code, stdout and stderr \
        (at most 1 MiB of output). The command runs as root; its whole process group is killed at its timeout.")]
    async fn run(&self, Parameters(a): Parameters<RunArgs>) -> Answer<RunResult> {
        let id = parse_id(&a.sandbox_id)?;
        let timeout = a.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S);
        if timeout == 0 || timeout > MAX_TIMEOUT_S {
            return Err(format!("timeout_s {timeout} is out of range: give 1 to {MAX_TIMEOUT_S}"));
        }
        let env = a.env.unwrap_or_default();
        if env.len() > MAX_ENV {
            return Err(format!("{} environment variables given; at most {MAX_ENV}", env.len()));
        }
        if let Some(cwd) = &a.cwd {
            check_guest_path(cwd)?;
        }
        let mut spec = ExecSpec::new(Command::Shell(a.command));
        spec.env = env;
        spec.cwd = a.cwd;
        spec.timeout_ms = Some(timeout * 1000);
        spec.output_cap = Some(MAX_OUTPUT);
        let (status, out, err, checkpoint) = self
            .engine(move |e, _| {
                let (mut out, mut err) = (Vec::new(), Vec::new());
                let (status, checkpoint) = e.exec(&id, spec, None, &mut |stream, data| match stream {
                    OutStream::Stdout => out.extend_from_slice(data),
                    OutStream::Stderr => err.extend_from_slice(data),
                })?;
                Ok((status, out, err, checkpoint))
            })
            .await?;
        Ok(Json(RunResult {
            exit_code: status.code,
            signal: status.signal,
            timed_out: status.timed_out,
            oom_killed: status.oom_killed,
            stdout: String::from_utf8_lossy(&out).into_owned(),
            stderr: String::from_utf8_lossy(&err).into_owned(),
            truncated: status.truncated,
            checkpoint: checkpoint.map(|c| c.id.to_string()),
        }))
    }

    #[tool(description = "Read a file of a sandbox (at most 1 MiB): text as UTF-8, anything else as base64.")]
    async fn read_file(&self, Parameters(a): Parameters<ReadArgs>) -> Answer<FileContent> {
        let id = parse_id(&a.sandbox_id)?;
        check_guest_path(&a.path)?;
        let path = a.path.clone();
        let bytes = self.engine(move |e, _| Ok(e.connect(&id)?.read_file_bytes(&path, MAX_READ)?)).await?;
        let size = bytes.len() as u64;
        let (encoding, content) = match String::from_utf8(bytes) {
            Ok(text) => ("utf-8", text),
            Err(e) => ("base64", base64::engine::general_purpose::STANDARD.encode(e.into_bytes())),
        };
        Ok(Json(FileContent { path: a.path, encoding: encoding.into(), content, size }))
    }

    #[tool(description = "Write a file in a sandbox (text, or base64 with base64: true; at most 4 MiB), \
        replacing it atomically and making missing parent directories.")]
    async fn write_file(&self, Parameters(a): Parameters<WriteArgs>) -> Answer<Written> {
        let id = parse_id(&a.sandbox_id)?;
        check_guest_path(&a.path)?;
        let data = if a.base64.unwrap_or(false) {
            base64::engine::general_purpose::STANDARD
                .decode(a.content.as_bytes())
                .map_err(|e| format!("content is not base64 ({e}); send text with base64 false"))?
        } else {
            a.content.into_bytes()
        };
        if data.len() > MAX_WRITE {
            return Err(format!("{} bytes given; write_file takes at most {MAX_WRITE}", data.len()));
        }
        let path = a.path.clone();
        let size = self
            .engine(move |e, _| {
                Ok(e.connect(&id)?.write_file(&path, &mut data.as_slice(), None, false, true)?)
            })
            .await?;
        Ok(Json(Written { path: a.path, size }))
    }

    #[tool(
        description = "Fork a running sandbox into children that continue from its exact state (processes, \
        memory, files); the source keeps running. Each child is a sandbox of its own: try a different path in each."
    )]
    async fn fork(&self, Parameters(a): Parameters<ForkArgs>) -> Answer<Forked> {
        let id = parse_id(&a.sandbox_id)?;
        let count = a.count.unwrap_or(1);
        if count == 0 || count > MAX_FORK {
            return Err(format!("count {count} is out of range: give 1 to {MAX_FORK}"));
        }
        let out = self
            .engine(move |e, host| {
                let _held = host.admit(e, count)?;
                let out = e.fork(&id, count)?;
                let children = out
                    .children
                    .into_iter()
                    .map(|c| {
                        match c.map_err(anyhow::Error::from).and_then(|s| {
                            host.started(e, &s.sandbox.id)?;
                            Ok(s)
                        }) {
                            Ok(s) => Child { sandbox_id: Some(s.sandbox.id.to_string()), error: None },
                            Err(err) => Child { sandbox_id: None, error: Some(format!("{err:#}")) },
                        }
                    })
                    .collect::<Vec<_>>();
                Ok((out.snapshot, children))
            })
            .await?;
        let (snapshot, children) = out;
        Ok(Json(Forked { fork_point: snapshot.id.to_string(), children }))
    }

    #[tool(
        description = "Checkpoint a sandbox: freeze its whole state (files, memory, processes) so `rollback` \
        can return to it; the sandbox keeps running."
    )]
    async fn checkpoint(&self, Parameters(a): Parameters<CheckpointArgs>) -> Answer<SnapshotRef> {
        let id = parse_id(&a.sandbox_id)?;
        let snap = self.engine(move |e, _| Ok(e.checkpoint(&id, a.name.as_deref())?)).await?;
        Ok(Json(SnapshotRef { sandbox_id: a.sandbox_id, snapshot_id: snap.id.to_string() }))
    }

    #[tool(
        description = "Roll a sandbox back to one of its checkpoints: files, memory and processes return \
        to that instant; the sandbox keeps its id."
    )]
    async fn rollback(&self, Parameters(a): Parameters<RollbackArgs>) -> Answer<SnapshotRef> {
        let id = parse_id(&a.sandbox_id)?;
        let snap = self.engine(move |e, _| Ok(e.rollback(&id, &a.snapshot)?)).await?;
        Ok(Json(SnapshotRef { sandbox_id: a.sandbox_id, snapshot_id: snap.id.to_string() }))
    }

    #[tool(description = "The lineage: trees of snapshots, checkpoints and fork points with the sandboxes \
        started from them; with sandbox_id, only that sandbox's tree.")]
    async fn lineage(&self, Parameters(a): Parameters<LineageArgs>) -> Answer<Lineage> {
        let only = a.sandbox_id.as_deref().map(parse_id).transpose()?;
        let nodes = self.engine(|e, _| Ok(e.lineage()?)).await?;
        let mut trees = nodes
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("the lineage could not be encoded: {e}"))?;
        if let Some(id) = only {
            trees.retain(|t| mentions(t, id.as_str()));
            if trees.is_empty() {
                return Err(format!("sandbox {id} is in no lineage: `list` shows the sandboxes"));
            }
        }
        Ok(Json(Lineage { trees }))
    }

    #[tool(description = "List the sandboxes with their state.")]
    async fn list(&self) -> Answer<Listing> {
        let views = self.engine(|e, _| Ok(e.list()?)).await?;
        let sandboxes = views
            .into_iter()
            .map(|v| Listed {
                sandbox_id: v.sandbox.id.to_string(),
                state: format!("{:?}", v.sandbox.state).to_lowercase(),
                alive: v.alive,
                parent_snapshot: v.sandbox.parent_snapshot.map(|p| p.to_string()),
            })
            .collect();
        Ok(Json(Listing { sandboxes }))
    }

    #[tool(description = "Kill a sandbox and remove everything it had; its snapshots stay.")]
    async fn kill(&self, Parameters(a): Parameters<SandboxArg>) -> Answer<SandboxDone> {
        let id = parse_id(&a.sandbox_id)?;
        self.engine(move |e, host| {
            e.kill(&id)?;
            host.killed(e, &id);
            Ok(())
        })
        .await?;
        Ok(Json(SandboxDone { sandbox_id: a.sandbox_id }))
    }
}

/// True when `id` is an `id` anywhere in the tree `node`.
fn mentions(node: &serde_json::Value, id: &str) -> bool {
    node.get("id").and_then(|v| v.as_str()) == Some(id)
        || node.get("children").and_then(|c| c.as_array()).is_some_and(|c| c.iter().any(|n| mentions(n, id)))
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Sandboxes {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("branchbox", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }
}

/// The tools as MCP's streamable HTTP transport, a tower service to route at one path:
/// stateless (no sessions; each POST answered with JSON), the `Host` header left to the
/// caller's own checks (branchboxd's guard), authentication too.
pub fn http_service(
    cfg: Config,
    host: Arc<dyn Host>,
) -> StreamableHttpService<Sandboxes, LocalSessionManager> {
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .disable_allowed_hosts();
    StreamableHttpService::new(
        move || Ok(Sandboxes::new(cfg.clone(), host.clone())),
        Default::default(),
        config,
    )
}

/// Serves the tools over this process's stdin and stdout until the client closes stdin, on
/// a runtime of its own.
pub fn serve_stdio(cfg: Config) -> anyhow::Result<()> {
    tokio::runtime::Runtime::new()?.block_on(async {
        let running = Sandboxes::new(cfg, Arc::new(Local)).serve(rmcp::transport::stdio()).await?;
        running.waiting().await?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_typed_and_unknown_fields_refused() {
        let ok: RunArgs =
            serde_json::from_str(r#"{"sandbox_id":"sbx-0123456789abcdef","command":"true"}"#).unwrap();
        assert_eq!(ok.command, "true");
        assert!(
            serde_json::from_str::<RunArgs>(r#"{"sandbox_id":"x","command":"true","sudo":true}"#).is_err()
        );
        assert!(serde_json::from_str::<ForkArgs>(r#"{"sandbox_id":"x","count":-1}"#).is_err());
        assert!(serde_json::from_str::<CreateArgs>(r#"{"image":7}"#).is_err());
    }

    #[test]
    fn ids_are_checked_before_anything_runs() {
        assert!(parse_id("sbx-0123456789abcdef").is_ok());
        assert!(parse_id("../etc").unwrap_err().contains("`list`"));
    }

    #[test]
    fn a_tree_mentions_the_sandboxes_under_it() {
        let tree = serde_json::json!({"id": "snap-1", "children": [{"id": "snap-2", "children": [{"id": "sbx-3"}]}]});
        assert!(mentions(&tree, "sbx-3") && mentions(&tree, "snap-1"));
        assert!(!mentions(&tree, "sbx-4"));
    }
}
