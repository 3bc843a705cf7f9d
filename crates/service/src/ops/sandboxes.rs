//! Sandboxes: create (from an image, a template or a snapshot), list, get, kill, pause,
//! connect, timeout, step history, fork. Every surface (the native API, E2B's control plane,
//! the console, MCP) calls these, so the limits, the cap and the records are the same whichever
//! a client uses; each returns what the audit log is told beside its answer.

use super::network::requested;
use super::types::*;
use crate::auth::Caller;
use crate::db::{OnTimeout, SandboxMeta};
use crate::error::{ApiError, ApiResult, ErrorDetail};
use crate::extract::{check_map, seconds, snapshot_ref};
use crate::middleware::AuditNote;
use crate::state::AppState;
use axum::http::StatusCode;
use branchbox_core::{BackendChoice, Engine};
use branchbox_model::{now_ms, BackendKind, Limits, Sandbox, SandboxId};
use std::collections::BTreeMap;

fn note(sandbox: &str) -> AuditNote {
    AuditNote { sandbox: Some(sandbox.to_string()), ..Default::default() }
}

/// The sandbox's record and liveness, or 404.
pub fn info(engine: &Engine, st: &AppState, id: &SandboxId) -> ApiResult<SandboxInfo> {
    let views = engine.list()?;
    let v = views.iter().find(|v| &v.sandbox.id == id).ok_or_else(|| {
        ApiError::from(branchbox_model::Error::not_found(
            "sandbox",
            id.as_str(),
            "GET /v1/sandboxes lists them",
        ))
    })?;
    let meta = st.db().get(id)?;
    Ok(SandboxInfo::from_view(v, meta))
}

/// The service's record of a sandbox a client creates or claims, from what the request names:
/// its timeout (checked against the service's maximum; not yet running), labels and env.
pub fn client_meta(
    st: &AppState,
    caller: Caller,
    timeout: Option<f64>,
    on_timeout: Option<OnTimeout>,
    metadata: Option<BTreeMap<String, String>>,
    envs: Option<BTreeMap<String, String>>,
) -> ApiResult<SandboxMeta> {
    let timeout =
        seconds("timeout", timeout.unwrap_or(st.cfg.default_timeout_s as f64), st.cfg.max_timeout_s)?;
    let metadata = metadata.unwrap_or_default();
    let envs = envs.unwrap_or_default();
    check_map("metadata", &metadata, false)?;
    check_map("envs", &envs, true)?;
    Ok(SandboxMeta {
        metadata,
        envs,
        expires_ms: None,
        on_timeout: on_timeout.unwrap_or_default(),
        timeout_ms: timeout.as_millis() as i64,
        created_by: caller.0,
    })
}

fn limits(st: &AppState, r: &CreateSandbox) -> Option<Limits> {
    if r.memory_mib.is_none() && r.cpus.is_none() && r.pids.is_none() {
        return None;
    }
    let d = st.cfg.engine.limits;
    Some(Limits {
        memory_mib: r.memory_mib.unwrap_or(d.memory_mib),
        cpus: r.cpus.unwrap_or(d.cpus),
        pids: r.pids.unwrap_or(d.pids),
    })
}

/// Creates a sandbox from an image, a template or a snapshot, and records it with its timeout
/// (not yet running), labels and env.
pub async fn create(
    st: &AppState,
    caller: Caller,
    req: CreateSandbox,
) -> ApiResult<(SandboxInfo, AuditNote)> {
    let template = req.template.clone().filter(|t| t != "default");
    let snapshot = req.snapshot_id.as_deref().map(snapshot_ref).transpose()?;
    let lim = limits(st, &req);
    if template.is_some() && (snapshot.is_some() || lim.is_some() || req.image.is_some()) {
        return Err(ApiError::invalid(
            "a sandbox of a template starts from the template's snapshot with its image and limits; leave out \
             snapshot_id, image, memory_mib, cpus and pids",
        ));
    }
    if snapshot.is_some() && lim.is_some() {
        return Err(ApiError::invalid(
            "a sandbox restored from a snapshot keeps the snapshot's limits; leave out memory_mib, cpus and pids",
        ));
    }
    if snapshot.is_some() && req.image.is_some() {
        return Err(ApiError::invalid(
            "a sandbox restored from a snapshot keeps the snapshot's image; leave out image",
        ));
    }
    let network = requested(req.network.as_ref(), req.allow_internet_access)?;
    if network.is_some() && (template.is_some() || snapshot.is_some()) {
        return Err(ApiError::invalid(
            "a network is given to a sandbox created from an image; one restored from a snapshot or template keeps \
             the network its source had: leave out network and allow_internet_access",
        ));
    }
    let open_ports = req.open_ports.unwrap_or(false);
    if open_ports && network.is_none() {
        return Err(ApiError::invalid("open_ports needs a network: give network or allow_internet_access"));
    }
    let image = req.image.unwrap_or_else(|| branchbox_core::DEFAULT_IMAGE.to_string());
    let meta = client_meta(st, caller, req.timeout, req.on_timeout, req.metadata, req.envs)?;
    let choice = match req.backend.unwrap_or_default() {
        BackendName::Auto => BackendChoice::Auto,
        BackendName::Gvisor => BackendChoice::Exactly(BackendKind::Gvisor),
        BackendName::Microvm => BackendChoice::Exactly(BackendKind::Microvm),
    };
    let out = st
        .blocking(move |engine, st| {
            let _held = st.reserve(engine, 1)?;
            let sandbox = match (&template, &snapshot) {
                (Some(t), _) => engine.create_from_template(t)?.sandbox,
                (None, Some(s)) => engine.restore(s)?.sandbox,
                (None, None) => {
                    engine.create_networked_ports(choice, lim, &image, network, open_ports, &mut |_| {})?
                }
            };
            let meta = SandboxMeta { expires_ms: Some(now_ms() + meta.timeout_ms), ..meta };
            st.db().put(&sandbox.id, &meta)?;
            Ok(SandboxInfo::new(&sandbox, true, Some(meta)))
        })
        .await?;
    let n = AuditNote {
        sandbox: Some(out.id.clone()),
        parent: out.parent_snapshot.clone(),
        ..Default::default()
    };
    Ok((out, n))
}

