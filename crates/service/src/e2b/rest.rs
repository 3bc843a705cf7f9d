//! E2B's control plane (the REST API the SDKs reach at `E2B_API_URL`): create, list, get,
//! kill, timeout, pause, resume/connect, and the template list, in E2B's JSON shapes, each
//! mapped onto the service's own handlers so the limits, cap, audit and TTL are the same.
//! Where E2B's server means something else by the same call, E2B's meaning is kept here:
//! connect and refresh only ever extend a sandbox's end, a timeout of 0 ends it now, and an id
//! of any other shape names no sandbox (404).

use super::{E2bError, PresentedKey, ENVD_VERSION};
use crate::auth::{Caller, Tokens};
use crate::db::OnTimeout;
use crate::error::ApiError;
use crate::extract::ApiQuery;
use crate::ops::sandboxes as ops;
use crate::ops::types::{
    ConnectSandbox, CreateSandbox, ForkSandbox, ListSandboxes, SandboxInfo, SetTimeout, StateName,
};
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use branchbox_model::{SandboxId, SnapshotId, SnapshotKind};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

type E2bResult<T> = Result<T, E2bError>;

/// The control plane's routes (relative to [`super::PREFIX`]).
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/sandboxes", get(list_v1).post(create))
        .route("/v2/sandboxes", get(list_v2).post(create))
        .route("/sandboxes/{id}", get(detail).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/refreshes", post(refresh))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/resume", post(connect))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/fork", post(fork))
        .route("/sandboxes/{id}/snapshots", post(take_snapshot))
        .route("/snapshots", get(list_snapshots))
        .route("/templates", get(templates))
        .route("/templates/{id}", axum::routing::delete(delete_snapshot))
        .merge(super::metrics::routes())
        .merge(super::network::routes())
        .fallback(|| async {
            E2bError(ApiError::not_found(
                "branchboxd does not serve this part of E2B's API; docs/e2b.md lists what it serves",
            ))
        })
}

/// A JSON body (empty reads as `{}`), with E2B-shaped errors.
fn body<T: DeserializeOwned>(bytes: &Bytes) -> E2bResult<T> {
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) { b"{}" } else { bytes };
    serde_json::from_slice(bytes).map_err(|e| {
        E2bError(ApiError::bad_request("bad_body", format!("the JSON body does not fit this operation: {e}")))
    })
}

/// A sandbox id from E2B's wire. One not shaped like branchbox's ids names no sandbox, so it
/// answers E2B's not-found (404), as E2B's server does for an unknown id: the SDKs read that as
/// "no such sandbox" (`Sandbox.kill("x")` answers False) where a 400 would raise.
fn e2b_id(id: &str) -> E2bResult<SandboxId> {
    SandboxId::parse(id).map_err(|_| {
        let shown: String = id.chars().take(64).collect();
        E2bError(ApiError::not_found(format!("sandbox {shown:?} not found")))
    })
}

/// E2B's `NewSandbox` (v1 and v2): the fields that mean something here.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: Option<String>,
    timeout: Option<f64>,
    auto_pause: Option<bool>,
    metadata: Option<BTreeMap<String, String>>,
    env_vars: Option<BTreeMap<String, String>>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    auto_pause_memory: Option<bool>,
    auto_resume: Option<serde_json::Value>,
    mcp: Option<serde_json::Value>,
    network: Option<serde_json::Value>,
    volume_mounts: Option<serde_json::Value>,
    iam: Option<serde_json::Value>,
}

/// E2B's `Sandbox` (what create and connect answer).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct E2bSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "clientID")]
    client_id: &'static str,
    envd_version: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    envd_access_token: Option<String>,
}

/// E2B's `ListedSandbox` and `SandboxDetail` (the detail adds the access token and the
/// network).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct E2bListed {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "clientID")]
    client_id: &'static str,
    started_at: String,
    end_at: String,
    cpu_count: u32,
    #[serde(rename = "memoryMB")]
    memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    disk_size_mb: u64,
    state: &'static str,
    envd_version: &'static str,
    metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    envd_access_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    allow_internet_access: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    network: Option<super::network::Shown>,
}

