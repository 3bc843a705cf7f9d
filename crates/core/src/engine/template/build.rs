//! Building a template: find the deepest step whose chain key is cached, restore its snapshot
//! (or start the base), run the remaining steps and snapshot after each one that changes the
//! sandbox. The build log is written as it goes; a failed step keeps it and the earlier steps'
//! cache, and the last good build stays usable.

use super::locks::{steps_lock, BuildLock};
use super::{Built, StepRecord, Template, TemplateStatus};
use crate::engine::{agent_error, BackendChoice, Engine, SnapshotOptions};
use branchbox_model::{now_ms, Error, Limits, Result, SandboxId, SnapshotId, SnapshotKind};
use branchbox_protocol::{ExecSpec, OutStream, MAX_EXEC_OUTPUT};
use branchbox_template::chain::{self, Entry, Upload};
use branchbox_template::{Base, ExecDefaults, Step, TemplateSpec};
use serde::Serialize;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// Most bytes of command output a build log keeps; the rest is counted, not written.
const MAX_LOG_BYTES: u64 = 16 << 20;

/// What a build reports as it goes.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum BuildEvent {
    /// A step starts (or is found in the cache). Step 0 is the base.
    Step {
        /// 1-based; 0 for the base.
        index: usize,
        /// Steps in the template.
        total: usize,
        /// The step in one line.
        step: String,
        /// True when its result came from the cache.
        cached: bool,
    },
    /// Output of the running step's command.
    Output {
        /// `stdout` or `stderr`.
        stream: &'static str,
        /// The bytes, as text (invalid UTF-8 replaced).
        data: String,
    },
    /// A step finished.
    StepDone {
        /// 1-based; 0 for the base.
        index: usize,
        /// The snapshot after it.
        snapshot: SnapshotId,
        /// True when it came from the cache.
        cached: bool,
        /// How long it took, ms.
        ms: u64,
    },
}

/// Where a build starts when nothing is cached.
enum Start {
    /// An image, started with these limits (the engine's when none).
    Image(String, Option<Limits>),
    Snapshot(SnapshotId),
}

/// The build log: capped, and never a reason to fail the build.
struct Log {
    file: Option<std::fs::File>,
    written: u64,
}

impl Log {
    fn line(&mut self, s: &str) {
        self.bytes(format!("{s}\n").as_bytes());
    }

    fn bytes(&mut self, b: &[u8]) {
        if let Some(f) = &mut self.file {
            let room = MAX_LOG_BYTES.saturating_sub(self.written) as usize;
            let _ = f.write_all(&b[..b.len().min(room)]);
            if b.len() > room && room > 0 {
                let _ = f.write_all(b"\n[branchbox: the log is cut here at 16 MiB]\n");
            }
            self.written += b.len() as u64;
        }
    }
}

/// A step's failure: what to record and what to return.
struct Failure {
    exit_code: Option<i32>,
    error: Error,
}

impl From<Error> for Failure {
    fn from(error: Error) -> Failure {
        Failure { exit_code: None, error }
    }
}

impl Engine {
    /// Builds a template, reusing every cached step up to the first changed one. `context` is
    /// the directory uploads are read from. Returns the template's record; a failed step is
    /// an error naming the step and its exit code (the record keeps the failure and the log).
    pub fn build_template(
        &self,
        spec: TemplateSpec,
        context: Option<&Path>,
        on: &mut dyn FnMut(&BuildEvent),
    ) -> Result<Template> {
        self.build_template_limited(spec, None, context, on)
    }

