//! envd's file calls: `filesystem.Filesystem/Stat`, `ListDir`, `MakeDir`, `Move` and `Remove`
//! (Connect-RPC), and the HTTP `GET/POST /files` that read and write contents (uploads raw or
//! `multipart/form-data`, streamed into the sandbox, bounded by [`super::uploads`]). Each runs
//! as the account the call names (envd's `Authorization: Basic <user>:` or `?username=`;
//! `user` by default): the agent takes that account's ids, as envd does.

use super::connect::RpcError;
use super::envd::{api, error_response, resolve, unary, user_of, Target};
use super::pb;
use super::uploads::{HeaderCap, HeadersTooLong, Uploads};
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::extract::account_name;
use crate::state::AppState;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use branchbox_model::SandboxId;
use branchbox_protocol::{ErrorCode, FileKind, FileStat};
use futures_util::{StreamExt, TryStreamExt};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Most entries a recursive `ListDir` returns.
const MAX_LIST: usize = 100_000;

/// Go's `os.FileMode.String()` for the permission part, with the type letter.
pub fn permissions(kind: FileKind, mode: u32) -> String {
    let t = match kind {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'L',
        _ => '-',
    };
    let mut s = String::with_capacity(10);
    s.push(t);
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if mode & (0o400 >> i) != 0 { c } else { '-' });
    }
    s
}

/// envd's entry for one stat of the agent.
pub fn entry(s: &FileStat, path: &str) -> pb::EntryInfo {
    let name = path.rsplit('/').next().filter(|n| !n.is_empty()).unwrap_or("/").to_string();
    pb::EntryInfo {
        name,
        r#type: match s.kind {
            FileKind::File => pb::FILE_TYPE_FILE,
            FileKind::Dir => pb::FILE_TYPE_DIRECTORY,
            FileKind::Symlink => pb::FILE_TYPE_SYMLINK,
            FileKind::Other => pb::FILE_TYPE_UNSPECIFIED,
        },
        path: path.to_string(),
        size: s.size.min(i64::MAX as u64) as i64,
        mode: s.mode & 0o7777,
        permissions: permissions(s.kind, s.mode),
        owner: s.owner.clone().unwrap_or_default(),
        group: s.group.clone().unwrap_or_default(),
        modified_time: Some(pb::Timestamp::from_ns(s.mtime_ns)),
        symlink_target: None,
        metadata: Default::default(),
        is_symlink: s.kind == FileKind::Symlink,
    }
}

/// envd's entry for a path the agent stats without following it: a symbolic link is shown as
/// envd shows it, with the type and permission bits of what it leads to (`target`, from the
/// agent's `resolve`) and `symlinkTarget` the absolute path reached; one that leads nowhere
/// has no type and its own path as target.
pub fn entry_following(s: &FileStat, path: &str, target: Option<&FileStat>) -> pb::EntryInfo {
    let mut e = entry(s, path);
    if s.kind == FileKind::Symlink {
        let reached = target.map(|t| entry(t, &t.name));
        e.r#type = reached.as_ref().map_or(pb::FILE_TYPE_UNSPECIFIED, |r| r.r#type);
        e.mode = reached.as_ref().map_or(0, |r| r.mode);
        e.symlink_target = Some(target.map_or_else(|| path.to_string(), |t| t.name.clone()));
    }
    e
}

/// Runs `op` on the sandbox's agent (it acts on `path`), then answers the entry `path` has,
/// as `user` sees it.
async fn entry_after<F>(
    st: &AppState,
    id: SandboxId,
    path: String,
    user: String,
    op: F,
) -> Result<pb::EntryResponse, RpcError>
where
    F: FnOnce(&mut branchbox_model::AgentConn, &str) -> ApiResult<()> + Send + 'static,
{
    let s = st
        .blocking(move |engine, st| {
            let mut conn = st.agent(engine, &id, Duration::ZERO)?;
            op(&mut conn, &path)?;
            let s = conn.stat_as(&path, Some(&user))?;
            // A link that leads nowhere (or an older agent, which has no `resolve`) has no target.
            let target =
                (s.kind == FileKind::Symlink).then(|| conn.resolve_as(&path, Some(&user)).ok()).flatten();
            Ok((s, target, path))
        })
        .await
        .map_err(api)?;
    Ok(pb::EntryResponse { entry: Some(entry_following(&s.0, &s.2, s.1.as_ref())) })
}

pub(super) async fn stat(
    State(st): State<AppState>,
    Extension(t): Extension<Target>,
    h: HeaderMap,
    body: Body,
) -> Response {
    let user = user_of(&h);
    unary(&h, body, |req: pb::PathRequest| async move {
        let user = user?;
        let path = resolve(&req.path, &user)?;
        entry_after(&st, t.sandbox, path, user, |_, _| Ok(())).await
    })
    .await
}

