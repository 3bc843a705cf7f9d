//! Templates: build (progress and command output streamed as server-sent events), list, get,
//! delete, and the last build's log. Sandboxes start from one with `POST /v1/sandboxes
//! {"template": NAME}`.
//!
//! Over HTTP a template's files travel inline (`file` steps): an `upload` step names a path on
//! the service's host, which a client must not be able to read into a sandbox.

use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::ApiJson;
use crate::middleware::AuditNote;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::IntoResponse;
use axum::{Extension, Json};
use branchbox_core::{BuildEvent, Template, TemplateStatus};
use branchbox_template::{Step, TemplateSpec};
use futures_util::Stream;
use serde::{Deserialize, Serialize};
use std::convert::Infallible;
use utoipa::ToSchema;

/// A template to build: the same shape as a template file (docs/templates.md).
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BuildTemplate {
    /// Its name (the snapshot naming rule).
    pub name: String,
    /// `default`, `image:NAME`, `template:NAME` or a bare name (default: `default`).
    pub base: Option<String>,
    /// Steps, each an object with exactly one of `run` (string or list), `file` (with
    /// `content`, optional `mode`), `env` (object), `workdir`, `user`.
    #[schema(value_type = Vec<Object>)]
    pub steps: Option<Vec<serde_json::Value>>,
}

/// A template and its last build.
#[derive(Debug, Serialize, ToSchema)]
pub struct TemplateInfo {
    /// Name.
    pub name: String,
    /// Base.
    pub base: String,
    /// Number of steps.
    pub steps: usize,
    /// `ready` or `failed`.
    pub state: String,
    /// The step (1-based) the last build failed at.
    pub failed_step: Option<usize>,
    /// Its exit code, when it ran a command.
    pub exit_code: Option<i32>,
    /// The snapshot sandboxes of the template start from (the last successful build).
    pub snapshot: Option<String>,
    /// How long the last build took, ms.
    pub build_ms: u64,
    /// The whole record: definition, per-step chain keys and snapshots, defaults.
    #[schema(value_type = Object)]
    pub record: serde_json::Value,
}

impl TemplateInfo {
    fn new(t: &Template) -> TemplateInfo {
        let (state, failed_step, exit_code) = match &t.status {
            TemplateStatus::Ready => ("ready", None, None),
            TemplateStatus::Failed { step, exit_code, .. } => ("failed", Some(*step), *exit_code),
        };
        TemplateInfo {
            name: t.spec.name.clone(),
            base: t.spec.base.clone(),
            steps: t.spec.steps.len(),
            state: state.into(),
            failed_step,
            exit_code,
            snapshot: t.built.as_ref().map(|b| b.snapshot.to_string()),
            build_ms: t.build_ms,
            record: serde_json::to_value(t).unwrap_or_default(),
        }
    }
}

/// One server-sent event of a build.
#[derive(Debug, Serialize, ToSchema)]
pub struct BuildStreamEvent {
    /// `step`, `output`, `step_done`, then `done` or `error`.
    pub event: String,
    /// JSON: `{index, total, step, cached}` for `step`; `{stream, data}` for `output`;
    /// `{index, snapshot, cached, ms}` for `step_done`; the template for `done`;
    /// `{"error": {code, message}}` for `error`.
    pub data: String,
}

fn spec_of(req: BuildTemplate) -> ApiResult<TemplateSpec> {
    let value = serde_json::json!({
        "name": req.name,
        "base": req.base.unwrap_or_else(|| branchbox_template::DEFAULT_IMAGE.to_string()),
        "steps": req.steps.unwrap_or_default(),
    });
    let spec: TemplateSpec = serde_json::from_value(value)
        .map_err(|e| ApiError::invalid(format!("the template does not parse: {e}")))?;
    spec.validate().map_err(|e| ApiError::invalid(e.to_string()))?;
    if let Some(Step::Upload { src, .. }) = spec.steps.iter().find(|s| matches!(s, Step::Upload { .. })) {
        return Err(ApiError::invalid(format!(
            "upload {src:?}: upload steps read the service host's files and are not accepted over HTTP; send the \
             content inline in a `file` step"
        )));
    }
    Ok(spec)
}

fn event(name: &str, data: String) -> Result<Event, Infallible> {
    Ok(Event::default().event(name).data(data))
}

