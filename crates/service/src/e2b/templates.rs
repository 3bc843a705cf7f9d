//! E2B's template builds (the SDK's `Template.build`, `build_in_background` and
//! `get_build_status`) on branchbox's template engine. The SDK's calls, in order:
//!
//! ```text
//! POST /v3/templates                                  name -> templateID (the name), buildID
//! GET  /templates/{id}/files/{hash}                   per COPY: {present, url}, url one-use
//! PUT  <url> = /e2b/template-files/{token}            the COPY's tar(.gz), size-limited
//! POST /v2/templates/{id}/builds/{buildID}            the steps (template_build.rs), 202
//! GET  /templates/{id}/builds/{buildID}/status        building | ready | error, logs by offset
//! ```
//!
//! The build itself is [`branchbox_core::Engine::build_template_limited`], so its steps are
//! cached and `Sandbox.create(name)` starts from its last snapshot as from any template, with
//! the limits the request gave (`cpuCount`, `memoryMB`), which that snapshot keeps. A COPY's upload is
//! kept under the template whose link it came through, so only that template's `present`
//! answers and builds ever see it, and is unpacked into the build's own context directory when
//! it hashes to the step's `filesHash`, or, unverified, when it holds a directory
//! (`template_files.rs`: E2B's JavaScript SDK hashes directory sizes). Builds and upload links
//! live in memory (a restart forgets builds in progress; the templates they made stay), each map
//! bounded.

use super::template_build::{self, BuildStart, Copy};
use super::template_files::{read_archive, Uploads, MAX_ARCHIVE_BYTES};
use super::template_logs::Follow;
use super::{E2bError, PREFIX};
use crate::error::ApiError;
use crate::extract::ApiQuery;
use crate::state::AppState;
use axum::body::{Body, Bytes};
use axum::extract::{FromRef, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use branchbox_model::Limits;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

type E2bResult<T> = Result<T, E2bError>;

/// Most builds remembered; the oldest finished one is forgotten first.
const MAX_BUILDS: usize = 256;
/// Most upload links open at once; the oldest is dropped first.
const MAX_LINKS: usize = 1024;
/// How long an upload link stays usable.
const LINK_TTL: Duration = Duration::from_secs(3600);
/// Most log entries one build keeps; later ones are counted in a last entry.
const MAX_LOG_ENTRIES: usize = 20_000;
/// Most entries one status answer carries (E2B's own page).
const PAGE: usize = 100;

/// Where a build is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Waiting,
    Building,
    Ready,
    Error,
}

impl Phase {
    fn as_str(self) -> &'static str {
        match self {
            Phase::Waiting => "waiting",
            Phase::Building => "building",
            Phase::Ready => "ready",
            Phase::Error => "error",
        }
    }
}

/// E2B's `BuildLogEntry`.
#[derive(Debug, Clone, Serialize)]
struct LogEntry {
    timestamp: String,
    level: &'static str,
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<String>,
}

/// E2B's `BuildStatusReason`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct Reason {
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<String>,
    log_entries: Vec<LogEntry>,
}

struct Build {
    template: String,
    /// The limits the request gave (`cpuCount`, `memoryMB`), for the template's sandboxes.
    limits: Option<Limits>,
    phase: Phase,
    logs: Vec<LogEntry>,
    dropped: usize,
    reason: Option<Reason>,
    made: Instant,
}

struct Link {
    template: String,
    hash: String,
    made: Instant,
}

#[derive(Default)]
struct Inner {
    builds: HashMap<String, Build>,
    links: HashMap<String, Link>,
}

/// The builds E2B's SDK requested and the upload links handed out.
pub struct Builds {
    root: PathBuf,
    uploads: Uploads,
    inner: Mutex<Inner>,
}

fn now() -> String {
    super::pb::Timestamp::from_ns(branchbox_model::now_ms().saturating_mul(1_000_000)).rfc3339()
}

impl Builds {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn log(&self, build: &str, level: &'static str, step: Option<&str>, message: String) {
        let mut g = self.lock();
        let Some(b) = g.builds.get_mut(build) else { return };
        if b.logs.len() >= MAX_LOG_ENTRIES {
            b.dropped += 1;
            return;
        }
        b.logs.push(LogEntry { timestamp: now(), level, message, step: step.map(str::to_string) });
    }