fn metadata_filter(q: &Option<String>) -> ApiResult<BTreeMap<String, String>> {
    let Some(q) = q else { return Ok(BTreeMap::new()) };
    if q.len() > 8192 {
        return Err(ApiError::invalid("the metadata filter must be at most 8192 bytes"));
    }
    Ok(form_urlencoded::parse(q.as_bytes()).into_owned().collect())
}

/// The sandboxes, optionally only those with given metadata (`k=v` pairs, URL-encoded) or
/// state; ready members of warm pools are left out.
pub async fn list(st: &AppState, q: ListSandboxes) -> ApiResult<Vec<SandboxInfo>> {
    let want = metadata_filter(&q.metadata)?;
    st.blocking(move |engine, st| {
        let views = engine.list()?;
        let db = st.db();
        // Ready sandboxes of warm pools are the service's until claimed.
        let pooled = db.member_ids()?;
        let mut out = Vec::new();
        for v in views.iter().filter(|v| !pooled.contains(v.sandbox.id.as_str())) {
            let info = SandboxInfo::from_view(v, db.get(&v.sandbox.id)?);
            let meta_ok = want.iter().all(|(k, val)| info.metadata.get(k) == Some(val));
            if meta_ok && q.state.is_none_or(|s| s == info.state) {
                out.push(info);
            }
        }
        Ok(out)
    })
    .await
}

/// One sandbox.
pub async fn get(st: &AppState, id: SandboxId) -> ApiResult<SandboxInfo> {
    st.blocking(move |engine, st| info(engine, st, &id)).await
}

/// Destroys a sandbox and everything it had.
pub async fn kill(st: &AppState, id: SandboxId) -> ApiResult<()> {
    st.blocking(move |engine, st| {
        st.exclusive(&id, || Ok(engine.kill(&id)?))?;
        st.forget(&id);
        st.db().remove(id.as_str()).map_err(ApiError::from)
    })
    .await
}

/// Pauses a running sandbox; its timeout stops until `connect` resumes it.
pub async fn pause(st: &AppState, id: SandboxId) -> ApiResult<(SandboxInfo, AuditNote)> {
    let n = note(id.as_str());
    let out = st
        .blocking(move |engine, st| {
            st.exclusive(&id, || Ok(engine.pause(&id)?))?;
            st.db().set_expiry(&id, None, None)?;
            info(engine, st, &id)
        })
        .await?;
    Ok((out, n))
}

/// Connects to a sandbox: resumes it when paused and restarts its timeout (`timeout` s, or
/// the length it had).
pub async fn connect(
    st: &AppState,
    id: SandboxId,
    req: ConnectSandbox,
) -> ApiResult<(SandboxInfo, AuditNote)> {
    let timeout = req.timeout.map(|t| seconds("timeout", t, st.cfg.max_timeout_s)).transpose()?;
    let n = note(id.as_str());
    let default_ms = (st.cfg.default_timeout_s * 1000) as i64;
    let out = st
        .blocking(move |engine, st| {
            let s = st.exclusive(&id, || {
                let s = engine.sandbox(&id)?;
                if s.state == branchbox_model::SandboxState::Paused {
                    engine.resume(&id)?;
                }
                Ok(s)
            })?;
            let current = info(engine, st, &id)?;
            if current.state == StateName::Lost {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "lost",
                    format!("sandbox {id} is lost (its runtime is gone); DELETE /v1/sandboxes/{id} removes its record"),
                ));
            }
            renew(st, &s, timeout.map(|t| t.as_millis() as i64), default_ms)?;
            info(engine, st, &id)
        })
        .await?;
    Ok((out, n))
}