/// The template id E2B's SDKs see for a sandbox: the one it was created from through this
/// API, else its image.
fn template_of(st: &AppState, info: &SandboxInfo) -> String {
    let id = info.id.as_str();
    st.db().e2b_template(id).ok().flatten().unwrap_or_else(|| info.image.clone())
}

fn access_token(key: &PresentedKey, id: &str) -> Option<String> {
    key.0.as_deref().map(|k| Tokens::sandbox_token(k, id))
}

fn rfc3339_ms(ms: i64) -> String {
    super::pb::Timestamp::from_ns(ms.saturating_mul(1_000_000)).rfc3339()
}

fn listed(st: &AppState, info: &SandboxInfo, token: Option<String>) -> E2bListed {
    E2bListed {
        template_id: template_of(st, info),
        sandbox_id: info.id.clone(),
        client_id: "branchbox",
        started_at: rfc3339_ms(info.created_ms),
        end_at: rfc3339_ms(info.expires_ms.unwrap_or_else(branchbox_model::now_ms)),
        cpu_count: info.limits.cpus,
        memory_mb: info.limits.memory_mib,
        disk_size_mb: 0,
        state: if info.state == StateName::Paused { "paused" } else { "running" },
        envd_version: ENVD_VERSION,
        metadata: info.metadata.clone(),
        envd_access_token: token,
        allow_internet_access: None,
        network: None,
    }
}

fn created(st: &AppState, info: &SandboxInfo, key: &PresentedKey) -> E2bSandbox {
    E2bSandbox {
        template_id: template_of(st, info),
        sandbox_id: info.id.clone(),
        client_id: "branchbox",
        envd_version: ENVD_VERSION,
        envd_access_token: access_token(key, &info.id),
    }
}

fn not_served(what: &str) -> E2bError {
    E2bError(ApiError::bad_request(
        "not_served",
        format!("{what} is not served by branchboxd's E2B API (docs/e2b.md); leave it out"),
    ))
}

async fn create(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(key): Extension<PresentedKey>,
    raw: Bytes,
) -> E2bResult<Response> {
    let req: NewSandbox = body(&raw)?;
    for (what, given) in [("mcp", &req.mcp), ("volumeMounts", &req.volume_mounts), ("iam", &req.iam)] {
        if given.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(not_served(what));
        }
    }
    if req.auto_pause_memory == Some(false) {
        return Err(not_served(
            "autoPauseMemory: false (a timeout pause keeping only the filesystem): branchbox's pause keeps the memory",
        ));
    }
    if req
        .auto_resume
        .as_ref()
        .is_some_and(|v| !v.is_null() && v.get("enabled") != Some(&serde_json::Value::Bool(false)))
    {
        return Err(not_served("autoResume (waking a paused sandbox on traffic); resume it with connect"));
    }
    let asked = req.template_id.unwrap_or_else(|| "base".into());
    let named = Some(asked.clone()).filter(|t| t != "base" && t != "default");
    let (template, snapshot_id) = match named {
        Some(n) => match snapshot_named(&st, &n).await? {
            true => (None, Some(n)),
            false => (Some(n), None),
        },
        None => (None, None),
    };
    // A sandbox made from a snapshot keeps the snapshot's network.
    let network =
        super::network::on_create(req.network.as_ref(), req.allow_internet_access, snapshot_id.is_some())?;
    let ours = CreateSandbox {
        template,
        snapshot_id,
        timeout: req.timeout,
        on_timeout: req.auto_pause.map(|p| if p { OnTimeout::Pause } else { OnTimeout::Kill }),
        metadata: req.metadata,
        envs: req.env_vars,
        network: network.as_ref().map(crate::ops::network::NetworkPolicy::of),
        ..Default::default()
    };
    let (info, note) = ops::create(&st, caller, ours).await?;
    let note = Extension(note);
    let (st2, id, t) = (st.clone(), info.id.clone(), asked);
    st.blocking(move |_, _| Ok(st2.db().set_e2b_template(&id, &t)?)).await?;
    Ok((StatusCode::CREATED, note, Json(created(&st, &info, &key))).into_response())
}