    fn finish(&self, build: &str, phase: Phase, reason: Option<Reason>) {
        let mut g = self.lock();
        if let Some(b) = g.builds.get_mut(build) {
            if b.dropped > 0 {
                let message = format!("[{} more log entries were not kept]", b.dropped);
                b.logs.push(LogEntry { timestamp: now(), level: "warn", message, step: None });
            }
            b.phase = phase;
            b.reason = reason;
        }
    }
}

/// The routes' state: the shared one and the builds.
#[derive(Clone)]
pub struct TemplateState {
    app: AppState,
    builds: Arc<Builds>,
}

impl FromRef<TemplateState> for AppState {
    fn from_ref(s: &TemplateState) -> AppState {
        s.app.clone()
    }
}

/// The control plane's template routes (authenticated by the API key where they are merged)
/// and the upload route (authenticated by its one-use link), each with its state applied.
pub fn routes<S: Clone + Send + Sync + 'static>(app: &AppState) -> (Router<S>, Router) {
    let root = app.cfg.engine.data_dir.join("e2b-templates");
    let builds = Builds { uploads: Uploads::new(root.join("files")), root, inner: Default::default() };
    let st = TemplateState { app: app.clone(), builds: Arc::new(builds) };
    let control = Router::new()
        .route("/v3/templates", post(request_build))
        .route("/templates/{id}/files/{hash}", get(upload_link))
        .route("/v2/templates/{id}/builds/{build}", post(start_build))
        .route("/templates/{id}/builds/{build}/status", get(status))
        .route("/templates/aliases/{alias}", get(alias))
        .with_state(st.clone());
    let uploads = Router::new().route("/template-files/{token}", put(upload)).with_state(st);
    (control, uploads)
}

fn bad(code: &'static str, message: impl Into<String>) -> E2bError {
    E2bError(ApiError::bad_request(code, message))
}

fn name_of(id: &str) -> E2bResult<String> {
    if id.contains(':') {
        return Err(bad(
            "not_served",
            "tags (name:tag) are not served: a branchbox template keeps one build",
        ));
    }
    branchbox_model::Name::parse("template name", id)
        .map(|n| n.to_string())
        .map_err(|e| bad("bad_name", e.to_string()))
}

fn json<T: serde::de::DeserializeOwned>(raw: &Bytes) -> E2bResult<T> {
    let raw: &[u8] = if raw.iter().all(u8::is_ascii_whitespace) { b"{}" } else { raw };
    serde_json::from_slice(raw)
        .map_err(|e| bad("not_served", format!("the JSON body does not fit this operation: {e}")))
}

/// E2B's `TemplateBuildRequestV3`: what is served is the name (or the older alias) and the
/// sandboxes' CPUs and memory.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct BuildRequest {
    name: Option<String>,
    alias: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(rename = "teamID")]
    team_id: Option<String>,
    cpu_count: Option<serde_json::Number>,
    #[serde(rename = "memoryMB")]
    memory_mb: Option<serde_json::Number>,
    #[serde(rename = "minFreeDiskMb")]
    min_free_disk_mb: Option<u64>,
}

