//! envd's directory watches: `WatchDir` (a stream of changes) and the polling trio
//! `CreateWatcher` / `GetWatcherEvents` / `RemoveWatcher` that the sync SDK's `files.watch_dir`
//! uses, through the agent's `watch`. Each answers once the agent's watch is in place, so no
//! change made after the client hears back is missed. A `WatchDir` stream ends as soon as its
//! client goes, quiet directory or not (its agent connection is shut, which frees the thread
//! reading it). Polling watchers buffer up to [`MAX_WATCH_EVENTS`] events each (the oldest are
//! dropped past that) and go when removed, when their sandbox goes (the agent connection
//! ends), after [`WATCHER_IDLE`] without a `GetWatcherEvents`, or when the service stops. Both
//! are bounded per sandbox, per token and in the service (`crate::streams::Kind`).

use super::connect::{self, Kind, RpcError};
use super::envd::{
    api, deadline_of, detach_of, envelope, keepalive_of, lock, place, resolve, stream_error, stream_kind,
    stream_response, unary, user_of, Target,
};
use super::pb;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;
use crate::streams::{self, Detach, Place};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Extension;
use branchbox_model::SandboxId;
use branchbox_protocol::{FileKind, WatchKind};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Events a polling watcher keeps until they are fetched.
pub const MAX_WATCH_EVENTS: usize = 10_000;
/// A polling watcher not polled for this long is removed.
pub const WATCHER_IDLE: Duration = Duration::from_secs(600);

/// A polling watcher: its buffered events and the agent connection that feeds them.
pub struct Watcher {
    sandbox: SandboxId,
    events: Mutex<VecDeque<pb::FilesystemEvent>>,
    polled: Mutex<Instant>,
    ended: AtomicBool,
    /// Shuts its agent connection when the watcher is dropped from the registry.
    detach: Detach,
    /// Its place under the watchers' bounds.
    _place: Place,
}

/// The polling watchers opened through envd's API, by id: the E2B adapter's own state.
#[derive(Default)]
pub struct Watchers {
    by_id: Mutex<HashMap<String, Arc<Watcher>>>,
}

impl Watchers {
    /// The watcher `id` of the sandbox, or envd's `not_found`.
    fn get(&self, sandbox: &SandboxId, id: &str) -> Result<Arc<Watcher>, RpcError> {
        lock(&self.by_id)
            .get(id)
            .filter(|w| w.sandbox == *sandbox)
            .cloned()
            .ok_or_else(|| RpcError::new("not_found", format!("no watcher {id:?} in this sandbox")))
    }

    /// Drops a watcher, shutting its agent connection.
    fn remove(&self, id: &str) {
        if let Some(w) = lock(&self.by_id).remove(id) {
            w.detach.shut();
        }
    }
}

fn event_type(k: WatchKind) -> i32 {
    match k {
        WatchKind::Create => pb::EVENT_TYPE_CREATE,
        WatchKind::Write => pb::EVENT_TYPE_WRITE,
        WatchKind::Remove => pb::EVENT_TYPE_REMOVE,
        WatchKind::Rename => pb::EVENT_TYPE_RENAME,
        WatchKind::Chmod => pb::EVENT_TYPE_CHMOD,
    }
}