/// The query of E2B's listings. Every parameter the SDKs send is served; `teamID` (E2B's
/// teams, which branchbox has not) is refused rather than ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListQuery {
    metadata: Option<String>,
    state: Option<String>,
    limit: Option<u32>,
    next_token: Option<String>,
    order: Option<String>,
    template: Option<String>,
    started_after: Option<String>,
    #[serde(rename = "teamID")]
    team_id: Option<String>,
}

/// Most sandboxes one page lists; E2B's SDKs ask for 100 unless told otherwise.
const MAX_PAGE: u32 = 1000;

fn bad_query(why: String) -> E2bError {
    E2bError(ApiError::bad_request("bad_query", why))
}

fn shown(v: &str) -> String {
    v.chars().take(64).collect()
}

/// Where a listing goes on from: the start time and id of the last sandbox of the page before,
/// as the `x-next-token` header handed them out (`<ms>.<id>`).
fn page_token(t: &str) -> E2bResult<(i64, String)> {
    let bad = || bad_query(format!("nextToken {:?} is not one this service handed out", shown(t)));
    let (ms, id) = t.split_once('.').ok_or_else(bad)?;
    let ms = ms.parse::<i64>().map_err(|_| bad())?;
    SandboxId::parse(id).map_err(|_| bad())?;
    Ok((ms, id.to_string()))
}

/// One page of a listing: E2B's filters (`state`, `metadata`, `template`, `startedAfter`), in
/// start-time order (`order` `desc`, newest first, the default as on E2B's server, or `asc`),
/// `limit` at a time; the next page's token goes in the `x-next-token` header while more are
/// left.
async fn listing(st: AppState, q: ListQuery, default_states: &[&str]) -> E2bResult<Response> {
    if q.team_id.as_deref().is_some_and(|t| !t.is_empty()) {
        return Err(not_served("teamID (branchbox has no teams; leave it out)"));
    }
    let states: Vec<String> = match &q.state {
        Some(s) => s.split(',').map(|x| x.trim().to_string()).filter(|x| !x.is_empty()).collect(),
        None => default_states.iter().map(|s| s.to_string()).collect(),
    };
    if let Some(bad) = states.iter().find(|s| *s != "running" && *s != "paused") {
        return Err(bad_query(format!("state {:?} is not running or paused", shown(bad))));
    }
    let desc = match q.order.as_deref() {
        Some("asc") => false,
        None | Some("desc") => true,
        Some(o) => return Err(bad_query(format!("order {:?} is not asc or desc", shown(o)))),
    };
    let after_ms = match q.started_after.as_deref() {
        None => None,
        Some(t) => Some(
            chrono::DateTime::parse_from_rfc3339(t)
                .map_err(|e| bad_query(format!("startedAfter {:?} is not an RFC 3339 time: {e}", shown(t))))?
                .timestamp_millis(),
        ),
    };
    let limit = q.limit.unwrap_or(100);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(bad_query(format!("limit {limit} is not between 1 and {MAX_PAGE}")));
    }
    let from = q.next_token.as_deref().filter(|t| !t.is_empty()).map(page_token).transpose()?;
    let all = ops::list(&st, ListSandboxes { metadata: q.metadata, state: None }).await?;
    let mut found: Vec<(i64, String, E2bListed)> = all
        .iter()
        .filter(|i| i.state != StateName::Lost)
        .filter(|i| after_ms.is_none_or(|a| i.created_ms >= a))
        .map(|i| (i.created_ms, i.id.clone(), listed(&st, i, None)))
        .filter(|(_, _, l)| states.iter().any(|s| s == l.state))
        .filter(|(_, _, l)| q.template.as_deref().is_none_or(|t| l.template_id == t))
        .collect();
    found.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    if desc {
        found.reverse();
    }
    if let Some((ms, id)) = &from {
        let key = (*ms, id);
        found.retain(|(m, i, _)| if desc { (*m, i) < key } else { (*m, i) > key });
    }
    let more = found.len() > limit as usize;
    found.truncate(limit as usize);
    let next = more.then(|| found.last().map(|(ms, id, _)| format!("{ms}.{id}"))).flatten();
    let page: Vec<E2bListed> = found.into_iter().map(|(_, _, l)| l).collect();
    let mut r = Json(page).into_response();
    if let Some(v) = next.and_then(|n| axum::http::HeaderValue::from_str(&n).ok()) {
        r.headers_mut().insert("x-next-token", v);
    }
    Ok(r)
}