async fn request_build(State(st): State<TemplateState>, raw: Bytes) -> E2bResult<Response> {
    let req: BuildRequest = json(&raw)?;
    let refused = [
        ("tags", !req.tags.is_empty(), "a branchbox template keeps one build, under its name"),
        ("teamID", req.team_id.is_some(), "branchbox has no teams"),
        (
            "minFreeDiskMb",
            req.min_free_disk_mb.is_some(),
            "gVisor keeps a sandbox's files in memory, so memoryMB bounds them",
        ),
    ];
    if let Some((what, _, why)) = refused.iter().find(|r| r.1) {
        return Err(bad("not_served", format!("{what} is not served: {why}; leave it out")));
    }
    let limits =
        template_build::limits(req.cpu_count.as_ref(), req.memory_mb.as_ref(), st.app.cfg.engine.limits)
            .map_err(|m| bad("bad_limits", m))?;
    let name = name_of(req.name.or(req.alias).as_deref().unwrap_or(""))?;
    let build = format!("{:x}", u128::from_be_bytes(rand::random()));
    let build =
        format!("{}-{}-{}-{}-{}", &build[..8], &build[8..12], &build[12..16], &build[16..20], &build[20..]);
    {
        let mut g = st.builds.lock();
        if g.builds.len() >= MAX_BUILDS {
            let oldest = g
                .builds
                .iter()
                .filter(|(_, b)| b.phase != Phase::Building)
                .min_by_key(|(_, b)| b.made)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => drop(g.builds.remove(&k)),
                None => {
                    return Err(E2bError(ApiError::new(
                        StatusCode::TOO_MANY_REQUESTS,
                        "too_many_builds",
                        format!("{MAX_BUILDS} builds are running; retry when one ends"),
                    )))
                }
            }
        }
        let b = Build {
            template: name.clone(),
            limits,
            phase: Phase::Waiting,
            logs: Vec::new(),
            dropped: 0,
            reason: None,
            made: Instant::now(),
        };
        g.builds.insert(build.clone(), b);
    }
    let body = serde_json::json!({
        "templateID": name, "buildID": build, "public": false,
        "names": [name], "aliases": [name], "tags": [],
    });
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

fn check_hash(hash: &str) -> E2bResult<()> {
    if hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Ok(());
    }
    Err(bad("bad_hash", "the files hash must be 64 lowercase hex digits (the SDK's sha256)"))
}

/// `GET /templates/{id}/files/{hash}`: whether that upload is here, and a one-use link to put
/// it (on this service, under the host the request named).
async fn upload_link(
    State(st): State<TemplateState>,
    Path((id, hash)): Path<(String, String)>,
    headers: HeaderMap,
) -> E2bResult<Response> {
    let name = name_of(&id)?;
    check_hash(&hash)?;
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("127.0.0.1");
    let present = st.builds.uploads.present(&name, &hash);
    let token = hex::encode(rand::random::<[u8; 32]>());
    {
        let mut g = st.builds.lock();
        g.links.retain(|_, l| l.made.elapsed() < LINK_TTL);
        if g.links.len() >= MAX_LINKS {
            if let Some(k) = g.links.iter().min_by_key(|(_, l)| l.made).map(|(k, _)| k.clone()) {
                g.links.remove(&k);
            }
        }
        g.links.insert(token.clone(), Link { template: name, hash, made: Instant::now() });
    }
    let url = format!("http://{host}{PREFIX}/template-files/{token}");
    Ok((StatusCode::CREATED, Json(serde_json::json!({ "present": present, "url": url }))).into_response())
}

/// `PUT /e2b/template-files/{token}`: one COPY's archive, at most [`MAX_ARCHIVE_BYTES`],
/// checked to be a tar of regular files and directories within the limits before it is kept.
async fn upload(
    State(st): State<TemplateState>,
    Path(token): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> E2bResult<StatusCode> {
    let link = st.builds.lock().links.remove(&token).filter(|l| l.made.elapsed() < LINK_TTL);
    let Some(link) = link else {
        return Err(E2bError(ApiError::not_found(
            "no such upload link (each is used once, for an hour); ask GET /templates/{id}/files/{hash} for another",
        )));
    };
    let too_large = || {
        E2bError(ApiError::too_large(format!(
            "the upload is over {} MiB; copy less in one step",
            MAX_ARCHIVE_BYTES >> 20
        )))
    };
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_ARCHIVE_BYTES) {
        return Err(too_large());
    }
    let final_path = st.builds.uploads.path(&link.template, &link.hash);
    let dir = final_path.parent().map(PathBuf::from).unwrap_or_default();
    let part = dir.join(format!(".{}.part", hex::encode(rand::random::<[u8; 8]>())));
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(8);
    let (dir2, part2) = (dir.clone(), part.clone());
    let writer = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir2)?;
        Uploads::prune(&dir2);
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&part2)?;
        while let Some(b) = rx.blocking_recv() {
            f.write_all(&b)?;
        }
        Ok(())
    });
    let mut stream = body.into_data_stream();
    let mut total = 0u64;
    let mut failed = None;
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                failed = Some(bad("bad_body", format!("the upload broke off: {e}")));
                break;
            }
        };
        total += chunk.len() as u64;
        if total > MAX_ARCHIVE_BYTES {
            failed = Some(too_large());
            break;
        }
        if tx.send(chunk).await.is_err() {
            break;
        }
    }
    drop(tx);
    let wrote =
        writer.await.map_err(|e| E2bError(ApiError::internal(format!("the upload's writer failed: {e}"))))?;
    let failed = failed.or_else(|| {
        wrote.err().map(|e| E2bError(ApiError::internal(format!("the upload could not be stored: {e}"))))
    });
    if let Some(e) = failed {
        let _ = std::fs::remove_file(&part);
        return Err(e);
    }
    let (p2, f2) = (part.clone(), final_path);
    let checked = tokio::task::spawn_blocking(move || {
        read_archive(&p2, ("", ""), None)?;
        std::fs::rename(&p2, &f2).map_err(|e| format!("the upload could not be stored: {e}"))
    })
    .await
    .map_err(|e| E2bError(ApiError::internal(format!("the upload's check failed: {e}"))))?;
    if let Err(why) = checked {
        let _ = std::fs::remove_file(&part);
        return Err(bad("bad_archive", why));
    }
    Ok(StatusCode::OK)
}

