//! The E2B adapter's routes and its own state: the control plane (`rest.rs`) and the data
//! plane (envd's calls) under [`super::PREFIX`], each with its authentication and the audit
//! log, and [`E2bState`], what the data plane's calls hold between requests.

use super::terminals::Terminals;
use super::uploads::Uploads;
use super::watch::Watchers;
use super::{envd, files, follow, header, rest, watch, E2bError, PresentedKey, PREFIX};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::middleware::AuditNote;
use crate::state::AppState;
use axum::extract::{FromRef, Request, State};
use axum::http::StatusCode;
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use branchbox_e2b_wire::connect::RpcError;
use std::sync::Arc;

/// The E2B adapter's state: the shared state, and the terminals, polling watchers and uploads
/// opened through envd's API. Handlers take the part they need (`State<AppState>`,
/// `State<Arc<Terminals>>`, ...).
#[derive(Clone)]
pub struct E2bState {
    app: AppState,
    terminals: Arc<Terminals>,
    watchers: Arc<Watchers>,
    uploads: Arc<Uploads>,
}

impl E2bState {
    /// The adapter's state over the shared one, with nothing open yet.
    pub fn new(app: AppState) -> E2bState {
        E2bState {
            app,
            terminals: Default::default(),
            watchers: Default::default(),
            uploads: Default::default(),
        }
    }
}

impl FromRef<E2bState> for AppState {
    fn from_ref(s: &E2bState) -> AppState {
        s.app.clone()
    }
}

impl FromRef<E2bState> for Arc<Terminals> {
    fn from_ref(s: &E2bState) -> Arc<Terminals> {
        s.terminals.clone()
    }
}

impl FromRef<E2bState> for Arc<Watchers> {
    fn from_ref(s: &E2bState) -> Arc<Watchers> {
        s.watchers.clone()
    }
}

impl FromRef<E2bState> for Arc<Uploads> {
    fn from_ref(s: &E2bState) -> Arc<Uploads> {
        s.uploads.clone()
    }
}

fn unauthorized(why: &str) -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        format!("{why}; send the token from <data>/service/token as E2B_API_KEY (the X-API-Key header)"),
    )
}

/// Control-plane authentication: `X-API-Key: <token>` (or `Authorization: Bearer <token>`).
async fn api_key(State(st): State<AppState>, mut req: Request, next: Next) -> Response {
    let key = header(req.headers(), "x-api-key").map(str::to_string);
    let caller = match (&st.tokens, &key) {
        (None, _) => Caller("anonymous".into()),
        (Some(t), Some(k)) => match (k.len() <= 512).then(|| t.check(k)).flatten() {
            Some(c) => c,
            None => return E2bError(unauthorized("the API key is not valid")).into_response(),
        },
        (Some(t), None) => match t.authenticate(req.headers()) {
            Ok(c) => c,
            Err(_) => return E2bError(unauthorized("no API key")).into_response(),
        },
    };
    let presented = key.or_else(|| {
        header(req.headers(), "authorization")
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(|t| t.trim().to_string())
    });
    req.extensions_mut().insert(caller);
    req.extensions_mut().insert(PresentedKey(st.tokens.as_ref().and(presented)));
    next.run(req).await
}

/// The routes under [`PREFIX`], with their authentication and the audit log. As on `/v1`, the
/// audit layer runs inside authentication, so each record names the caller's token.
pub fn router(st: AppState) -> Router {
    let audit = from_fn_with_state(st.clone(), crate::middleware::audit);
    let audit_files = audit.clone();
    let (templates, template_files) = super::templates::routes(&st);
    let control = rest::router()
        .merge(templates)
        .layer(axum::middleware::from_fn(note_sandbox))
        .layer(audit.clone())
        .layer(from_fn_with_state(st.clone(), api_key));
    let data = envd_routes()
        .layer(axum::middleware::from_fn(note_sandbox))
        .layer(audit)
        .layer(from_fn_with_state(st.clone(), envd::authenticate))
        .with_state(E2bState::new(st.clone()));
    // E2B's SDK puts a COPY's files to the link it was handed, without the API key: that route
    // authenticates by the link's one-use token (templates.rs).
    let control = control.with_state(st).merge(template_files.layer(audit_files));
    Router::new().nest(PREFIX, control.merge(Router::new().nest("/envd", data)))
}

/// Names the sandbox a request acted on for its audit record, where its handler did not: the
/// data plane's `E2b-Sandbox-Id`, or the control plane's `/sandboxes/{id}` (the path as seen
/// here, under the prefix).
async fn note_sandbox(req: Request, next: Next) -> Response {
    let named = match req.extensions().get::<envd::Target>() {
        Some(t) => Some(t.sandbox.to_string()),
        None => {
            let p = req.uri().path();
            let rest = p.strip_prefix("/v2/sandboxes/").or_else(|| p.strip_prefix("/sandboxes/"));
            rest.and_then(|r| r.split('/').next())
                .filter(|id| branchbox_model::SandboxId::parse(id).is_ok())
                .map(str::to_string)
        }
    };
    let mut r = next.run(req).await;
    if let Some(id) = named {
        let mut note = r.extensions().get::<AuditNote>().cloned().unwrap_or_default();
        note.sandbox.get_or_insert(id);
        r.extensions_mut().insert(note);
    }
    r
}

/// The data plane's routes (relative to `/e2b/envd`).
fn envd_routes() -> Router<E2bState> {
    Router::new()
        .route("/health", get(envd::health))
        .route("/files", get(files::read_file).post(files::write_file))
        .route("/process.Process/Start", post(follow::start))
        .route("/process.Process/List", post(follow::list))
        .route("/process.Process/SendSignal", post(follow::send_signal))
        .route("/process.Process/Connect", post(follow::connect_to))
        .route("/process.Process/SendInput", post(follow::send_input))
        .route("/process.Process/StreamInput", post(follow::stream_input))
        .route("/process.Process/CloseStdin", post(follow::close_stdin))
        .route("/process.Process/Update", post(follow::update))
        .route("/filesystem.Filesystem/Stat", post(files::stat))
        .route("/filesystem.Filesystem/ListDir", post(files::list_dir))
        .route("/filesystem.Filesystem/MakeDir", post(files::make_dir))
        .route("/filesystem.Filesystem/Move", post(files::move_path))
        .route("/filesystem.Filesystem/Remove", post(files::remove))
        .route("/filesystem.Filesystem/WatchDir", post(watch::watch_dir))
        .route("/filesystem.Filesystem/CreateWatcher", post(watch::create_watcher))
        .route("/filesystem.Filesystem/GetWatcherEvents", post(watch::get_watcher_events))
        .route("/filesystem.Filesystem/RemoveWatcher", post(watch::remove_watcher))
        .fallback(|| async { envd::error_response(&RpcError::unimplemented("no such envd method or route")) })
}