async fn list_v1(State(st): State<AppState>, ApiQuery(q): ApiQuery<ListQuery>) -> E2bResult<Response> {
    listing(st, q, &["running"]).await
}

async fn list_v2(State(st): State<AppState>, ApiQuery(q): ApiQuery<ListQuery>) -> E2bResult<Response> {
    listing(st, q, &["running", "paused"]).await
}

async fn detail(
    State(st): State<AppState>,
    Extension(key): Extension<PresentedKey>,
    Path(id): Path<String>,
) -> E2bResult<Json<E2bListed>> {
    let sid = e2b_id(&id)?;
    let info = ops::get(&st, sid.clone()).await?;
    if info.state == StateName::Lost {
        return Err(E2bError(ApiError::not_found(format!(
            "sandbox {} is lost (its runtime is gone); DELETE it to remove its record",
            info.id
        ))));
    }
    let egress = st.blocking(move |engine, _| Ok(engine.egress_policy(&sid)?)).await?;
    let (network, internet) = super::network::detail(egress.as_ref());
    let token = access_token(&key, &info.id);
    Ok(Json(E2bListed { allow_internet_access: Some(internet), network, ..listed(&st, &info, token) }))
}

async fn kill(State(st): State<AppState>, Path(id): Path<String>) -> E2bResult<StatusCode> {
    ops::kill(&st, e2b_id(&id)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TimeoutBody {
    timeout: Option<f64>,
    duration: Option<f64>,
}

/// Sets a sandbox's end to `timeout` seconds from now, shorter or longer. As on E2B's server,
/// a timeout of 0 (or less) ends the sandbox now: its on-timeout action (kill, or pause with
/// `auto_pause`) runs at the service's next timeout check.
async fn set_timeout(State(st): State<AppState>, Path(id): Path<String>, raw: Bytes) -> E2bResult<Response> {
    let req: TimeoutBody = body(&raw)?;
    let Some(timeout) = req.timeout else {
        return Err(E2bError(ApiError::bad_request("bad_body", "give timeout: the seconds from now")));
    };
    let sid = e2b_id(&id)?;
    // As on E2B's server, 0 or less ends the sandbox now; /v1 takes 0 to mean that.
    let timeout = timeout.max(0.0);
    let (_, note) = ops::set_timeout(&st, sid, SetTimeout { timeout }).await?;
    Ok((StatusCode::NO_CONTENT, Extension(note)).into_response())
}

/// `refreshes`: keeps a sandbox alive for `duration` seconds (default 60) from now. As on E2B's
/// server it only ever extends: an end later than that stays.
async fn refresh(State(st): State<AppState>, Path(id): Path<String>, raw: Bytes) -> E2bResult<Response> {
    let req: TimeoutBody = body(&raw)?;
    let sid = e2b_id(&id)?;
    let timeout = req.duration.unwrap_or(60.0);
    let before = ops::get(&st, sid.clone()).await?;
    let (info, note) = ops::set_timeout(&st, sid.clone(), SetTimeout { timeout }).await?;
    never_earlier(&st, sid, &before, &info).await?;
    Ok((StatusCode::NO_CONTENT, Extension(note)).into_response())
}

/// Connect and refresh only ever extend on E2B's server: when the renewal just made (`after`)
/// ends a running sandbox before the end it had (`before`), that end is put back.
async fn never_earlier(
    st: &AppState,
    id: SandboxId,
    before: &SandboxInfo,
    after: &SandboxInfo,
) -> E2bResult<()> {
    let kept = if before.state == StateName::Paused { None } else { before.expires_ms };
    if let (Some(old), Some(new)) = (kept, after.expires_ms) {
        if new < old {
            st.blocking(move |_, st| Ok(st.db().set_expiry(&id, Some(old), None)?)).await?;
        }
    }
    Ok(())
}

/// E2B's `SandboxPauseRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct PauseBody {
    memory: Option<bool>,
    require_healthy_guest: Option<bool>,
}

/// Pauses a sandbox, memory and all (gVisor's checkpoint keeps the processes). A pause that
/// keeps only the filesystem (`memory: false`, e2b's `mode="filesystem"`) is refused, not
/// taken as a full one; with `requireHealthyGuest` the sandbox's agent must answer first, or
/// the pause is refused with 503 and the sandbox runs on, as on E2B's server.
async fn pause(State(st): State<AppState>, Path(id): Path<String>, raw: Bytes) -> E2bResult<Response> {
    let req: PauseBody = body(&raw)?;
    let sid = e2b_id(&id)?;
    if req.memory == Some(false) {
        return Err(not_served(
            "a pause without memory (memory: false, mode \"filesystem\"): branchbox's pause keeps the memory",
        ));
    }
    if req.require_healthy_guest == Some(true) {
        let _found = ops::get(&st, sid.clone()).await?;
        let s2 = sid.clone();
        st.blocking(move |engine, st| Ok(st.agent(engine, &s2, Duration::ZERO)?.ping()?)).await.map_err(
            |e| {
                E2bError(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "agent_unavailable",
                    format!(
                        "the sandbox's agent does not answer, so it was not paused and runs on: {}",
                        e.message
                    ),
                ))
            },
        )?;
    }
    let (_, note) = ops::pause(&st, sid).await?;
    Ok((StatusCode::NO_CONTENT, Extension(note)).into_response())
}