pub(super) async fn list_dir(
    State(st): State<AppState>,
    Extension(t): Extension<Target>,
    h: HeaderMap,
    body: Body,
) -> Response {
    let user = user_of(&h);
    unary(&h, body, |req: pb::ListDirRequest| async move {
        let user = user?;
        let root = resolve(&req.path, &user)?;
        let depth = req.depth.clamp(1, 64) as usize;
        let id = t.sandbox;
        let entries = st
            .blocking(move |engine, st| {
                let mut conn = st.agent(engine, &id, Duration::ZERO)?;
                if conn.stat_as(&root, Some(&user))?.kind != FileKind::Dir {
                    return Err(ApiError::invalid(format!("{root} is not a directory")));
                }
                // As envd walks: each directory's entries by name, each subdirectory's entries
                // right after it (depth first), down to `depth` levels.
                let mut out = Vec::new();
                let mut stack: Vec<(String, usize, Option<Vec<FileStat>>)> = vec![(root, 1, None)];
                while let Some((dir, level, listed)) = stack.pop() {
                    let mut entries = match listed {
                        Some(left) => left,
                        None => conn.list_dir_as(&dir, Some(&user))?.into_iter().rev().collect(),
                    };
                    let Some(e) = entries.pop() else { continue };
                    let full = format!("{}/{}", dir.trim_end_matches('/'), e.name);
                    let target = (e.kind == FileKind::Symlink)
                        .then(|| conn.resolve_as(&full, Some(&user)).ok())
                        .flatten();
                    out.push(entry_following(&e, &full, target.as_ref()));
                    if out.len() > MAX_LIST {
                        return Err(ApiError::too_large(format!(
                            "the listing passed {MAX_LIST} entries; list a smaller depth"
                        )));
                    }
                    let descend = e.kind == FileKind::Dir && level < depth;
                    stack.push((dir, level, Some(entries)));
                    if descend {
                        stack.push((full, level + 1, None));
                    }
                }
                Ok(out)
            })
            .await
            .map_err(api)?;
        Ok(pb::ListDirResponse { entries })
    })
    .await
}

pub(super) async fn make_dir(
    State(st): State<AppState>,
    Extension(t): Extension<Target>,
    h: HeaderMap,
    body: Body,
) -> Response {
    let user = user_of(&h);
    unary(&h, body, |req: pb::PathRequest| async move {
        let user = user?;
        let path = resolve(&req.path, &user)?;
        entry_after(&st, t.sandbox, path, user.clone(), move |conn, path| {
            if conn.stat_as(path, Some(&user)).is_ok() {
                return Err(ApiError::new(StatusCode::CONFLICT, "already_exists", format!("{path} exists")));
            }
            Ok(conn.mkdir_as(path, true, Some(&user))?)
        })
        .await
    })
    .await
}

pub(super) async fn move_path(
    State(st): State<AppState>,
    Extension(t): Extension<Target>,
    h: HeaderMap,
    body: Body,
) -> Response {
    let user = user_of(&h);
    unary(&h, body, |req: pb::MoveRequest| async move {
        let user = user?;
        let (from, to) = (resolve(&req.source, &user)?, resolve(&req.destination, &user)?);
        let u2 = user.clone();
        entry_after(&st, t.sandbox, to, user, move |conn, to| Ok(conn.rename_as(&from, to, Some(&u2))?)).await
    })
    .await
}

pub(super) async fn remove(
    State(st): State<AppState>,
    Extension(t): Extension<Target>,
    h: HeaderMap,
    body: Body,
) -> Response {
    let user = user_of(&h);
    unary(&h, body, |req: pb::PathRequest| async move {
        let user = user?;
        let path = resolve(&req.path, &user)?;
        let id = t.sandbox;
        st.blocking(move |engine, st| {
            // envd removes as `rm -rf` does: a path that is not there is already removed.
            match st.agent(engine, &id, Duration::ZERO)?.remove_as(&path, true, Some(&user)) {
                Err(branchbox_protocol::ClientError::Agent { code: ErrorCode::NotFound, .. }) => Ok(()),
                r => Ok(r?),
            }
        })
        .await
        .map_err(api)?;
        Ok(pb::Empty {})
    })
    .await
}

// ---- /files ----

#[derive(Debug, Default, serde::Deserialize)]
struct FilesQuery {
    path: Option<String>,
    username: Option<String>,
}

fn files_query(uri: &axum::http::Uri) -> Result<FilesQuery, RpcError> {
    serde_urlencoded::from_str(uri.query().unwrap_or(""))
        .map_err(|e| RpcError::invalid(format!("the query does not parse: {e}")))
}

fn query_user(q: &FilesQuery, h: &HeaderMap) -> Result<String, RpcError> {
    match q.username.as_deref().filter(|u| !u.is_empty()) {
        Some(u) => account_name("username", u).map_err(|e| RpcError::invalid(e.message)),
        None => user_of(h),
    }
}

