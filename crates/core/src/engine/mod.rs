//! The engine: sandboxes, snapshots and forks, composed from a backend, the image cache and
//! the metadata store. The CLI and the service are thin layers over this type.

use crate::config::Config;
use crate::host;
use branchbox_gvisor::GvisorBackend;
use branchbox_image::{resolve_image, Image};
use branchbox_microvm::MicrovmBackend;
use branchbox_model::{
    check_snapshot_ref, now_ms, AgentConn, Backend, BackendKind, Error, Limits, Name, Result, Sandbox,
    SandboxId, SandboxPlan, SandboxState, Snapshot, SnapshotId, SnapshotKind,
};
use branchbox_protocol::{ExecSpec, ExitStatus, HookReport, OutStream};
use branchbox_store::Store;
use serde::Serialize;
use std::path::{Path, PathBuf};

mod create;
mod flag;
mod lock;
mod network;
mod records;
mod recover;
mod remote;
mod shells;
mod storage;
mod template;
mod timeline;

pub use branchbox_model::ShellInfo;
pub use lock::DataLock;
pub use recover::{LostSandbox, ReconcileReport};
pub use storage::FileAt;
pub use template::{BuildEvent, Built, StepRecord, Template, TemplateStatus};
pub use timeline::{command_text, TimelineEntry};

/// Which backend a new sandbox should use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// gvisor for now: microvm sandboxes cannot be snapshotted or forked yet (see
    /// [`host::auto_backend`]).
    #[default]
    Auto,
    /// This one.
    Exactly(BackendKind),
}

/// A sandbox with its liveness as observed now.
#[derive(Debug, Clone, Serialize)]
pub struct SandboxView {
    /// The record.
    #[serde(flatten)]
    pub sandbox: Sandbox,
    /// True when its runtime answers.
    pub alive: bool,
    /// Why its runtime is gone, when it is (`memory_limit: ...`, `runtime gone`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost_reason: Option<String>,
    /// The host limit its answers broke, when they did (a sign of forged agent frames).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flagged: Option<String>,
}

/// A started child of a fork or restore.
#[derive(Debug, Clone, Serialize)]
pub struct Started {
    /// The new sandbox.
    pub sandbox: Sandbox,
    /// What the after-fork hook did inside it.
    pub hook: HookReport,
}

/// The outcome of `fork`.
#[derive(Debug)]
pub struct ForkOutcome {
    /// The fork point the children start from.
    pub snapshot: Snapshot,
    /// One result per child, in order.
    pub children: Vec<Result<Started>>,
}

/// An agent's refusal keeps its meaning: a bad command is the caller's error, not the backend's.
fn agent_error(e: branchbox_protocol::ClientError) -> Error {
    use branchbox_protocol::{ClientError, ErrorCode};
    match e {
        ClientError::Agent { code: ErrorCode::BadRequest | ErrorCode::SpawnFailed, message } => {
            Error::InvalidInput(message)
        }
        ClientError::Agent { code: ErrorCode::NotFound, message } => Error::InvalidInput(message),
        // Nothing was sent: the caller's command is too long.
        e @ ClientError::RequestTooLarge { .. } => Error::InvalidInput(e.to_string()),
        // The sandbox broke a limit the host enforces, or stopped answering.
        e @ (ClientError::LimitExceeded { .. } | ClientError::Timeout { .. }) => {
            Error::Backend(format!("sandbox: {e}"))
        }
        other => Error::Backend(other.to_string()),
    }
}

/// How to take a snapshot.
#[derive(Debug, Clone, Copy)]
pub struct SnapshotOptions<'a> {
    /// Why it is taken.
    pub kind: SnapshotKind,
    /// Optional unique name.
    pub name: Option<&'a str>,
    /// Garbage-collect it after this long (`branchbox gc`).
    pub ttl: Option<std::time::Duration>,
}