/// Builds a template, reusing cached steps, and streams progress: `step`, `output` and
/// `step_done` events, then `done` with the template or `error` (a failed step names itself and
/// its exit code; `GET /v1/templates/{name}/log` has the log).
#[utoipa::path(post, path = "/v1/templates", tag = "templates", request_body = BuildTemplate,
    responses((status = 200, content_type = "text/event-stream", body = BuildStreamEvent, description = "progress, then done or error"),
              (status = "4XX", body = ErrorBody, description = "invalid template"),
              (status = 503, body = ErrorBody, description = "at_capacity: the service runs as many sandboxes as --max-sandboxes allows")))]
pub async fn build(
    State(st): State<AppState>,
    ApiJson(req): ApiJson<BuildTemplate>,
) -> ApiResult<(Extension<AuditNote>, Sse<impl Stream<Item = Result<Event, Infallible>>>)> {
    let spec = spec_of(req)?;
    let note = AuditNote { detail: Some(format!("template {}", spec.name)), ..Default::default() };
    // A build runs its steps in a sandbox of its own: it is admitted against --max-sandboxes
    // like a create, and holds its place until it ends (so many builds at once cannot start
    // more sandboxes than the cap allows; its own sandbox may count twice meanwhile).
    let place = st.blocking(|engine, st| st.reserve(engine, 1)).await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event, Infallible>>(64);
    tokio::spawn(async move {
        let out = tx.clone();
        let done = st
            .blocking(move |engine, _| {
                let _place = place;
                let mut gone = false;
                let r = engine.build_template(spec, None, &mut |ev| {
                    let name = match ev {
                        BuildEvent::Step { .. } => "step",
                        BuildEvent::Output { .. } => "output",
                        BuildEvent::StepDone { .. } => "step_done",
                    };
                    // A client that left does not stop the build: its steps still get cached.
                    if !gone {
                        let data = serde_json::to_value(ev).unwrap_or_default().to_string();
                        gone = out.blocking_send(event(name, data)).is_err();
                    }
                });
                Ok(r?)
            })
            .await;
        let last = match done {
            Ok(t) => event("done", serde_json::to_string(&TemplateInfo::new(&t)).unwrap_or_default()),
            Err(e) => event("error", serde_json::to_string(&e.body()).unwrap_or_default()),
        };
        let _ = tx.send(last).await;
    });
    Ok((
        Extension(note),
        Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx)).keep_alive(KeepAlive::default()),
    ))
}

/// Lists templates.
#[utoipa::path(get, path = "/v1/templates", tag = "templates",
    responses((status = 200, body = Vec<TemplateInfo>), (status = "4XX", body = ErrorBody, description = "no or bad token")))]
pub async fn list(State(st): State<AppState>) -> ApiResult<Json<Vec<TemplateInfo>>> {
    let all = st.blocking(|engine, _| Ok(engine.templates()?)).await?;
    Ok(Json(all.iter().map(TemplateInfo::new).collect()))
}

/// One template.
#[utoipa::path(get, path = "/v1/templates/{name}", tag = "templates",
    params(("name" = String, Path, description = "template name")),
    responses((status = 200, body = TemplateInfo), (status = "4XX", body = ErrorBody, description = "bad name, not found")))]
pub async fn get(State(st): State<AppState>, Path(name): Path<String>) -> ApiResult<Json<TemplateInfo>> {
    let t = st.blocking(move |engine, _| Ok(engine.template(&name)?)).await?;
    Ok(Json(TemplateInfo::new(&t)))
}

/// Removes a template and releases its cached steps; its running sandboxes keep running.
#[utoipa::path(delete, path = "/v1/templates/{name}", tag = "templates",
    params(("name" = String, Path, description = "template name")),
    responses((status = 204, description = "removed"), (status = "4XX", body = ErrorBody, description = "bad name, not found, being built (409)")))]
pub async fn delete(
    State(st): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<(StatusCode, Extension<AuditNote>)> {
    let note = AuditNote { detail: Some(format!("template {name}")), ..Default::default() };
    st.blocking(move |engine, _| Ok(engine.delete_template(&name)?)).await?;
    Ok((StatusCode::NO_CONTENT, Extension(note)))
}

/// The log of a template's last build (steps and their commands' output, at most 16 MiB).
#[utoipa::path(get, path = "/v1/templates/{name}/log", tag = "templates",
    params(("name" = String, Path, description = "template name")),
    responses((status = 200, content_type = "text/plain", body = String), (status = "4XX", body = ErrorBody, description = "bad name, not found")))]
pub async fn log(State(st): State<AppState>, Path(name): Path<String>) -> ApiResult<impl IntoResponse> {
    let text = st
        .blocking(move |engine, _| {
            engine.template(&name)?;
            let path = engine.template_log_path(&name)?;
            std::fs::read(&path).map_err(|e| ApiError::from(branchbox_model::Error::io(&path, e)))
        })
        .await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text))
}