pub(super) async fn read_file(
    State(st): State<AppState>,
    Extension(t): Extension<Target>,
    uri: axum::http::Uri,
    h: HeaderMap,
) -> Response {
    let target = async {
        let q = files_query(&uri)?;
        let user = query_user(&q, &h)?;
        let path =
            resolve(q.path.as_deref().ok_or_else(|| RpcError::invalid("give ?path= of the file"))?, &user)?;
        Ok::<_, RpcError>((path, user))
    }
    .await;
    let (path, user) = match target {
        Ok(p) => p,
        Err(e) => return error_response(&e),
    };
    match crate::ops::files::read_as(&st, t.sandbox, path, Some(user)).await {
        Ok(r) => r,
        Err(e) => error_response(&api(e)),
    }
}

/// What envd answers for each file written.
#[derive(Debug, Serialize)]
struct WriteInfo {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    path: String,
}

fn written(path: &str) -> WriteInfo {
    let name = path.rsplit('/').next().unwrap_or("").to_string();
    WriteInfo { name, kind: "file", path: path.to_string() }
}

pub(super) async fn write_file(
    State(st): State<AppState>,
    State(uploads): State<Arc<Uploads>>,
    Extension(t): Extension<Target>,
    Extension(caller): Extension<Caller>,
    uri: axum::http::Uri,
    h: HeaderMap,
    body: Body,
) -> Response {
    let _slot = match uploads.take(&t.sandbox, &caller.0) {
        Ok(s) => s,
        Err(e) => return error_response(&e),
    };
    match write_files(st, t.sandbox, &uri, &h, body).await {
        Ok(files) => axum::Json(files).into_response(),
        Err(e) => error_response(&e),
    }
}

/// Streams one upload into a file of the sandbox, written as `user`, up to `left` bytes.
async fn upload<S>(
    st: &AppState,
    id: &SandboxId,
    path: String,
    user: &str,
    chunks: S,
    left: Arc<AtomicU64>,
) -> Result<(), RpcError>
where
    S: futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
{
    let over = Arc::new(AtomicBool::new(false));
    let o2 = over.clone();
    let stream = Box::pin(chunks).and_then(move |c: Bytes| {
        let n = c.len() as u64;
        let r = match left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| l.checked_sub(n)) {
            Ok(_) => Ok(c),
            Err(_) => {
                o2.store(true, Ordering::Relaxed);
                Err(std::io::Error::other("upload limit"))
            }
        };
        std::future::ready(r)
    });
    let reader = tokio_util::io::SyncIoBridge::new(tokio_util::io::StreamReader::new(stream));
    let (id, owner) = (id.clone(), user.to_string());
    let r: ApiResult<u64> = st
        .blocking(move |engine, st| {
            let mut conn = st.agent(engine, &id, Duration::ZERO)?;
            let mut reader = reader;
            Ok(conn.write_file_as(&path, &mut reader, None, false, true, Some(&owner))?)
        })
        .await;
    if over.load(Ordering::Relaxed) {
        return Err(RpcError::new(
            "resource_exhausted",
            format!("the upload is over the limit of {} bytes", st.cfg.max_upload_bytes),
        ));
    }
    r.map(|_| ()).map_err(api)
}