/// The branchbox engine over one data directory.
pub struct Engine {
    cfg: Config,
    store: Store,
    gvisor: GvisorBackend,
    /// Located on first use (finding the kernel asks dpkg), or why it cannot be.
    microvm: std::sync::OnceLock<std::result::Result<MicrovmBackend, String>>,
}

/// Creates `dir` and any missing parents with mode 0700 whatever the umask: the data directory
/// holds checkpoint images (a sandbox's memory) and secrets. An existing directory keeps its
/// mode; `branchbox doctor` reports one that others can read.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

fn check_writable(dir: &Path) -> Result<()> {
    let fail = |e: std::io::Error| {
        Error::Unavailable(format!(
            "the data directory {} is not writable ({e}); choose another with --data-dir or BRANCHBOX_DATA",
            dir.display()
        ))
    };
    private_dir(dir).map_err(fail)?;
    // Unique per call: engines may be opened on several threads of one process at once.
    let probe = dir.join(format!(".probe-{}-{:016x}", std::process::id(), rand::random::<u64>()));
    std::fs::write(&probe, b"ok").map_err(fail)?;
    std::fs::remove_file(&probe).map_err(fail)
}

impl Engine {
    /// Opens the data directory (creating it), failing clearly when it is not writable.
    pub fn open(cfg: Config) -> Result<Engine> {
        check_writable(&cfg.data_dir)?;
        for sub in ["sandboxes", "snapshots", "runsc"] {
            let d = cfg.data_dir.join(sub);
            private_dir(&d).map_err(|e| Error::io(&d, e))?;
        }
        let store = Store::open(&cfg.data_dir.join("meta.db"))?;
        let gvisor = GvisorBackend::new(cfg.runsc.clone(), cfg.data_dir.join("runsc"), cfg.shim.clone())
            .with_shells(cfg.data_dir.join("shells"), cfg.data_dir.join("sandboxes"));
        Ok(Engine { cfg, store, gvisor, microvm: std::sync::OnceLock::new() })
    }

    /// Held by `gc` while it runs: waits for operations in progress and holds off new ones.
    pub fn exclusive(&self) -> Result<DataLock> {
        DataLock::take(&self.cfg.data_dir, true)
    }

    fn in_progress(&self) -> Result<DataLock> {
        DataLock::take(&self.cfg.data_dir, false)
    }

    /// The configuration in use.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The gvisor backend (for `doctor`).
    pub fn gvisor(&self) -> &GvisorBackend {
        &self.gvisor
    }

    fn backend(&self, kind: BackendKind) -> Result<&dyn Backend> {
        match kind {
            BackendKind::Gvisor => Ok(&self.gvisor),
            BackendKind::Microvm => {
                if let Some(why) = host::linux_microvm_blocker(&host::detect_kvm()) {
                    return Err(Error::Unavailable(format!(
                        "the microvm backend cannot run Linux sandboxes on this host: {why}; use --backend gvisor \
                         (`branchbox doctor` explains)"
                    )));
                }
                let located = self.microvm.get_or_init(|| {
                    MicrovmBackend::locate(
                        branchbox_microvm::default_vmm_program(),
                        self.cfg.images_dir.clone(),
                        self.cfg.agent.clone(),
                    )
                    .map_err(|e| e.to_string())
                });
                match located {
                    Ok(b) => Ok(b),
                    Err(why) => Err(Error::Unavailable(format!("the microvm backend cannot start: {why}"))),
                }
            }
        }
    }

    fn resolve(&self, choice: BackendChoice) -> BackendKind {
        match choice {
            BackendChoice::Exactly(k) => k,
            BackendChoice::Auto => host::auto_backend(&host::detect_kvm()).0,
        }
    }

    fn sandbox_dir(&self, id: &SandboxId) -> PathBuf {
        self.cfg.data_dir.join("sandboxes").join(id.as_str())
    }