/// `POST /v2/templates/{id}/builds/{build}`: checks the steps and the uploads, then builds in
/// the background (202); progress is read from the status route.
async fn start_build(
    State(st): State<TemplateState>,
    Path((id, build)): Path<(String, String)>,
    raw: Bytes,
) -> E2bResult<StatusCode> {
    let name = name_of(&id)?;
    let start: BuildStart = json(&raw)?;
    let plan = template_build::plan(&name, start).map_err(|m| bad("not_served", m))?;
    let limits = {
        let mut g = st.builds.lock();
        let b = g.builds.get_mut(&build).filter(|b| b.template == name).ok_or_else(|| {
            E2bError(ApiError::not_found(format!(
                "build {:?} of template {name} not found",
                build.chars().take(64).collect::<String>()
            )))
        })?;
        if b.phase != Phase::Waiting {
            return Err(E2bError(ApiError::new(
                StatusCode::CONFLICT,
                "conflict",
                "this build was already started",
            )));
        }
        b.phase = Phase::Building;
        b.limits
    };
    let ctx = st.builds.root.join("builds").join(&build);
    // A build uses up its uploads, whatever its end: the engine caches each COPY's result under
    // its content's hash, so a rebuild that changes nothing reuses it after uploading again.
    let used: Vec<PathBuf> = plan.copies.iter().map(|c| st.builds.uploads.path(&name, &c.hash)).collect();
    let prepared = prepare(&st, &build, &name, &plan.copies, ctx.clone()).await;
    let place = match prepared {
        Ok(()) => st.app.blocking(|engine, app| app.reserve(engine, 1)).await.map_err(E2bError),
        Err(e) => Err(e),
    };
    let place = match place {
        Ok(p) => p,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&ctx);
            used.iter().for_each(|a| drop(std::fs::remove_file(a)));
            let step = Some("base".to_string());
            let reason = Reason { message: e.0.message.clone(), step, log_entries: Vec::new() };
            st.builds.finish(&build, Phase::Error, Some(reason));
            return Err(e);
        }
    };
    tokio::spawn(async move {
        let builds = st.builds.clone();
        let (b2, id2, name2, ctx2) = (builds.clone(), build.clone(), name.clone(), ctx.clone());
        let done = st
            .app
            .blocking(move |engine, _| {
                let _place = place;
                let sink = move |level: &'static str, step: &str, message: String| {
                    b2.log(&id2, level, Some(step), message)
                };
                let mut f = Follow::new(plan.labels, sink);
                let r = engine.build_template_limited(plan.spec, limits, Some(&ctx2), &mut |ev| f.on(ev));
                f.flush();
                Ok((r.map_err(|e| ApiError::from(e).message), f.label(), f.tail().to_string()))
            })
            .await;
        let (result, label, tail) = match done {
            Ok(d) => d,
            Err(e) => (Err(e.message), "base".to_string(), String::new()),
        };
        match result {
            Ok(_) => {
                builds.log(&build, "info", None, format!("template {name2} is ready"));
                builds.finish(&build, Phase::Ready, None);
            }
            Err(m) => {
                let message =
                    if tail.is_empty() { m } else { format!("{m}\nthe step's output ends with:\n{tail}") };
                builds.log(&build, "error", Some(&label), message.clone());
                builds.finish(
                    &build,
                    Phase::Error,
                    Some(Reason { message, step: Some(label), log_entries: Vec::new() }),
                );
            }
        }
        let _ = std::fs::remove_dir_all(&ctx);
        used.iter().for_each(|a| drop(std::fs::remove_file(a)));
    });
    Ok(StatusCode::ACCEPTED)
}