async fn write_files(
    st: AppState,
    id: SandboxId,
    uri: &axum::http::Uri,
    h: &HeaderMap,
    body: Body,
) -> Result<Vec<WriteInfo>, RpcError> {
    let q = files_query(uri)?;
    let user = query_user(&q, h)?;
    let left = Arc::new(AtomicU64::new(st.cfg.max_upload_bytes));
    let stall = st.cfg.agent_stall;
    let ct = h.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    if h.contains_key(header::CONTENT_ENCODING) {
        return Err(RpcError::unimplemented(
            "compressed uploads (Content-Encoding) are not served; send the bytes as they are",
        ));
    }
    let Ok(boundary) = multer::parse_boundary(&ct) else {
        // A raw body (envd's application/octet-stream upload).
        let path =
            resolve(q.path.as_deref().ok_or_else(|| RpcError::invalid("give ?path= of the file"))?, &user)?;
        let chunks = tokio_stream::StreamExt::timeout(body.into_data_stream(), stall).map(|r| {
            r.map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "the client stopped sending"))
                .and_then(|c| c.map_err(std::io::Error::other))
        });
        upload(&st, &id, path.clone(), &user, chunks, left).await?;
        return Ok(vec![written(&path)]);
    };
    let constraints = multer::Constraints::new()
        .allowed_fields(vec!["file"])
        .size_limit(multer::SizeLimit::new().whole_stream(st.cfg.max_upload_bytes.saturating_add(1 << 20)));
    // The parser holds a part's headers until they end: cut them before it sees them.
    let mut cap = HeaderCap::new(&boundary);
    let too_long = Arc::new(AtomicBool::new(false));
    let t2 = too_long.clone();
    let capped = body.into_data_stream().map(move |r| {
        let c = r.map_err(std::io::Error::other)?;
        cap.feed(&c).map_err(|e| {
            t2.store(true, Ordering::Relaxed);
            std::io::Error::other(e)
        })?;
        Ok::<_, std::io::Error>(c)
    });
    let mut form = multer::Multipart::with_constraints(capped, boundary, constraints);
    let mut out = Vec::new();
    let bad = |e: multer::Error| {
        if too_long.load(Ordering::Relaxed) {
            return RpcError::from(HeadersTooLong);
        }
        RpcError::invalid(format!("the multipart body does not parse: {e}"))
    };
    while let Some(field) = tokio::time::timeout(stall, form.next_field())
        .await
        .map_err(|_| RpcError::new("deadline_exceeded", "the client stopped sending the upload"))?
        .map_err(bad)?
    {
        if out.len() >= 1000 {
            return Err(RpcError::invalid("at most 1000 files per upload"));
        }
        let named = match q.path.as_deref() {
            Some(p) if out.is_empty() => p.to_string(),
            _ => field.file_name().map(str::to_string).ok_or_else(|| {
                RpcError::invalid("each part needs a filename (its path) when ?path= is not given")
            })?,
        };
        let path = resolve(&named, &user)?;
        // The part is streamed to the agent; the next part can only be read after this one ends.
        let (ptx, prx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(8);
        let job = {
            let (st, id, path, user, left) =
                (st.clone(), id.clone(), path.clone(), user.clone(), left.clone());
            tokio::spawn(async move {
                upload(&st, &id, path, &user, tokio_stream::wrappers::ReceiverStream::new(prx), left).await
            })
        };
        let mut field = field;
        let mut failed = None;
        loop {
            match tokio::time::timeout(stall, field.chunk()).await {
                Ok(Ok(Some(c))) => {
                    if ptx.send(Ok(c)).await.is_err() {
                        break;
                    }
                }
                Ok(Ok(None)) => break,
                Ok(Err(e)) => {
                    let _ = ptx.send(Err(std::io::Error::other(e.to_string()))).await;
                    failed = Some(bad(e));
                    break;
                }
                Err(_) => {
                    let _ = ptx.send(Err(std::io::Error::other("stalled"))).await;
                    failed =
                        Some(RpcError::new("deadline_exceeded", "the client stopped sending the upload"));
                    break;
                }
            }
        }
        drop(ptx);
        let done = job.await.map_err(|e| RpcError::new("internal", format!("a worker failed: {e}")))?;
        if let Some(e) = failed {
            return Err(e);
        }
        done?;
        out.push(written(&path));
    }
    if out.is_empty() {
        return Err(RpcError::invalid("the multipart body has no `file` part"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_carry_type_mode_and_go_style_permissions() {
        let s = FileStat {
            name: "x".into(),
            kind: FileKind::Dir,
            size: 4096,
            mode: 0o40755,
            mtime_ns: 0,
            owner: None,
            group: None,
        };
        let e = entry(&s, "/home/user/x");
        assert_eq!((e.name.as_str(), e.r#type, e.mode), ("x", pb::FILE_TYPE_DIRECTORY, 0o755));
        assert_eq!(e.permissions, "drwxr-xr-x");
        assert_eq!(permissions(FileKind::File, 0o644), "-rw-r--r--");
    }

    #[test]
    fn a_link_shows_what_it_leads_to_and_one_leading_nowhere_its_own_path() {
        let link = FileStat {
            name: "/h/l".into(),
            kind: FileKind::Symlink,
            size: 3,
            mode: 0o777,
            mtime_ns: 0,
            owner: Some("user".into()),
            group: Some("user".into()),
        };
        let file = FileStat {
            name: "/h/d/f".into(),
            kind: FileKind::File,
            size: 9,
            mode: 0o640,
            mtime_ns: 0,
            owner: None,
            group: None,
        };
        let e = entry_following(&link, "/h/l", Some(&file));
        assert_eq!((e.r#type, e.mode, e.size), (pb::FILE_TYPE_FILE, 0o640, 3));
        assert_eq!((e.symlink_target.as_deref(), e.permissions.as_str()), (Some("/h/d/f"), "Lrwxrwxrwx"));
        assert_eq!((e.owner.as_str(), e.group.as_str()), ("user", "user"));
        let e = entry_following(&link, "/h/l", None);
        assert_eq!((e.r#type, e.symlink_target.as_deref()), (pb::FILE_TYPE_UNSPECIFIED, Some("/h/l")));
        assert_eq!(entry_following(&file, "/h/d/f", None).symlink_target, None);
    }
}