/// `connect` (v1 and v2) and the older `resume`: resumes a paused sandbox (201) or extends a
/// running one's timeout (200). As on E2B's server, connect only ever extends: a running
/// sandbox's end becomes the later of its current end and now + `timeout` (the SDKs send their
/// default 300 s on every connect, which must not cut a sandbox created for an hour short).
async fn connect(
    State(st): State<AppState>,
    Extension(key): Extension<PresentedKey>,
    Path(id): Path<String>,
    raw: Bytes,
) -> E2bResult<Response> {
    let req: TimeoutBody = body(&raw)?;
    let sid = e2b_id(&id)?;
    let before = ops::get(&st, sid.clone()).await?;
    let (info, note) = ops::connect(&st, sid.clone(), ConnectSandbox { timeout: req.timeout }).await?;
    let note = Extension(note);
    never_earlier(&st, sid, &before, &info).await?;
    let status = if before.state == StateName::Paused { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, note, Json(created(&st, &info, &key))).into_response())
}

/// Whether E2B's `templateID` names one of branchbox's snapshots (by id, or by a name no
/// template has): E2B's SDKs create a sandbox from a snapshot by passing it as the template.
async fn snapshot_named(st: &AppState, name: &str) -> E2bResult<bool> {
    if SnapshotId::parse(name).is_ok() {
        return Ok(true);
    }
    if branchbox_model::check_snapshot_ref(name).is_err() {
        return Ok(false);
    }
    let n = name.to_string();
    Ok(st
        .blocking(move |engine, _| {
            let template = engine.templates()?.iter().any(|t| t.spec.name == n);
            Ok(!template && engine.find_snapshot(&n).is_ok_and(|s| s.kind == SnapshotKind::Snapshot))
        })
        .await?)
}

/// E2B's `SandboxForkRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ForkBody {
    timeout: Option<f64>,
    count: Option<u32>,
}

/// E2B's per-fork answer: the sandbox, or why it did not start.
#[derive(Debug, Serialize)]
struct E2bForkResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    sandbox: Option<E2bSandbox>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<serde_json::Value>,
}