    fn snapshot_dir(&self, id: &SnapshotId) -> PathBuf {
        self.cfg.data_dir.join("snapshots").join(id.as_str())
    }

    fn image_rootfs(&self, image: &str) -> Result<PathBuf> {
        let rootfs = self.cfg.images_dir.join(image).join("rootfs");
        if !rootfs.is_dir() {
            return Err(Error::not_found(
                "image",
                image,
                "it was removed from the image cache; rebuild with `branchbox image build NAME`",
            ));
        }
        Ok(rootfs)
    }

    /// Builds (or finds in the cache) the image `name` (built-in or imported) with the current
    /// agent.
    pub fn build_image(&self, name: &str, progress: &mut dyn FnMut(&str)) -> Result<Image> {
        resolve_image(&self.cfg.images_dir, name, &self.cfg.agent, &self.cfg.mirror, progress)
    }

    fn plan(&self, id: SandboxId, rootfs: PathBuf, limits: Limits) -> SandboxPlan {
        let hostname = format!("bb-{}", &id.as_str()[4..12]);
        SandboxPlan { dir: self.sandbox_dir(&id), id, rootfs, limits, hostname, network: None }
    }

    /// One sandbox's record.
    pub fn sandbox(&self, id: &SandboxId) -> Result<Sandbox> {
        self.store.sandbox(id)
    }

    /// Every sandbox with its liveness.
    pub fn list(&self) -> Result<Vec<SandboxView>> {
        let all = self.store.sandboxes()?;
        let recorded = self.store.lost_reasons()?;
        Ok(all
            .into_iter()
            .map(|s| {
                let alive =
                    self.backend(s.backend).map(|b| b.is_alive(&self.sandbox_dir(&s.id))).unwrap_or(false);
                let mut sandbox = s;
                let mut lost_reason = None;
                if alive && sandbox.state == SandboxState::Lost {
                    // Its runtime answers after all (it was marked lost while unreachable).
                    sandbox.state = SandboxState::Running;
                } else if !alive {
                    sandbox.state = SandboxState::Lost;
                    lost_reason = Some(
                        recorded
                            .get(sandbox.id.as_str())
                            .cloned()
                            .unwrap_or_else(|| records::end_reason(&self.sandbox_dir(&sandbox.id))),
                    );
                }
                let flagged = flag::read(&self.sandbox_dir(&sandbox.id));
                SandboxView { sandbox, alive, lost_reason, flagged }
            })
            .collect())
    }

    fn running(&self, id: &SandboxId) -> Result<(Sandbox, &dyn Backend)> {
        let s = self.store.sandbox(id)?;
        let backend = self.backend(s.backend)?;
        match s.state {
            SandboxState::Paused => {
                Err(Error::Conflict(format!("sandbox {id} is paused; `branchbox resume {id}` first")))
            }
            _ if !backend.is_alive(&self.sandbox_dir(id)) => Err(Error::Conflict(format!(
                "sandbox {id} is not running any more (its runtime is gone); `branchbox kill {id}` removes it"
            ))),
            _ => Ok((s, backend)),
        }
    }

    /// A connection to a running sandbox's agent.
    /// A violation of a host limit on it flags the sandbox.
    pub fn connect(&self, id: &SandboxId) -> Result<AgentConn> {
        let (_, backend) = self.running(id)?;
        let dir = self.sandbox_dir(id);
        let mut conn = backend.connect(&dir)?;
        conn.on_violation(flag::hook(id.clone(), dir, self.cfg.data_dir.join("audit.log")));
        Ok(conn)
    }

    /// Pauses a running sandbox.
    pub fn pause(&self, id: &SandboxId) -> Result<()> {
        let (_, backend) = self.running(id)?;
        backend.pause(&self.sandbox_dir(id))?;
        self.store.set_state(id, SandboxState::Paused)
    }

