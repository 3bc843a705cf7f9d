//! Sandboxes: create (from the template or a snapshot), list, get, kill, pause, connect,
//! timeout, fork.

use super::extract::{check_map, sandbox_id, seconds, snapshot_ref, ApiJson, ApiQuery};
use super::types::*;
use super::AuditNote;
use crate::auth::Caller;
use crate::db::{OnTimeout, SandboxMeta};
use crate::error::{ApiError, ApiResult, ErrorBody, ErrorDetail};
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use branchbox_core::{BackendChoice, Engine};
use branchbox_model::{now_ms, BackendKind, Limits, Sandbox, SandboxId};
use std::collections::BTreeMap;

type Noted<T> = ApiResult<(StatusCode, Extension<AuditNote>, Json<T>)>;

fn note(sandbox: &str) -> AuditNote {
    AuditNote { sandbox: Some(sandbox.to_string()), ..Default::default() }
}

/// The sandbox's record and liveness, or 404.
pub(crate) fn info(engine: &Engine, st: &AppState, id: &SandboxId) -> ApiResult<SandboxInfo> {
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
pub(crate) fn client_meta(
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

/// Creates a sandbox from the default template, or from a snapshot.
#[utoipa::path(post, path = "/v1/sandboxes", tag = "sandboxes", request_body = CreateSandbox,
    responses((status = 201, body = SandboxInfo, description = "created and running"),
              (status = "4XX", body = ErrorBody, description = "bad request, unknown snapshot, conflict"),
              (status = 503, body = ErrorBody, description = "at capacity or backend unavailable")))]
pub async fn create(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiJson(req): ApiJson<CreateSandbox>,
) -> Noted<SandboxInfo> {
    let template = req.template.clone().filter(|t| t != "default");
    let snapshot = req.snapshot_id.as_deref().map(snapshot_ref).transpose()?;
    let lim = limits(&st, &req);
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
    let network = super::network::requested(req.network.as_ref(), req.allow_internet_access)?;
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
    let meta = client_meta(&st, caller, req.timeout, req.on_timeout, req.metadata, req.envs)?;
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
    Ok((StatusCode::CREATED, Extension(n), Json(out)))
}

fn metadata_filter(q: &Option<String>) -> ApiResult<BTreeMap<String, String>> {
    let Some(q) = q else { return Ok(BTreeMap::new()) };
    if q.len() > 8192 {
        return Err(ApiError::invalid("the metadata filter must be at most 8192 bytes"));
    }
    Ok(form_urlencoded::parse(q.as_bytes()).into_owned().collect())
}

/// Lists sandboxes, optionally only those with given metadata or state.
#[utoipa::path(get, path = "/v1/sandboxes", tag = "sandboxes", params(ListSandboxes),
    responses((status = 200, body = Vec<SandboxInfo>), (status = "4XX", body = ErrorBody, description = "bad query")))]
pub async fn list(
    State(st): State<AppState>,
    ApiQuery(q): ApiQuery<ListSandboxes>,
) -> ApiResult<Json<Vec<SandboxInfo>>> {
    let want = metadata_filter(&q.metadata)?;
    let out = st
        .blocking(move |engine, st| {
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
        .await?;
    Ok(Json(out))
}

/// One sandbox.
#[utoipa::path(get, path = "/v1/sandboxes/{id}", tag = "sandboxes", params(("id" = String, Path, description = "sandbox id")),
    responses((status = 200, body = SandboxInfo), (status = "4XX", body = ErrorBody, description = "bad id or not found")))]
pub async fn get(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<SandboxInfo>> {
    let id = sandbox_id(&id)?;
    Ok(Json(st.blocking(move |engine, st| info(engine, st, &id)).await?))
}

/// Destroys a sandbox and everything it had.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}", tag = "sandboxes", params(("id" = String, Path, description = "sandbox id")),
    responses((status = 204, description = "destroyed"), (status = "4XX", body = ErrorBody, description = "bad id or not found")))]
pub async fn kill(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult<StatusCode> {
    let id = sandbox_id(&id)?;
    st.blocking(move |engine, st| {
        st.exclusive(&id, || Ok(engine.kill(&id)?))?;
        st.forget(&id);
        st.db().remove(id.as_str()).map_err(ApiError::from)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Pauses a running sandbox; its timeout stops until `connect` resumes it.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/pause", tag = "sandboxes", params(("id" = String, Path, description = "sandbox id")),
    responses((status = 200, body = SandboxInfo), (status = "4XX", body = ErrorBody, description = "not found, or not running (409)")))]
pub async fn pause(State(st): State<AppState>, Path(id): Path<String>) -> Noted<SandboxInfo> {
    let id = sandbox_id(&id)?;
    let n = note(id.as_str());
    let out = st
        .blocking(move |engine, st| {
            st.exclusive(&id, || Ok(engine.pause(&id)?))?;
            st.db().set_expiry(&id, None, None)?;
            info(engine, st, &id)
        })
        .await?;
    Ok((StatusCode::OK, Extension(n), Json(out)))
}

/// Connects to a sandbox: resumes it when paused and restarts its timeout.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/connect", tag = "sandboxes", params(("id" = String, Path, description = "sandbox id")),
    request_body = ConnectSandbox,
    responses((status = 200, body = SandboxInfo), (status = "4XX", body = ErrorBody, description = "not found, or lost (409)")))]
pub async fn connect(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<ConnectSandbox>,
) -> Noted<SandboxInfo> {
    let id = sandbox_id(&id)?;
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
    Ok((StatusCode::OK, Extension(n), Json(out)))
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
#[utoipa::path(post, path = "/v1/sandboxes/{id}/timeout", tag = "sandboxes", params(("id" = String, Path, description = "sandbox id")),
    request_body = SetTimeout,
    responses((status = 200, body = SandboxInfo), (status = "4XX", body = ErrorBody, description = "bad timeout or not found")))]
pub async fn set_timeout(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<SetTimeout>,
) -> Noted<SandboxInfo> {
    let id = sandbox_id(&id)?;
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
    Ok((StatusCode::OK, Extension(n), Json(out)))
}

/// Turns step-history mode on or off: with it on, every command ends with a checkpoint, so
/// each command's outcome is a branch point.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/history", tag = "sandboxes", params(("id" = String, Path, description = "sandbox id")),
    request_body = SetHistory,
    responses((status = 200, body = SandboxInfo), (status = "4XX", body = ErrorBody, description = "not found")))]
pub async fn set_history(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<SetHistory>,
) -> Noted<SandboxInfo> {
    let id = sandbox_id(&id)?;
    let n = AuditNote { detail: Some(format!("history {}", req.enabled)), ..note(id.as_str()) };
    let out = st
        .blocking(move |engine, st| {
            engine.set_history(&id, req.enabled)?;
            info(engine, st, &id)
        })
        .await?;
    Ok((StatusCode::OK, Extension(n), Json(out)))
}

/// Forks a running sandbox into `count` children continuing from its current state; the
/// source keeps running. Each child succeeds or fails on its own.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/fork", tag = "sandboxes", params(("id" = String, Path, description = "sandbox id")),
    request_body = ForkSandbox,
    responses((status = 200, body = ForkResult, description = "the fork point and one result per child"),
              (status = "4XX", body = ErrorBody, description = "bad count, not found, not running (409)"),
              (status = 503, body = ErrorBody, description = "at capacity")))]
pub async fn fork(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<ForkSandbox>,
) -> Noted<ForkResult> {
    let id = sandbox_id(&id)?;
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
    Ok((StatusCode::OK, Extension(n), Json(out)))
}
