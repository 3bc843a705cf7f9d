//! One function per subcommand.

use crate::args::{BackendArg, Cli, Cmd, CreateArgs, ExecArgs, RefCmd};
use crate::output::{clean, each_target, print, progress_fn};
use anyhow::{anyhow, bail, Context, Result};
use branchbox_core::{host, BackendChoice, Config, Engine, SnapshotOptions};
use branchbox_model::{BackendKind, Limits, SandboxId, SnapshotKind};
use branchbox_protocol::{Command, ExecSpec, ExitStatus, OutStream, MAX_EXEC_OUTPUT};
use std::io::{Read, Write};
use std::time::Duration;

/// Runs the parsed command line; returns the process exit code.
pub fn run(cli: Cli) -> Result<i32> {
    let cfg = Config::from_env(cli.data_dir.as_deref());
    let json = cli.json;
    if let Cmd::Doctor = cli.command {
        return doctor(&cfg, json);
    }
    // Before the engine opens the store: these work on a store that it would refuse.
    if let Cmd::Store { command } = cli.command {
        return crate::store::run(&cfg.data_dir, command, json);
    }
    // Snapshots to and from an S3 store: on this data directory's files, never through a service.
    if let Cmd::Remote { store, command } = cli.command {
        let data_dir = cfg.data_dir.clone();
        let code = crate::remote_snapshots::run(&Engine::open(cfg)?, &store, command, json);
        crate::store::backup_changed(&data_dir);
        return code;
    }
    // Guest artifacts live in the image cache only: no data directory, no service.
    if let Cmd::Guest { command } = &cli.command {
        return crate::guest::run(&cfg, command, json);
    }
    // Booting a guest directly needs no sandbox records or service.
    if let Cmd::Vm { command } = &cli.command {
        return crate::vm::run(command, json);
    }
    // The MCP server opens the engine for each call, beside a service if one runs; stdout is
    // the protocol's, so it prints nothing else there.
    if let Cmd::Mcp = cli.command {
        recover(&Engine::open(cfg.clone())?);
        branchbox_mcp::serve_stdio(cfg)?;
        return Ok(0);
    }
    // Pools exist only in the service: there is no engine path to fall back to.
    if let Cmd::Pool { command } = &cli.command {
        if let Some((svc, _)) = crate::remote::locate(&cli)? {
            return crate::pool::run(&svc, command, json);
        }
    }
    if let Some(code) = crate::remote::run(&cli)? {
        return Ok(code);
    }
    let data_dir = cfg.data_dir.clone();
    let engine = Engine::open(cfg)?;
    recover(&engine);
    let code = run_local(&engine, cli.command, json);
    drop(engine);
    crate::store::backup_changed(&data_dir);
    code
}