    /// Resumes a paused sandbox.
    pub fn resume(&self, id: &SandboxId) -> Result<()> {
        let s = self.store.sandbox(id)?;
        if s.state != SandboxState::Paused {
            return Err(Error::Conflict(format!("sandbox {id} is not paused")));
        }
        self.backend(s.backend)?.resume(&self.sandbox_dir(id))?;
        self.store.set_state(id, SandboxState::Running)
    }

    fn check_name(&self, name: Option<&str>) -> Result<()> {
        if let Some(n) = name {
            Name::parse("snapshot name", n)?;
            if self.store.snapshot_name_taken(n)? {
                return Err(Error::Conflict(format!(
                    "a snapshot named {n:?} exists already; choose another name"
                )));
            }
        }
        Ok(())
    }

    fn snapshot_record(
        &self,
        id: SnapshotId,
        s: &Sandbox,
        opts: &SnapshotOptions<'_>,
        size: u64,
    ) -> Snapshot {
        let SnapshotOptions { kind, name, ttl } = *opts;
        Snapshot {
            id,
            parent: s.parent_snapshot.clone(),
            source: Some(s.id.clone()),
            backend: s.backend,
            image: s.image.clone(),
            kind,
            name: name.map(str::to_string),
            created_ms: now_ms(),
            size_bytes: size,
            limits: s.limits,
            expires_ms: ttl.map(|t| now_ms().saturating_add(t.as_millis() as i64)),
            deleted_ms: None,
        }
    }