/// Unpacks the COPYs' uploads into the build's context ([`Uploads::unpack`]) and says in the
/// build's log which were taken unverified.
async fn prepare(
    st: &TemplateState,
    build: &str,
    name: &str,
    copies: &[Copy],
    ctx: PathBuf,
) -> E2bResult<()> {
    let (builds, name, copies) = (st.builds.clone(), name.to_string(), copies.to_vec());
    let r = tokio::task::spawn_blocking(move || builds.uploads.unpack(&name, &copies, &ctx))
        .await
        .map_err(|e| E2bError(ApiError::internal(format!("unpacking the uploads failed: {e}"))))?;
    for (step, note) in r.map_err(|m| bad("bad_files", m))? {
        st.builds.log(build, "warn", Some(&step), note);
    }
    Ok(())
}

/// The status query the SDK sends.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct StatusQuery {
    logs_offset: Option<u64>,
    limit: Option<u32>,
    level: Option<String>,
}

fn rank(level: &str) -> u8 {
    match level {
        "debug" => 0,
        "info" => 1,
        "warn" => 2,
        _ => 3,
    }
}

/// `GET /templates/{id}/builds/{build}/status`: the phase, up to 100 log entries from
/// `logsOffset` (at `level` or above), and why a failed build failed.
async fn status(
    State(st): State<TemplateState>,
    Path((id, build)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<StatusQuery>,
) -> E2bResult<Response> {
    let name = name_of(&id)?;
    if let Some(l) = q.level.as_deref().filter(|l| !matches!(*l, "debug" | "info" | "warn" | "error")) {
        return Err(bad(
            "bad_query",
            format!("level {:?} is not debug, info, warn or error", l.chars().take(16).collect::<String>()),
        ));
    }
    let min = rank(q.level.as_deref().unwrap_or("debug"));
    let limit = (q.limit.unwrap_or(PAGE as u32) as usize).clamp(1, PAGE);
    let g = st.builds.lock();
    let b = g.builds.get(&build).filter(|b| b.template == name).ok_or_else(|| {
        E2bError(ApiError::not_found(format!(
            "build {:?} of template {name} not found",
            build.chars().take(64).collect::<String>()
        )))
    })?;
    let from = usize::try_from(q.logs_offset.unwrap_or(0)).unwrap_or(usize::MAX);
    let entries: Vec<LogEntry> =
        b.logs.iter().filter(|e| rank(e.level) >= min).skip(from).take(limit).cloned().collect();
    let mut body = serde_json::json!({
        "templateID": name, "buildID": build, "status": b.phase.as_str(),
        "logEntries": entries, "logs": [],
    });
    if let Some(r) = &b.reason {
        body["reason"] = serde_json::to_value(r).unwrap_or_default();
    }
    Ok(Json(body).into_response())
}

/// `GET /templates/aliases/{alias}`: whether a template of that name exists. `base`, E2B's
/// public template, is the default image here, as create and `GET /templates` take it.
async fn alias(State(st): State<TemplateState>, Path(alias): Path<String>) -> E2bResult<Response> {
    if alias == "base" {
        return Ok(Json(serde_json::json!({ "templateID": "base", "public": true })).into_response());
    }
    let name = name_of(&alias)?;
    let n = name.clone();
    let found = st.app.blocking(move |engine, _| Ok(engine.template(&n).is_ok())).await?;
    if !found {
        return Err(E2bError(ApiError::not_found(format!("template {name} not found"))));
    }
    Ok(Json(serde_json::json!({ "templateID": name, "public": false })).into_response())
}