/// Runs a command that needs the engine.
fn run_local(engine: &Engine, command: Cmd, json: bool) -> Result<i32> {
    match command {
        Cmd::Doctor | Cmd::Store { .. } | Cmd::Remote { .. } | Cmd::Guest { .. } | Cmd::Vm { .. } | Cmd::Mcp => {
            unreachable_early()
        }
        Cmd::Image { command } => crate::image::run(engine, command, json),
        Cmd::Run { create, exec } => run_once(engine, &create, &exec, json),
        Cmd::Create { create } => {
            let s = create_sandbox(engine, &create)?;
            print(json, &s, || s.id.to_string());
            Ok(0)
        }
        Cmd::Template { command } => crate::template::run(engine, command, json),
        Cmd::Exec { id, exec } => run_command(engine, &parse_id(&id)?, &exec, json),
        Cmd::Spawn { id, exec } => {
            let id = parse_id(&id)?;
            let mut spec = spec(&exec)?;
            if let Some(d) = engine.exec_defaults(&id)? {
                d.apply(&mut spec);
            }
            let pid = engine.connect(&id)?.spawn(spec)?;
            print(json, &serde_json::json!({"pid": pid}), || pid.to_string());
            Ok(0)
        }
        Cmd::Ps { id } => {
            let procs = engine.connect(&parse_id(&id)?)?.list_procs()?;
            print(json, &procs, || {
                procs
                    .iter()
                    .map(|p| {
                        let state = match &p.exit {
                            None => "running".to_string(),
                            Some(e) => format!("exited {}", exit_text(e)),
                        };
                        format!("{:>7}  {:<12} {:?}", p.pid, state, p.cmd)
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            });
            Ok(0)
        }
        Cmd::Files { command } => crate::files::run(engine, command, json),
        Cmd::Fork { id, count } => fork(engine, &parse_id(&id)?, count, json),
        Cmd::Host { id, port } => crate::network::host_cmd(engine, &parse_id(&id)?, port, json),
        Cmd::Egress { id, internet, allow, deny_all } => {
            crate::network::egress_cmd(engine, &parse_id(&id)?, crate::network::policy(internet, &allow, deny_all)?, json)
        }
        Cmd::Snapshot { id, name, ttl } => {
            let opts = SnapshotOptions {
                kind: SnapshotKind::Snapshot,
                name: name.as_deref(),
                ttl: ttl.map(Duration::from_secs),
            };
            let snap = engine.snapshot(&parse_id(&id)?, &opts)?;
            print(json, &snap, || snap.id.to_string());
            Ok(0)
        }
        Cmd::Checkpoint { id, name } => {
            let snap = engine.checkpoint(&parse_id(&id)?, name.as_deref())?;
            print(json, &snap, || snap.id.to_string());
            Ok(0)
        }
        Cmd::Rollback { id, snapshot } => {
            let snap = engine.rollback(&parse_id(&id)?, &snapshot)?;
            print(json, &snap, || format!("{id} is back at {}", snap.id));
            Ok(0)
        }
        Cmd::History { id, mode } => {
            engine.set_history(&parse_id(&id)?, mode == "on")?;
            print(json, &serde_json::json!({"id": id, "history": mode == "on"}), String::new);
            Ok(0)
        }
        Cmd::Log => {
            let forest = engine.lineage()?;
            print(json, &forest, || branchbox_core::lineage::render(&forest));
            Ok(0)
        }
        Cmd::Ref { command } => refs(engine, command, json),
        Cmd::Diff { from, to } => {
            let d = branchbox_core::diff::diff(engine, &from, &to)?;
            print(json, &d, || {
                let mut lines: Vec<String> = d.added.iter().map(|p| format!("A {}", clean(p))).collect();
                lines.extend(d.changed.iter().map(|p| format!("M {}", clean(p))));
                lines.extend(d.removed.iter().map(|p| format!("D {}", clean(p))));
                lines.join("\n")
            });
            Ok(0)
        }
        Cmd::Gc { dry_run } => {
            let r = branchbox_core::gc::collect(engine, dry_run)?;
            print(json, &r, || {
                let verb = if r.dry_run { "would free" } else { "freed" };
                format!(
                    "{verb} {:.1} MiB: {} expired snapshot(s) ({} kept for descendants), {} unreachable fork point(s), \
                     {} interrupted snapshot(s), {} lost sandbox(es), {} stray sandbox dir(s), {} unused image(s), \
                     {} unused root disk(s), {} orphaned network(s), {} restore shell(s) ended",
                    r.freed_bytes as f64 / 1048576.0,
                    r.expired_snapshots.len(),
                    r.kept_with_descendants.len(),
                    r.unreachable_fork_points.len(),
                    r.orphan_snapshot_dirs.len(),
                    r.lost_sandboxes.len(),
                    r.orphan_sandbox_dirs.len(),
                    r.unused_images.len(),
                    r.unused_disks.len(),
                    r.orphan_networks.len(),
                    r.ended_shells.len()
                )
            });
            Ok(0)
        }
        Cmd::Snapshots => {
            let snaps = engine.snapshots()?;
            print(json, &snaps, || {
                snaps
                    .iter()
                    .map(|s| {
                        format!(
                            "{}  {:<10} {:>8.1} MiB  from {}  {}",
                            s.id,
                            s.kind.as_str(),
                            s.size_bytes as f64 / 1048576.0,
                            s.source.as_ref().map(|x| x.as_str()).unwrap_or("-"),
                            s.name.as_deref().unwrap_or("")
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            });
            Ok(0)
        }
        Cmd::Rmsnap { snapshots, cascade } => each_target(json, "rmsnap", "deleted", true, &snapshots, |s| {
            Ok(engine.delete_snapshot(s, cascade)?.iter().map(ToString::to_string).collect())
        }),
        Cmd::Restore { snapshot } => {
            let started = engine.restore(&snapshot)?;
            print(json, &started, || started.sandbox.id.to_string());
            Ok(0)
        }
        Cmd::Ls { all: with_shells } => {
            let all = engine.list()?;
            if with_shells {
                let shells = engine.shells();
                let v = serde_json::json!({"sandboxes": all, "shells": shells});
                print(json, &v, || {
                    let mut lines = ls_lines(&all);
                    lines.extend(shells.iter().map(|s| {
                        let state = if s.ready { "ready" } else { "starting" };
                        format!("{}  gvisor   shell    {state} (restore shell for forks of kind {})", s.id, s.key)
                    }));
                    lines.join("\n")
                });
                return Ok(0);
            }
            print(json, &all, || ls_lines(&all).join("\n"));
            Ok(0)
        }
        Cmd::Pause { id } => {
            engine.pause(&parse_id(&id)?)?;
            print(json, &serde_json::json!({"paused": id}), String::new);
            Ok(0)
        }
        Cmd::Resume { id } => {
            engine.resume(&parse_id(&id)?)?;
            print(json, &serde_json::json!({"resumed": id}), String::new);
            Ok(0)
        }
        Cmd::Kill { ids } => each_target(json, "kill", "killed", false, &ids, |id| {
            engine.kill(&parse_id(id)?)?;
            Ok(vec![id.to_string()])
        }),
        Cmd::Bench { command } => crate::bench::run(engine, command, json),
        Cmd::Pool { .. } => bail!(
            "pools are kept by the branchbox service and none answers for this data directory; start branchboxd \
             (or set BRANCHBOX_URL and BRANCHBOX_TOKEN to reach one)"
        ),
    }
}

/// Reconciles runtime with records before the command (see `Engine::reconcile`); says so on
/// stderr when it changed anything. A failure here must not stop the command itself.
fn recover(engine: &Engine) {
    match engine.reconcile() {
        Ok(r) if !r.is_empty() => eprintln!(
            "branchbox: recovered from an interrupted operation: {} (details in {})",
            r.summary(),
            engine.config().data_dir.join("audit.log").display()
        ),
        Ok(_) => {}
        Err(e) => eprintln!("branchbox: could not reconcile sandboxes with their records: {e}"),
    }
}

/// One line per sandbox, as `branchbox ls` prints them.
fn ls_lines(all: &[branchbox_core::SandboxView]) -> Vec<String> {
    all.iter()
        .map(|v| {
            let line = format!(
                "{}  {:<8} {:<8} {}",
                v.sandbox.id,
                v.sandbox.backend.as_str(),
                v.sandbox.state.as_str(),
                v.sandbox.parent_snapshot.as_ref().map(|p| format!("from {p}")).unwrap_or_default()
            );
            let line = match &v.lost_reason {
                Some(why) => format!("{line} ({why})"),
                None => line,
            };
            match &v.flagged {
                Some(why) => format!("{line} [flagged: {}]", clean(why)),
                None => line,
            }
        })
        .collect()
}

fn unreachable_early() -> Result<i32> {
    Err(anyhow!("doctor, guest and vm are handled before the data directory is opened"))
}

fn parse_id(s: &str) -> Result<SandboxId> {
    Ok(SandboxId::parse(s)?)
}

fn choice(b: BackendArg) -> BackendChoice {
    match b {
        BackendArg::Auto => BackendChoice::Auto,
        BackendArg::Microvm => BackendChoice::Exactly(BackendKind::Microvm),
        BackendArg::Gvisor => BackendChoice::Exactly(BackendKind::Gvisor),
    }
}

fn limits(engine: &Engine, a: &CreateArgs) -> Result<Option<Limits>> {
    if a.memory.is_none() && a.cpus.is_none() && a.pids.is_none() {
        return Ok(None);
    }
    let d = engine.config().limits;
    Ok(Some(Limits {
        memory_mib: a.memory.unwrap_or(d.memory_mib),
        cpus: a.cpus.unwrap_or(d.cpus),
        pids: a.pids.unwrap_or(d.pids),
    }))
}

fn spec(a: &ExecArgs) -> Result<ExecSpec> {
    let cmd = if a.shell { Command::Shell(a.command.join(" ")) } else { Command::Argv(a.command.clone()) };
    let mut s = ExecSpec::new(cmd);
    for kv in &a.env {
        let (k, v) = kv.split_once('=').ok_or_else(|| anyhow!("--env {kv:?} is not KEY=VALUE"))?;
        s.env.insert(k.to_string(), v.to_string());
    }
    s.cwd = a.cwd.clone();
    s.timeout_ms = match a.timeout {
        Some(t) if !(t > 0.0 && t.is_finite()) => bail!("--timeout must be a positive number of seconds"),
        Some(t) => Some(Duration::from_secs_f64(t).as_millis() as u64),
        None => None,
    };
    s.output_cap = Some(match a.output_cap {
        Some(c) if c > MAX_EXEC_OUTPUT => bail!(
            "--output-cap {c} is over the limit of {MAX_EXEC_OUTPUT} bytes (16 MiB) that every command has; \
             ask for at most that"
        ),
        Some(c) => c,
        None => MAX_EXEC_OUTPUT,
    });
    Ok(s)
}

fn exit_text(e: &ExitStatus) -> String {
    match (e.code, e.signal) {
        (Some(c), _) => format!("code {c}"),
        (None, Some(s)) => format!("signal {s}"),
        _ => "unknown".into(),
    }
}

/// Shell-style exit code: the command's code, 128+signal, or 124 on timeout (as timeout(1)).
fn exit_code(e: &ExitStatus) -> i32 {
    if e.timed_out {
        return 124;
    }
    e.code.or(e.signal.map(|s| 128 + s)).unwrap_or(1)
}

/// Runs a command in sandbox `id` through the engine (which checkpoints afterwards in
/// step-history mode) and prints its output.
fn run_command(engine: &Engine, id: &SandboxId, a: &ExecArgs, json: bool) -> Result<i32> {
    let spec = spec(a)?;
    let mut stdin = std::io::stdin();
    let input: Option<&mut dyn Read> = if a.stdin { Some(&mut stdin) } else { None };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (status, step) = engine.exec(id, spec, input, &mut |which, chunk| {
        if json {
            match which {
                OutStream::Stdout => out.extend_from_slice(chunk),
                OutStream::Stderr => err.extend_from_slice(chunk),
            }
        } else {
            let _ = match which {
                OutStream::Stdout => std::io::stdout().write_all(chunk),
                OutStream::Stderr => std::io::stderr().write_all(chunk),
            };
        }
    })?;
    if json {
        let v = serde_json::json!({
            "stdout": String::from_utf8_lossy(&out),
            "stderr": String::from_utf8_lossy(&err),
            "status": status,
            "checkpoint": step.as_ref().map(|s| s.id.to_string()),
        });
        print(true, &v, String::new);
    } else {
        let _ = std::io::stdout().flush();
        if status.timed_out {
            eprintln!("branchbox: the command timed out and its process group was killed");
        }
        if status.truncated {
            eprintln!("branchbox: output was cut at the output cap");
        }
        if status.oom_killed {
            eprintln!("branchbox: a process of the command was killed: the sandbox reached its memory limit");
        }
        if let Some(s) = &step {
            eprintln!("branchbox: step checkpoint {}", s.id);
        }
    }
    Ok(exit_code(&status))
}

/// A new sandbox from the default image, or from a template.
fn create_sandbox(engine: &Engine, c: &CreateArgs) -> Result<branchbox_model::Sandbox> {
    match &c.template {
        Some(t) if c.backend != BackendArg::Auto => {
            bail!("--backend does not apply with --template {t}: the template's sandboxes use the backend it was built on")
        }
        Some(t) => Ok(engine.create_from_template(t)?.sandbox),
        None => Ok(engine.create_networked_ports(
            choice(c.backend),
            limits(engine, c)?,
            &c.image,
            crate::network::egress(c)?,
            c.open_ports,
            &mut progress_fn(),
        )?),
    }
}

fn run_once(engine: &Engine, c: &CreateArgs, a: &ExecArgs, json: bool) -> Result<i32> {
    let s = create_sandbox(engine, c)?;
    let result = run_command(engine, &s.id, a, json);
    engine.kill(&s.id).context("destroying the sandbox")?;
    result
}

fn refs(engine: &Engine, cmd: RefCmd, json: bool) -> Result<i32> {
    match cmd {
        RefCmd::Set { name, snapshot } => {
            let snap = engine.set_ref(&name, &snapshot)?;
            print(json, &serde_json::json!({"ref": name, "snapshot": snap.id}), || {
                format!("{name} -> {}", snap.id)
            });
        }
        RefCmd::Ls => {
            let all = engine.refs()?;
            let v: Vec<serde_json::Value> =
                all.iter().map(|(n, s)| serde_json::json!({"ref": n, "snapshot": s})).collect();
            print(json, &v, || all.iter().map(|(n, s)| format!("{n} -> {s}")).collect::<Vec<_>>().join("\n"));
        }
        RefCmd::Rm { names } => {
            return each_target(json, "ref rm", "removed", false, &names, |n| {
                engine.delete_ref(n)?;
                Ok(vec![n.to_string()])
            })
        }
    }
    Ok(0)
}

fn fork(engine: &Engine, id: &SandboxId, n: usize, json: bool) -> Result<i32> {
    let outcome = engine.fork(id, n)?;
    let children: Vec<serde_json::Value> = outcome
        .children
        .iter()
        .map(|c| match c {
            Ok(s) => serde_json::json!({"ok": true, "id": s.sandbox.id, "hook": s.hook}),
            Err(e) => serde_json::json!({"ok": false, "error": {"code": e.code(), "message": e.to_string()}}),
        })
        .collect();
    let failed = outcome.children.iter().filter(|c| c.is_err()).count();
    let v = serde_json::json!({"snapshot": outcome.snapshot, "children": children});
    print(json, &v, || {
        outcome
            .children
            .iter()
            .map(|c| match c {
                Ok(s) => s.sandbox.id.to_string(),
                Err(e) => format!("error: {}", clean(&e.to_string())),
            })
            .collect::<Vec<_>>()
            .join("\n")
    });
    Ok(if failed > 0 { 1 } else { 0 })
}

fn doctor(cfg: &Config, json: bool) -> Result<i32> {
    let kvm = host::detect_kvm();
    let blocker = host::linux_microvm_blocker(&kvm);
    let (auto, why) = host::auto_backend(&kvm);
    let gv =
        branchbox_gvisor::GvisorBackend::new(cfg.runsc.clone(), cfg.data_dir.join("runsc"), cfg.shim.clone());
    let runsc = gv.check();
    let exposed = exposed_data_dir(&cfg.data_dir);
    let stores = crate::store::check_all(&cfg.data_dir);
    let store_json: Vec<_> = stores
        .iter()
        .map(|(db, r)| serde_json::json!({"file": db, "ok": r.is_ok(), "error": r.as_ref().err()}))
        .collect();
    let v = serde_json::json!({
        "kvm": kvm,
        "linux_microvm": {"usable": blocker.is_none(), "why_not": blocker},
        "gvisor": match &runsc { Ok(v) => serde_json::json!({"usable": true, "version": v}),
                                 Err(e) => serde_json::json!({"usable": false, "why_not": e.to_string()}) },
        "auto": {"backend": auto, "why": why},
        "data_dir": cfg.data_dir,
        "data_dir_private": {"private": exposed.is_none(), "why_not": exposed},
        "metadata": store_json,
        "agent": cfg.agent,
    });
    print(json, &v, || {
        let mut lines = vec![format!("kvm:           {:?} ({})", kvm.kind, kvm.detail)];
        lines.push(match &blocker {
            None => "linux microvm: usable with --backend microvm".into(),
            Some(w) => format!("linux microvm: not usable: {w}"),
        });
        lines.push(match &runsc {
            Ok(v) => format!("gvisor:        usable ({v})"),
            Err(e) => format!("gvisor:        not usable: {e}"),
        });
        lines.push(format!("auto backend:  {why}"));
        lines.push(format!("data dir:      {}", cfg.data_dir.display()));
        if let Some(why) = &exposed {
            lines.push(format!("warning:       {why}"));
        }
        for (db, r) in &stores {
            lines.push(match r {
                Ok(()) => format!("metadata:      {} passes its check", db.display()),
                Err(e) => format!("metadata:      {e}"),
            });
        }
        lines.join("\n")
    });
    let sound = stores.iter().all(|(_, r)| r.is_ok());
    Ok(if sound && (runsc.is_ok() || blocker.is_none()) { 0 } else { 1 })
}

/// Why other users can reach the data directory (it holds checkpoint images, which are
/// sandboxes' memory, and the service's database and token), with the command that fixes it;
/// `None` when only its owner can, or it does not exist yet (it is created private).
fn exposed_data_dir(dir: &std::path::Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir).ok()?.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then(|| {
        format!(
            "the data directory {} is open to other users (mode {mode:o}); run `chmod 700 {}`",
            dir.display(),
            dir.display()
        )
    })
}