/// `fork`: branchbox's own fork (one fork point, `count` children restored from it, the source
/// running on), each child answered as E2B's create answers, with its access token; `timeout`
/// (s) is each child's, else they inherit the source's. A child that did not start is its
/// error, as on E2B's server.
async fn fork(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(key): Extension<PresentedKey>,
    Path(id): Path<String>,
    raw: Bytes,
) -> E2bResult<Response> {
    let req: ForkBody = body(&raw)?;
    let sid = e2b_id(&id)?;
    if let Some(t) = req.timeout.filter(|t| !(t.is_finite() && *t > 0.0)) {
        return Err(E2bError(ApiError::bad_request(
            "bad_body",
            format!("timeout {t} must be above 0 seconds"),
        )));
    }
    let (out, note) = ops::fork(&st, caller, sid.clone(), ForkSandbox { count: req.count }).await?;
    let note = Extension(note);
    let (st2, parent) = (st.clone(), sid.to_string());
    let template = st.blocking(move |_, _| Ok(st2.db().e2b_template(&parent)?)).await?;
    let mut answers = Vec::new();
    for child in &out.children {
        let Some(info) = &child.sandbox else {
            let e = child.error.as_ref();
            let status = match e.map(|e| e.code.as_str()) {
                Some("not_found") => 404,
                Some("invalid_input") => 400,
                Some("conflict") => 409,
                Some("unavailable") => 503,
                _ => 500,
            };
            let message = e.map_or_else(|| "the fork did not start".to_string(), |e| e.message.clone());
            answers.push(E2bForkResult {
                sandbox: None,
                error: Some(serde_json::json!({ "code": status, "message": message })),
            });
            continue;
        };
        if let Some(timeout) = req.timeout {
            let _set =
                ops::set_timeout(&st, crate::extract::sandbox_id(&info.id)?, SetTimeout { timeout }).await?;
        }
        if let Some(t) = template.clone() {
            let (st2, id) = (st.clone(), info.id.clone());
            st.blocking(move |_, _| Ok(st2.db().set_e2b_template(&id, &t)?)).await?;
        }
        answers.push(E2bForkResult { sandbox: Some(created(&st, info, &key)), error: None });
    }
    Ok((StatusCode::CREATED, note, Json(answers)).into_response())
}

/// E2B's `SandboxSnapshotRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SnapshotBody {
    name: Option<String>,
    memory: Option<bool>,
}

/// E2B's `SnapshotInfo`.
#[derive(Debug, Serialize)]
struct E2bSnapshot {
    #[serde(rename = "snapshotID")]
    snapshot_id: String,
    names: Vec<String>,
}

fn e2b_snapshot(s: &crate::ops::types::SnapshotInfo) -> E2bSnapshot {
    E2bSnapshot { snapshot_id: s.id.clone(), names: s.name.iter().cloned().collect() }
}

/// `snapshots`: a branchbox snapshot of the running sandbox (processes, memory and files; it
/// runs on), named when `name` is given. One without memory is refused, as for pause.
async fn take_snapshot(
    State(st): State<AppState>,
    Path(id): Path<String>,
    raw: Bytes,
) -> E2bResult<Response> {
    let req: SnapshotBody = body(&raw)?;
    let sid = e2b_id(&id)?;
    if req.memory == Some(false) {
        return Err(not_served(
            "a snapshot without memory (memory: false): branchbox's snapshots keep the memory",
        ));
    }
    let (snap, note) = crate::ops::snapshots::capture(&st, sid, SnapshotKind::Snapshot, req.name).await?;
    Ok((StatusCode::CREATED, Extension(note), Json(e2b_snapshot(&snap))).into_response())
}

/// The query of E2B's snapshot listing.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SnapshotQuery {
    #[serde(rename = "sandboxID")]
    sandbox_id: Option<String>,
    name: Option<String>,
    limit: Option<u32>,
    next_token: Option<String>,
}

/// `GET /snapshots`: the snapshots (not checkpoints or fork points) still held, oldest first,
/// filtered by the sandbox they were taken of and by name, `limit` a page with the next
/// page's token in `x-next-token`.
async fn list_snapshots(
    State(st): State<AppState>,
    ApiQuery(q): ApiQuery<SnapshotQuery>,
) -> E2bResult<Response> {
    let limit = q.limit.unwrap_or(100);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(bad_query(format!("limit {limit} is not between 1 and {MAX_PAGE}")));
    }
    let from = q.next_token.as_deref().filter(|t| !t.is_empty()).map(page_token_snapshot).transpose()?;
    let all = crate::ops::snapshots::list(&st).await?;
    let mut found: Vec<_> = all
        .iter()
        .filter(|s| s.kind == "snapshot" && !s.deleted)
        .filter(|s| q.sandbox_id.as_deref().is_none_or(|id| s.source.as_deref() == Some(id)))
        .filter(|s| q.name.as_deref().is_none_or(|n| s.name.as_deref() == Some(n)))
        .filter(|s| from.as_ref().is_none_or(|(ms, id)| (s.created_ms, &s.id) > (*ms, id)))
        .collect();
    found.sort_by(|a, b| (a.created_ms, &a.id).cmp(&(b.created_ms, &b.id)));
    let more = found.len() > limit as usize;
    found.truncate(limit as usize);
    let next = more.then(|| found.last().map(|s| format!("{}.{}", s.created_ms, s.id))).flatten();
    let page: Vec<E2bSnapshot> = found.into_iter().map(e2b_snapshot).collect();
    let mut r = Json(page).into_response();
    if let Some(v) = next.and_then(|n| axum::http::HeaderValue::from_str(&n).ok()) {
        r.headers_mut().insert("x-next-token", v);
    }
    Ok(r)
}