    /// [`Engine::build_template`] whose sandboxes get `limits` instead of the engine's: the
    /// base starts with them, so every step's snapshot, and every sandbox made from the
    /// template, keeps them (a restore keeps its snapshot's limits). Given limits are part of
    /// the base's chain key, so no step cached under other limits is reused. A template built
    /// on another template keeps that one's limits: other limits are refused.
    pub fn build_template_limited(
        &self,
        spec: TemplateSpec,
        limits: Option<Limits>,
        context: Option<&Path>,
        on: &mut dyn FnMut(&BuildEvent),
    ) -> Result<Template> {
        spec.validate()?;
        if let Some(l) = &limits {
            l.validate()?;
        }
        let name = spec.name.clone();
        let _only = BuildLock::take(&self.template_dir(), &name)?;
        // Held shared while this build's steps are cached but not yet named by its record, so
        // no release (a `template rm`, another build's end) takes them meanwhile.
        let building = steps_lock(&self.template_dir(), libc::LOCK_SH)?;
        let started = Instant::now();
        let previous = match self.template(&name) {
            Ok(t) => Some(t),
            Err(Error::NotFound { .. }) => None,
            Err(e) => return Err(e),
        };
        let (start, base_key, mut defaults) = self.resolve_base(&spec, limits)?;
        // Scan uploads first: their content hashes are part of the keys.
        let uploads = spec
            .steps
            .iter()
            .map(|s| match s {
                Step::Upload { src, .. } => {
                    let ctx = context.ok_or_else(|| {
                        Error::InvalidInput(format!(
                            "template {name} uploads {src:?} but has no context directory to read it from; pass --context DIR"
                        ))
                    })?;
                    Upload::scan(ctx, src).map(Some).map_err(Error::from)
                }
                _ => Ok(None),
            })
            .collect::<Result<Vec<Option<Upload>>>>()?;
        let mut keys = vec![base_key.clone()];
        for (step, up) in spec.steps.iter().zip(&uploads) {
            let parent = keys.last().cloned().unwrap_or_default();
            keys.push(chain::step_key(&parent, step, up.as_ref().map(|u| u.hash.as_str())));
        }
        let log_path = self.template_log_path(&name)?;
        let file = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&log_path)
                .ok()
        };
        let mut log = Log { file, written: 0 };
        let total = spec.steps.len();

        // The deepest cached key whose snapshot is still there.
        let mut deepest = None;
        for (i, key) in keys.iter().enumerate().rev() {
            if let Some(snap) = self.cached_step(key)? {
                deepest = Some((i, snap));
                break;
            }
        }
        let mut record = Template {
            spec: spec.clone(),
            context: context.map(Path::to_path_buf),
            base_key,
            base_snapshot: None,
            steps: spec
                .steps
                .iter()
                .zip(&keys[1..])
                .map(|(s, k)| StepRecord {
                    step: s.describe(),
                    key: k.clone(),
                    snapshot: None,
                    cached: false,
                })
                .collect(),
            status: TemplateStatus::Ready,
            built: previous.and_then(|p| p.built),
            build_ms: 0,
        };
        let describe =
            |i: usize| if i == 0 { format!("base {}", spec.base) } else { spec.steps[i - 1].describe() };
        let (from, sandbox, mut current) = match deepest {
            Some((i, snap)) => {
                // Report every cached step; the earlier keys' snapshots are looked up only to
                // record them.
                for (j, key) in keys.iter().enumerate().take(i + 1) {
                    let s = if j == i { Some(snap.clone()) } else { self.cached_step(key)? };
                    on(&BuildEvent::Step { index: j, total, step: describe(j), cached: true });
                    log.line(&format!("step {j}/{total}: {} (cached)", describe(j)));
                    if let Some(s) = &s {
                        on(&BuildEvent::StepDone { index: j, snapshot: s.clone(), cached: true, ms: 0 });
                    }
                    self.record_step(&mut record, j, s, true);
                }
                if i == total {
                    (i, None, snap)
                } else {
                    (i, Some(self.restore(snap.as_str())?.sandbox.id), snap)
                }
            }
            None => {
                on(&BuildEvent::Step { index: 0, total, step: describe(0), cached: false });
                log.line(&format!("step 0/{total}: {}", describe(0)));
                let t = Instant::now();
                let (id, snap) = self.start_base(&start)?;
                self.store.put_step(&keys[0], snap.as_str(), now_ms())?;
                on(&BuildEvent::StepDone { index: 0, snapshot: snap.clone(), cached: false, ms: ms(t) });
                self.record_step(&mut record, 0, Some(snap.clone()), false);
                (0, Some(id), snap)
            }
        };
        for step in &spec.steps[..from] {
            defaults.after(step);
        }
        let mut failure = None;
        if let Some(id) = &sandbox {
            for (i, (step, upload)) in spec.steps.iter().zip(&uploads).enumerate().skip(from) {
                let index = i + 1;
                on(&BuildEvent::Step { index, total, step: step.describe(), cached: false });
                log.line(&format!("step {index}/{total}: {}", step.describe()));
                let t = Instant::now();
                let ran = self.run_step(id, step, upload.as_ref(), &defaults, on, &mut log);
                if let Err(f) = ran {
                    log.line(&format!("step {index}/{total} failed: {}", f.error));
                    failure = Some((index, f));
                    break;
                }
                defaults.after(step);
                if step.changes_sandbox() {
                    let opts = SnapshotOptions { kind: SnapshotKind::Snapshot, name: None, ttl: None };
                    match self.snapshot(id, &opts) {
                        Ok(s) => current = s.id,
                        Err(e) => {
                            failure = Some((index, Failure::from(e)));
                            break;
                        }
                    }
                }
                self.store.put_step(&keys[index], current.as_str(), now_ms())?;
                on(&BuildEvent::StepDone { index, snapshot: current.clone(), cached: false, ms: ms(t) });
                log.line(&format!("step {index}/{total} done in {} ms: {current}", ms(t)));
                self.record_step(&mut record, index, Some(current.clone()), false);
            }
            self.kill(id)?;
        }
        record.build_ms = ms(started);
        let result = match failure {
            None => {
                record.status = TemplateStatus::Ready;
                record.built = Some(Built {
                    snapshot: current,
                    key: keys[total].clone(),
                    keys: keys.clone(),
                    defaults,
                    built_ms: now_ms(),
                });
                Ok(())
            }
            Some((index, f)) => {
                let what = match f.exit_code {
                    Some(c) => format!("exited with code {c}"),
                    None => format!("failed: {}", f.error),
                };
                record.status = TemplateStatus::Failed {
                    step: index,
                    exit_code: f.exit_code,
                    message: f.error.to_string(),
                };
                Err(Error::InvalidInput(format!(
                    "template {name}: step {index}/{total} ({}) {what}; steps before it stay cached; its log: \
                     `branchbox template log {name}`",
                    spec.steps[index - 1].describe()
                )))
            }
        };
        self.put_template(&record)?;
        drop(building);
        self.release_steps()?;
        result.map(|()| record)
    }

    fn record_step(&self, record: &mut Template, index: usize, snap: Option<SnapshotId>, cached: bool) {
        if index == 0 {
            record.base_snapshot = snap;
        } else if let Some(s) = record.steps.get_mut(index - 1) {
            s.snapshot = snap;
            s.cached = cached;
        }
    }

    /// The cached snapshot of a chain key, when it is still usable (a row whose snapshot is
    /// gone is dropped).
    fn cached_step(&self, key: &str) -> Result<Option<SnapshotId>> {
        let Some(id) = self.store.step_snapshot(key)? else { return Ok(None) };
        match self.lookup(&id) {
            Ok(s) if s.deleted_ms.is_none() && self.snapshot_dir(&s.id).is_dir() => Ok(Some(s.id)),
            Ok(_) | Err(Error::NotFound { .. }) | Err(Error::InvalidInput(_)) => {
                self.store.delete_step(key)?;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// What the base is: where to start, its chain key and the defaults it gives.
    fn resolve_base(
        &self,
        spec: &TemplateSpec,
        limits: Option<Limits>,
    ) -> Result<(Start, String, ExecDefaults)> {
        let template = |n: &str| -> Result<(Start, String, ExecDefaults)> {
            if n == spec.name {
                return Err(Error::InvalidInput(format!("template {n} cannot be its own base")));
            }
            let t = self.template(n)?;
            let b = t.built.ok_or_else(|| {
                Error::Conflict(format!("base template {n} has no successful build; build it first"))
            })?;
            if let Some(l) = limits {
                let theirs = self.find_snapshot(b.snapshot.as_str())?.limits;
                if theirs != l {
                    return Err(Error::InvalidInput(format!(
                        "a template built on template {n} keeps its limits ({} MiB, {} CPUs, {} processes); \
                         leave the limits out or build on an image",
                        theirs.memory_mib, theirs.cpus, theirs.pids
                    )));
                }
            }
            Ok((Start::Snapshot(b.snapshot), chain::base_key(&format!("template:{}", b.key)), b.defaults))
        };
        let image = |n: &str| -> Result<(Start, String, ExecDefaults)> {
            let img = self.build_image(n, &mut |_| {})?;
            let kind = self.resolve(BackendChoice::Auto);
            // The engine's own limits are none given; without limits the key is as before, so
            // such a build shares the plain build's cache.
            let limits = limits.filter(|l| *l != self.cfg.limits);
            let lim = limits.map(|l| format!(":{}/{}/{}", l.memory_mib, l.cpus, l.pids)).unwrap_or_default();
            Ok((
                Start::Image(n.to_string(), limits),
                chain::base_key(&format!("image:{}:{}{lim}", img.id, kind.as_str())),
                self.image_defaults(n)?,
            ))
        };
        match spec.base()? {
            Base::Image(n) => image(&n),
            Base::Template(n) => template(&n),
            Base::Either(n) => match self.store.template(&n)? {
                Some(_) => template(&n),
                None => image(&n),
            },
        }
    }

    /// The env and working directory an imported image's configuration names, as the
    /// defaults its templates start with; built-in images give none. Entries that could not
    /// be a variable (no name, a NUL) are left out rather than failing every command.
    pub(in crate::engine) fn image_defaults(&self, name: &str) -> Result<ExecDefaults> {
        let Some(imported) = branchbox_image::imported_image(&self.cfg.images_dir, name)
            .map_err(|e| Error::Backend(e.to_string()))?
        else {
            return Ok(ExecDefaults::default());
        };
        let env = imported
            .config
            .env
            .unwrap_or_default()
            .iter()
            .filter_map(|kv| kv.split_once('='))
            .filter(|(k, v)| !k.is_empty() && !k.contains('\0') && !v.contains('\0'))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let workdir = imported.config.working_dir.filter(|w| w.starts_with('/') && !w.contains('\0'));
        Ok(ExecDefaults { env, workdir, user: None })
    }

    /// Starts the base and snapshots it (an image), or restores it (a template's last step,
    /// whose snapshot is the base's).
    fn start_base(&self, start: &Start) -> Result<(SandboxId, SnapshotId)> {
        match start {
            Start::Image(name, limits) => {
                let s = self.create_from(BackendChoice::Auto, *limits, name, &mut |_| {})?;
                let opts = SnapshotOptions { kind: SnapshotKind::Snapshot, name: None, ttl: None };
                match self.snapshot(&s.id, &opts) {
                    Ok(snap) => Ok((s.id, snap.id)),
                    Err(e) => {
                        let _ = self.kill(&s.id);
                        Err(e)
                    }
                }
            }
            Start::Snapshot(snap) => Ok((self.restore(snap.as_str())?.sandbox.id, snap.clone())),
        }
    }

    fn run_step(
        &self,
        id: &SandboxId,
        step: &Step,
        upload: Option<&Upload>,
        defaults: &ExecDefaults,
        on: &mut dyn FnMut(&BuildEvent),
        log: &mut Log,
    ) -> std::result::Result<(), Failure> {
        let mut conn = self.connect(id)?;
        match step {
            Step::Run(cmd) => {
                let mut spec = ExecSpec::new(branchbox_template::command(cmd));
                spec.output_cap = Some(MAX_EXEC_OUTPUT);
                defaults.apply(&mut spec);
                let status = conn
                    .exec_streaming(spec, None, &mut |which, chunk| {
                        log.bytes(chunk);
                        let stream = match which {
                            OutStream::Stdout => "stdout",
                            OutStream::Stderr => "stderr",
                        };
                        on(&BuildEvent::Output { stream, data: String::from_utf8_lossy(chunk).into_owned() });
                    })
                    .map_err(agent_error)?;
                if status.code != Some(0) {
                    let why = if status.timed_out {
                        "timed out".to_string()
                    } else if let Some(sig) = status.signal {
                        format!("was killed by signal {sig}")
                    } else {
                        format!("exited with code {}", status.code.unwrap_or(-1))
                    };
                    return Err(Failure {
                        exit_code: status.code,
                        error: Error::InvalidInput(format!("the command {why}")),
                    });
                }
            }
            Step::Upload { src, to } => {
                let up = upload.ok_or_else(|| Error::Backend(format!("upload {src:?} was not scanned")))?;
                for e in &up.entries {
                    match e {
                        Entry::Dir { rel } => {
                            conn.mkdir(&up.dest(src, to, rel), true).map_err(agent_error)?
                        }
                        Entry::File { rel, local, mode, sha256, scanned } => {
                            // The file the scan hashed, or nothing: never a link swapped in since.
                            let mut r = scanned.open(local).map_err(Error::from)?;
                            conn.write_file(&up.dest(src, to, rel), &mut r, Some(*mode), false, true)
                                .map_err(agent_error)?;
                            r.check(sha256, local).map_err(Error::from)?;
                        }
                    }
                }
                log.line(&format!("uploaded {} entries, {} bytes", up.entries.len(), up.bytes));
            }
            Step::File { path, content, mode } => {
                conn.write_file(path, &mut content.as_bytes(), Some(mode.unwrap_or(0o644)), false, true)
                    .map_err(agent_error)?;
            }
            Step::Workdir(dir) => conn.mkdir(dir, true).map_err(agent_error)?,
            Step::Env(_) | Step::User(_) => {}
        }
        Ok(())
    }
}

fn ms(t: Instant) -> u64 {
    t.elapsed().as_millis() as u64
}