/// Restarts a sandbox's timeout from now (with `ms`, or the length it had).
fn renew(st: &AppState, s: &Sandbox, ms: Option<i64>, default_ms: i64) -> ApiResult<()> {
    let db = st.db();
    match db.get(&s.id)? {
        Some(m) => {
            let len = ms.unwrap_or(m.timeout_ms);
            db.set_expiry(&s.id, Some(now_ms() + len), Some(len)).map_err(ApiError::from)
        }
        // A sandbox made outside the service (e.g. by the CLI) gets a record on first contact.
        None => {
            let len = ms.unwrap_or(default_ms);
            let m = SandboxMeta { expires_ms: Some(now_ms() + len), timeout_ms: len, ..Default::default() };
            db.put(&s.id, &m).map_err(ApiError::from)
        }
    }
}

/// Makes a sandbox's timeout fire now, keeping the length later renewals reuse; a sandbox made
/// outside the service gets its record here, as a renewal would give it.
fn end_now(st: &AppState, s: &Sandbox, default_ms: i64) -> ApiResult<()> {
    let db = st.db();
    match db.get(&s.id)? {
        Some(_) => db.set_expiry(&s.id, Some(now_ms()), None)?,
        None => db.put(
            &s.id,
            &SandboxMeta { expires_ms: Some(now_ms()), timeout_ms: default_ms, ..Default::default() },
        )?,
    }
    Ok(())
}

/// Sets a sandbox's timeout, counted from now; 0 ends it now (its timeout action runs within a
/// second).
pub async fn set_timeout(
    st: &AppState,
    id: SandboxId,
    req: SetTimeout,
) -> ApiResult<(SandboxInfo, AuditNote)> {
    // 0 ends the sandbox now, as E2B's set_timeout(0) does: its timeout action (kill, or pause)
    // runs at the service's next timeout check, and the length later renewals reuse is kept.
    let t = match req.timeout {
        0.0 => None,
        t => Some(seconds("timeout", t, st.cfg.max_timeout_s)?),
    };
    let said = t.map_or("timeout 0 s: ends now".into(), |t| format!("timeout {} s", t.as_secs_f64()));
    let n = AuditNote { detail: Some(said), ..note(id.as_str()) };
    let default_ms = (st.cfg.default_timeout_s * 1000) as i64;
    let out = st
        .blocking(move |engine, st| {
            let s = engine.sandbox(&id)?;
            match t {
                Some(t) => renew(st, &s, Some(t.as_millis() as i64), 0)?,
                None => end_now(st, &s, default_ms)?,
            }
            info(engine, st, &id)
        })
        .await?;
    Ok((out, n))
}

/// Turns step-history mode on or off: with it on, every command ends with a checkpoint.
pub async fn set_history(
    st: &AppState,
    id: SandboxId,
    req: SetHistory,
) -> ApiResult<(SandboxInfo, AuditNote)> {
    let n = AuditNote { detail: Some(format!("history {}", req.enabled)), ..note(id.as_str()) };
    let out = st
        .blocking(move |engine, st| {
            engine.set_history(&id, req.enabled)?;
            info(engine, st, &id)
        })
        .await?;
    Ok((out, n))
}

/// Forks a running sandbox into `count` children continuing from its current state; the
/// source keeps running. Each child succeeds or fails on its own, and gets the source's
/// metadata, environment and timeout length.
pub async fn fork(
    st: &AppState,
    caller: Caller,
    id: SandboxId,
    req: ForkSandbox,
) -> ApiResult<(ForkResult, AuditNote)> {
    let n = req.count.unwrap_or(1) as usize;
    let max = st.cfg.engine.max_fork;
    if n == 0 || n > max {
        return Err(ApiError::invalid(format!("count {n} is out of range: ask for 1 to {max} children")));
    }
    let src = id.clone();
    let out = st
        .blocking(move |engine, st| {
            let _held = st.reserve(engine, n)?;
            let outcome = st.exclusive(&id, || Ok(engine.fork(&id, n)?))?;
            // A source made outside the service has no record; its children get the default timeout.
            let default_ms = (st.cfg.default_timeout_s * 1000) as i64;
            let parent = st
                .db()
                .get(&id)?
                .unwrap_or_else(|| SandboxMeta { timeout_ms: default_ms, ..Default::default() });
            let mut children = Vec::new();
            for c in &outcome.children {
                children.push(match c {
                    Ok(started) => {
                        let meta = SandboxMeta {
                            expires_ms: Some(now_ms() + parent.timeout_ms),
                            created_by: caller.0.clone(),
                            ..parent.clone()
                        };
                        st.db().put(&started.sandbox.id, &meta)?;
                        ForkChild {
                            ok: true,
                            sandbox: Some(SandboxInfo::new(&started.sandbox, true, Some(meta))),
                            error: None,
                        }
                    }
                    Err(e) => ForkChild {
                        ok: false,
                        sandbox: None,
                        error: Some(ErrorDetail { code: e.code().into(), message: e.to_string() }),
                    },
                });
            }
            Ok(ForkResult { snapshot: (&outcome.snapshot).into(), children })
        })
        .await?;
    let ids: Vec<&str> =
        out.children.iter().filter_map(|c| c.sandbox.as_ref().map(|s| s.id.as_str())).collect();
    let n = AuditNote {
        sandbox: Some(src.to_string()),
        snapshot: Some(out.snapshot.id.clone()),
        parent: Some(src.to_string()),
        detail: Some(format!("children: {}", ids.join(","))),
    };
    Ok((out, n))
}