/// A snapshot listing's `nextToken` (`<ms>.<snapshot id>`).
fn page_token_snapshot(t: &str) -> E2bResult<(i64, String)> {
    let bad = || bad_query(format!("nextToken {:?} is not one this service handed out", shown(t)));
    let (ms, id) = t.split_once('.').ok_or_else(bad)?;
    let ms = ms.parse::<i64>().map_err(|_| bad())?;
    SnapshotId::parse(id).map_err(|_| bad())?;
    Ok((ms, id.to_string()))
}

/// `DELETE /templates/{id}`, which E2B's SDKs call to delete a snapshot: deletes the snapshot
/// of that id or name (404 when there is none: `delete_snapshot` answers False). Deleting one
/// of branchbox's templates this way is not served.
async fn delete_snapshot(State(st): State<AppState>, Path(id): Path<String>) -> E2bResult<Response> {
    let missing = || E2bError(ApiError::not_found(format!("snapshot {:?} not found", shown(&id))));
    if branchbox_model::check_snapshot_ref(&id).is_err() {
        return Err(missing());
    }
    let n = id.clone();
    let kind = st
        .blocking(move |engine, _| {
            if engine.templates()?.iter().any(|t| t.spec.name == n) {
                return Ok(None);
            }
            Ok(Some(engine.find_snapshot(&n).ok().filter(|s| s.deleted_ms.is_none()).map(|s| s.kind)))
        })
        .await?;
    match kind {
        None => Err(not_served("deleting a template (DELETE /templates/{id})")),
        Some(Some(SnapshotKind::Snapshot)) => {
            let note = crate::ops::snapshots::delete(&st, crate::extract::snapshot_ref(&id)?, false).await?;
            Ok((StatusCode::NO_CONTENT, Extension(note)).into_response())
        }
        Some(_) => Err(missing()),
    }
}

/// E2B's `Template`, for the default image and each of the service's templates.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct E2bTemplate {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "buildID")]
    build_id: String,
    cpu_count: u32,
    #[serde(rename = "memoryMB")]
    memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    disk_size_mb: u64,
    public: bool,
    aliases: Vec<String>,
    names: Vec<String>,
    created_at: String,
    updated_at: String,
    created_by: Option<()>,
    last_spawned_at: Option<()>,
    spawn_count: u64,
    build_count: u64,
    envd_version: &'static str,
    build_status: &'static str,
}

async fn templates(State(st): State<AppState>) -> E2bResult<Json<Vec<E2bTemplate>>> {
    let limits = st.cfg.engine.limits;
    let all = st.blocking(|engine, _| Ok(engine.templates()?)).await?;
    let epoch = rfc3339_ms(0);
    let entry = |name: &str, build: String, ready: bool| E2bTemplate {
        template_id: name.to_string(),
        build_id: build,
        cpu_count: limits.cpus,
        memory_mb: limits.memory_mib,
        disk_size_mb: 0,
        public: false,
        aliases: vec![name.to_string()],
        names: vec![name.to_string()],
        created_at: epoch.clone(),
        updated_at: epoch.clone(),
        created_by: None,
        last_spawned_at: None,
        spawn_count: 0,
        build_count: 1,
        envd_version: ENVD_VERSION,
        build_status: if ready { "ready" } else { "error" },
    };
    let mut out = vec![entry("base", branchbox_core::DEFAULT_IMAGE.to_string(), true)];
    for t in &all {
        let ready = matches!(t.status, branchbox_core::TemplateStatus::Ready);
        let build = t.built.as_ref().map(|b| b.snapshot.to_string()).unwrap_or_default();
        out.push(entry(&t.spec.name, build, ready));
    }
    Ok(Json(out))
}