/// envd's event: the name relative to the watched directory.
fn fs_event(root: &str, e: branchbox_protocol::WatchEvent) -> pb::FilesystemEvent {
    let base = root.trim_end_matches('/');
    let name = e.name.strip_prefix(base).map(|r| r.trim_start_matches('/')).unwrap_or(&e.name).to_string();
    pb::FilesystemEvent { name, r#type: event_type(e.kind) }
}

/// Checks a watch request and opens the agent connection that will follow it.
async fn open_watch(
    st: &AppState,
    id: &SandboxId,
    h: &HeaderMap,
    req: &pb::WatchRequest,
) -> Result<(String, branchbox_model::AgentConn), RpcError> {
    if req.include_entry {
        return Err(RpcError::unimplemented("include_entry needs envd 0.6.3, which is not claimed"));
    }
    let path = resolve(&req.path, &user_of(h)?)?;
    let (id, dir) = (id.clone(), path.clone());
    let conn = st
        .blocking(move |engine, st| {
            if st.agent(engine, &id, Duration::ZERO)?.stat(&dir)?.kind != FileKind::Dir {
                return Err(ApiError::invalid(format!("{dir} is not a directory; watch a directory")));
            }
            Ok(engine.connect(&id)?)
        })
        .await
        .map_err(api)?;
    Ok((path, conn))
}

/// `filesystem.Filesystem/WatchDir`: a start event, then one event per change, until the
/// client goes, the call's timeout passes or the directory goes.
pub async fn watch_dir(
    State(st): State<AppState>,
    Extension(t): Extension<Target>,
    caller: Option<Extension<Caller>>,
    h: HeaderMap,
    body: Body,
) -> Response {
    let kind = match stream_kind(&h, "WatchDir") {
        Ok(k) => k,
        Err(r) => return *r,
    };
    let Kind::Stream(codec) = kind else { unreachable!("matched") };
    let opened = async {
        let bytes = super::envd::read_body(body).await?;
        let req: pb::WatchRequest = connect::decode_request(kind, &bytes)?;
        let place = place(&st, streams::Kind::Follow, &t.sandbox, &caller)?;
        let (path, mut conn) = open_watch(&st, &t.sandbox, &h, &req).await?;
        let detach = detach_of(&mut conn)?;
        Ok::<_, RpcError>((path, conn, detach, place, req.recursive, deadline_of(&h)?))
    }
    .await;
    let (path, mut conn, detach, place, recursive, deadline) = match opened {
        Ok(o) => o,
        Err(e) => return stream_error(kind, &e),
    };
    // `None` first, once the agent's watch is in place: the start event goes out then, so no
    // change made after the client sees it is missed.
    let (etx, mut erx) = mpsc::channel::<Option<pb::FilesystemEvent>>(256);
    let root = path.clone();
    let worker = tokio::task::spawn_blocking(move || {
        let _place = place;
        conn.watch(&path, recursive, &mut |e| etx.blocking_send(e.map(|e| fs_event(&root, e))).is_ok())
    });
    let keepalive = keepalive_of(&h);
    let (tx, body) = mpsc::channel::<Bytes>(16);
    let stopping = st.streams.stopping();
    tokio::spawn(async move {
        tokio::pin!(stopping);
        let start = pb::WatchDirResponse { event: Some(pb::watch_dir::Event::Start(pb::Empty {})) };
        let period = Duration::from_secs(keepalive.unwrap_or(3600));
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        let until = tokio::time::Instant::now() + Duration::from_millis(deadline.unwrap_or(u64::MAX / 4));
        let mut end = None;
        {
            loop {
                tokio::select! {
                    e = erx.recv() => match e {
                        Some(None) => {
                            if tx.send(envelope(codec, &start)).await.is_err() {
                                break;
                            }
                        }
                        Some(Some(e)) => {
                            let m = pb::WatchDirResponse { event: Some(pb::watch_dir::Event::Filesystem(e)) };
                            if tx.send(envelope(codec, &m)).await.is_err() {
                                break;
                            }
                        }
                        None => {
                            end = Some(match worker.await {
                                Ok(Ok(_)) => None,
                                Ok(Err(e)) => Some(api(ApiError::from(e))),
                                Err(e) => Some(RpcError::new("internal", format!("a worker failed: {e}"))),
                            });
                            break;
                        }
                    },
                    _ = tick.tick(), if keepalive.is_some() => {
                        let m = pb::WatchDirResponse { event: Some(pb::watch_dir::Event::Keepalive(pb::Empty {})) };
                        if tx.send(envelope(codec, &m)).await.is_err() {
                            break;
                        }
                    }
                    _ = tokio::time::sleep_until(until), if deadline.is_some() => {
                        end = Some(Some(RpcError::new("deadline_exceeded", "the watch's timeout passed")));
                        break;
                    }
                    () = tx.closed() => break,
                    () = &mut stopping => {
                        end = Some(Some(RpcError::new("unavailable", "the service is stopping")));
                        break;
                    }
                }
            }
        }
        drop(detach);
        if let Some(e) = end {
            let _ = tx.send(Bytes::from(connect::end_stream(e.as_ref()))).await;
        }
    });
    stream_response(kind, body)
}

/// `filesystem.Filesystem/CreateWatcher`.
pub async fn create_watcher(
    State(st): State<AppState>,
    State(watchers): State<Arc<Watchers>>,
    Extension(t): Extension<Target>,
    caller: Option<Extension<Caller>>,
    h: HeaderMap,
    body: Body,
) -> Response {
    let h2 = h.clone();
    unary(&h, body, |req: pb::WatchRequest| async move {
        let place = place(&st, streams::Kind::Watcher, &t.sandbox, &caller)?;
        let (path, mut conn) = open_watch(&st, &t.sandbox, &h2, &req).await?;
        let detach = detach_of(&mut conn)?;
        let id = hex::encode(rand::random::<[u8; 16]>());
        let w = Arc::new(Watcher {
            sandbox: t.sandbox.clone(),
            events: Mutex::default(),
            polled: Mutex::new(Instant::now()),
            ended: AtomicBool::new(false),
            detach,
            _place: place,
        });
        lock(&watchers.by_id).insert(id.clone(), w.clone());
        let (all, id2, w2, recursive) = (watchers.clone(), id.clone(), w.clone(), req.recursive);
        // Answered once the agent's watch is in place, so no change made after it is missed.
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<()>();
        let mut ready_tx = Some(ready_tx);
        tokio::task::spawn_blocking(move || {
            let root = path.clone();
            let r = conn.watch(&path, recursive, &mut |e| {
                let Some(e) = e else {
                    if let Some(t) = ready_tx.take() {
                        let _ = t.send(());
                    }
                    return true;
                };
                let mut q = lock(&w2.events);
                if q.len() >= MAX_WATCH_EVENTS {
                    q.pop_front();
                }
                q.push_back(fs_event(&root, e));
                true
            });
            w2.ended.store(true, Ordering::SeqCst);
            // The sandbox went (or the watch failed): nothing more comes; drop the watcher.
            if r.is_err() {
                all.remove(&id2);
            }
        });
        if tokio::time::timeout(Duration::from_secs(60), ready_rx).await.map_or(true, |r| r.is_err()) {
            watchers.remove(&id);
            return Err(RpcError::new("unavailable", "the watch could not be set up in the sandbox"));
        }
        // Idle watchers go, and every watcher when the service stops.
        let (all, id3, sandbox) = (watchers.clone(), id.clone(), t.sandbox.clone());
        let stopping = st.streams.stopping();
        tokio::spawn(async move {
            tokio::pin!(stopping);
            loop {
                tokio::select! {
                    () = tokio::time::sleep(WATCHER_IDLE / 10) => {}
                    () = &mut stopping => {
                        all.remove(&id3);
                        return;
                    }
                }
                let Ok(w) = all.get(&sandbox, &id3) else { return };
                if lock(&w.polled).elapsed() > WATCHER_IDLE {
                    all.remove(&id3);
                    return;
                }
            }
        });
        Ok(pb::WatcherId { watcher_id: id })
    })
    .await
}

/// `filesystem.Filesystem/GetWatcherEvents`: the events since the last call.
pub async fn get_watcher_events(
    State(watchers): State<Arc<Watchers>>,
    Extension(t): Extension<Target>,
    h: HeaderMap,
    body: Body,
) -> Response {
    unary(&h, body, |req: pb::WatcherId| async move {
        let w = watchers.get(&t.sandbox, &req.watcher_id)?;
        *lock(&w.polled) = Instant::now();
        let events: Vec<_> = lock(&w.events).drain(..).collect();
        if w.ended.load(Ordering::SeqCst) && events.is_empty() {
            watchers.remove(&req.watcher_id);
            return Err(RpcError::new("not_found", "the watch ended: its directory was removed or moved"));
        }
        Ok(pb::GetWatcherEventsResponse { events })
    })
    .await
}

/// `filesystem.Filesystem/RemoveWatcher`.
pub async fn remove_watcher(
    State(watchers): State<Arc<Watchers>>,
    Extension(t): Extension<Target>,
    h: HeaderMap,
    body: Body,
) -> Response {
    unary(&h, body, |req: pb::WatcherId| async move {
        watchers.get(&t.sandbox, &req.watcher_id)?;
        watchers.remove(&req.watcher_id);
        Ok(pb::Empty {})
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_events_name_paths_relative_to_the_watched_directory() {
        let e = |name: &str| branchbox_protocol::WatchEvent { kind: WatchKind::Create, name: name.into() };
        assert_eq!(fs_event("/home/user", e("/home/user/a/b.txt")).name, "a/b.txt");
        assert_eq!(fs_event("/home/user/", e("/home/user/x")).name, "x");
        assert_eq!(fs_event("/", e("/etc/x")).name, "etc/x");
        assert_eq!(fs_event("/a", e("/a/f")).r#type, pb::EVENT_TYPE_CREATE);
    }
}