    /// Captures a running sandbox's full state; the sandbox keeps running. The snapshot is
    /// recorded only once its files are complete, and becomes the sandbox's lineage parent.
    pub fn snapshot(&self, id: &SandboxId, opts: &SnapshotOptions<'_>) -> Result<Snapshot> {
        let _busy = self.in_progress()?;
        let name = opts.name;
        self.check_name(name)?;
        let (s, backend) = self.running(id)?;
        let snap_id = SnapshotId::generate();
        let dir = self.snapshot_dir(&snap_id);
        let size = match backend.snapshot(&self.sandbox_dir(id), &dir) {
            Ok(size) => size,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let snap = self.snapshot_record(snap_id, &s, opts, size);
        self.record_snapshot(id, &snap)?;
        Ok(snap)
    }

    /// A checkpoint of a running sandbox, for a later [`Engine::rollback`].
    pub fn checkpoint(&self, id: &SandboxId, name: Option<&str>) -> Result<Snapshot> {
        self.snapshot(id, &SnapshotOptions { kind: SnapshotKind::Checkpoint, name, ttl: None })
    }

    /// Returns a running sandbox, in place and under the same id, to a snapshot taken of it.
    /// On failure the sandbox keeps running as it was.
    pub fn rollback(&self, id: &SandboxId, snapshot: &str) -> Result<Snapshot> {
        let _busy = self.in_progress()?;
        let snap = self.usable_snapshot(snapshot)?;
        if snap.source.as_ref() != Some(id) {
            return Err(Error::Conflict(format!(
                "snapshot {} was taken of {}, not of {id}; `branchbox restore {}` starts it as a new sandbox",
                snap.id,
                snap.source.as_ref().map(|s| s.as_str()).unwrap_or("no sandbox"),
                snap.id
            )));
        }
        let (_, backend) = self.running(id)?;
        backend.rollback(&self.sandbox_dir(id), &self.snapshot_dir(&snap.id))?;
        self.store.set_parent(id, &snap.id)?;
        Ok(snap)
    }

    /// Turns step-history mode on or off: with it on, every [`Engine::exec`] ends with a checkpoint.
    pub fn set_history(&self, id: &SandboxId, on: bool) -> Result<()> {
        self.store.sandbox(id)?;
        self.store.set_history(id, on)
    }

    /// Runs a command, streaming its output; in step-history mode, checkpoints afterwards and
    /// returns that checkpoint too.
    pub fn exec(
        &self,
        id: &SandboxId,
        spec: ExecSpec,
        stdin: Option<&mut dyn std::io::Read>,
        on_output: &mut dyn FnMut(OutStream, &[u8]),
    ) -> Result<(ExitStatus, Option<Snapshot>)> {
        let spec = self.with_exec_defaults(id, spec)?;
        let cmd = spec.cmd.clone();
        let mut conn = self.connect(id)?;
        let status = conn.exec_streaming(spec, stdin, on_output).map_err(agent_error)?;
        drop(conn);
        let step = self.after_exec(id, &cmd, &status)?;
        Ok((status, step))
    }

    /// What must follow every command: in step-history mode, a checkpoint (returned), with
    /// the command and how it ended recorded as the checkpoint's step ([`Engine::timeline`]).
    /// Callers that talk to the agent directly (the service) call this after each command.
    pub fn after_exec(
        &self,
        id: &SandboxId,
        cmd: &branchbox_protocol::Command,
        status: &ExitStatus,
    ) -> Result<Option<Snapshot>> {
        if !self.store.sandbox(id)?.history {
            return Ok(None);
        }
        let ended_ms = now_ms();
        let snap = self.checkpoint(id, None)?;
        self.store.insert_step(&branchbox_store::ExecStep {
            snapshot: snap.id.clone(),
            sandbox: id.clone(),
            command: command_text(cmd),
            exit_code: status.code,
            signal: status.signal,
            duration_ms: status.duration_ms,
            ended_ms,
        })?;
        Ok(Some(snap))
    }

    /// A snapshot by id, name or ref, after checking the reference against the naming rule.
    fn lookup(&self, id_or_name: &str) -> Result<Snapshot> {
        check_snapshot_ref(id_or_name)?;
        self.store.snapshot(id_or_name)
    }

    fn usable_snapshot(&self, id_or_name: &str) -> Result<Snapshot> {
        let snap = self.lookup(id_or_name)?;
        if snap.deleted_ms.is_some() {
            return Err(Error::Conflict(format!(
                "snapshot {} was deleted (only its place in the lineage remains)",
                snap.id
            )));
        }
        Ok(snap)
    }

    /// Every snapshot.
    pub fn snapshots(&self) -> Result<Vec<Snapshot>> {
        self.store.snapshots()
    }

    /// A snapshot by id or name.
    pub fn find_snapshot(&self, id_or_name: &str) -> Result<Snapshot> {
        self.lookup(id_or_name)
    }

    /// Starts a new sandbox from a snapshot.
    pub fn restore(&self, id_or_name: &str) -> Result<Started> {
        let _busy = self.in_progress()?;
        let snap = self.usable_snapshot(id_or_name)?;
        let backend = self.backend(snap.backend)?;
        let rootfs = self.image_rootfs(&snap.image)?;
        let plan = self.plan(SandboxId::generate(), rootfs, snap.limits);
        records::write_intent(&plan.dir, &snap)?;
        let hook = match backend.restore(&self.snapshot_dir(&snap.id), &plan) {
            Ok(h) => h,
            Err(e) => {
                let _ = backend.destroy(&plan.id, &plan.dir);
                return Err(e);
            }
        };
        Ok(Started { sandbox: self.record_child(plan.id, &snap)?, hook })
    }

    /// Records a snapshot taken of sandbox `source`: it becomes the sandbox's lineage parent
    /// and keeps its exec defaults.
    fn record_snapshot(&self, source: &SandboxId, snap: &Snapshot) -> Result<()> {
        self.store.insert_snapshot(snap)?;
        self.store.set_parent(source, &snap.id)?;
        self.defaults_to_snapshot(source, &snap.id)
    }

    /// Records sandbox `id`, started from `snap`, with the snapshot's exec defaults.
    fn record_child(&self, id: SandboxId, snap: &Snapshot) -> Result<Sandbox> {
        let sandbox = self.child_record(id, snap);
        self.store.insert_sandbox(&sandbox)?;
        self.defaults_to_child(&snap.id, &sandbox.id)?;
        Ok(sandbox)
    }

    fn child_record(&self, id: SandboxId, snap: &Snapshot) -> Sandbox {
        Sandbox {
            id,
            backend: snap.backend,
            image: snap.image.clone(),
            state: SandboxState::Running,
            created_ms: now_ms(),
            parent_snapshot: Some(snap.id.clone()),
            limits: snap.limits,
            history: false,
        }
    }

    /// Forks `n` children from a running sandbox's current state; the source keeps running.
    pub fn fork(&self, id: &SandboxId, n: usize) -> Result<ForkOutcome> {
        let _busy = self.in_progress()?;
        if n == 0 || n > self.cfg.max_fork {
            return Err(Error::InvalidInput(format!(
                "fork count {n} is out of range: ask for 1 to {} children (BRANCHBOX_MAX_FORK raises the limit)",
                self.cfg.max_fork
            )));
        }
        let (s, backend) = self.running(id)?;
        let rootfs = self.image_rootfs(&s.image)?;
        let shell_key = self.shell_key(&s, &rootfs)?;
        let mut ids = shell_key.as_ref().map(|(shells, k)| shells.claim(k, n)).unwrap_or_default();
        let claimed = ids.len();
        ids.resize_with(n, SandboxId::generate);
        let plans: Vec<SandboxPlan> =
            ids.into_iter().map(|c| self.plan(c, rootfs.clone(), s.limits)).collect();
        let snap_id = SnapshotId::generate();
        let dir = self.snapshot_dir(&snap_id);
        let opts = SnapshotOptions { kind: SnapshotKind::ForkPoint, name: None, ttl: None };
        // Each child carries the fork point's record-to-be, so a child that a crash leaves
        // unrecorded can be adopted (see `recover`).
        let pending = self.snapshot_record(snap_id, &s, &opts, 0);
        let forked = plans
            .iter()
            .try_for_each(|p| records::write_intent(&p.dir, &pending))
            .and_then(|()| backend.fork(&self.sandbox_dir(id), &dir, &plans));
        let (size, results) = match forked {
            Ok(r) => r,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                for (i, p) in plans.iter().enumerate() {
                    if i < claimed {
                        // A claimed shell runs: end it, not only its directory.
                        let _ = backend.destroy(&p.id, &p.dir);
                    }
                    let _ = std::fs::remove_dir_all(&p.dir);
                }
                return Err(e);
            }
        };
        let snapshot = Snapshot { size_bytes: size, ..pending };
        self.record_snapshot(id, &snapshot)?;
        let children = plans
            .into_iter()
            .zip(results)
            .map(|(plan, r)| match r {
                Ok(hook) => Ok(Started { sandbox: self.record_child(plan.id, &snapshot)?, hook }),
                Err(e) => {
                    let _ = backend.destroy(&plan.id, &plan.dir);
                    Err(e)
                }
            })
            .collect();
        // Shells for the next fork this wide, once this one is done.
        if let Some((shells, key)) = shell_key {
            self.refill_shells(shells, &key, &rootfs, s.limits, n);
        }
        Ok(ForkOutcome { snapshot, children })
    }

    /// Stops a sandbox and removes everything it had. Holds the data directory like every
    /// operation in progress, so a `gc` never judges a sandbox being killed as lost.
    pub fn kill(&self, id: &SandboxId) -> Result<()> {
        let _busy = self.in_progress()?;
        self.kill_held(id)
    }

    /// [`Engine::kill`] for a caller that holds the data directory exclusively already (gc).
    pub(crate) fn kill_held(&self, id: &SandboxId) -> Result<()> {
        let s = self.store.sandbox(id)?;
        if let Ok(backend) = self.backend(s.backend) {
            backend.destroy(id, &self.sandbox_dir(id))?;
        }
        self.store.delete_sandbox(id)
    }
}
