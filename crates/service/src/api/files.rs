//! Files in a sandbox: read and write as streamed bodies, list, stat, remove, rename, mkdir.
//! Each call names the image's account it acts as (`user`; root when absent), and the agent
//! runs it with that account's ids, so it gets what the account's commands would.

use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{account_name, sandbox_id, sandbox_path, ApiJson, ApiQuery};
use crate::middleware::AuditNote;
use crate::ops::files::read_as;
use crate::ops::types::*;
use crate::state::AppState;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use axum::{Extension, Json};
use branchbox_protocol::FileKind;
use futures_util::{StreamExt, TryStreamExt};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Reads a file; the body is its bytes, streamed.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "sandbox id"), PathQuery),
    responses((status = 200, content_type = "application/octet-stream", body = Vec<u8>, description = "the file's bytes"),
              (status = "4XX", body = ErrorBody, description = "no such file (404), a directory or not a regular file (422), not readable by the account (403), over the download limit (413)")))]
pub async fn read(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> ApiResult<Response> {
    let id = sandbox_id(&id)?;
    let path = sandbox_path(&q.path)?;
    let user = q.user.as_deref().map(|u| account_name("user", u)).transpose()?;
    read_as(&st, id, path, user).await
}

/// Writes a file from the request body (streamed; replaced atomically).
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "sandbox id"), WriteQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "the file's bytes"),
    responses((status = 200, body = Written), (status = "4XX", body = ErrorBody, description = "bad path or mode, over the upload limit (413)")))]
pub async fn write(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<WriteQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<(Extension<AuditNote>, Json<Written>)> {
    let id = sandbox_id(&id)?;
    let path = sandbox_path(&q.path)?;
    let mode = match q.mode.as_deref() {
        None => None,
        Some(m) => Some(u32::from_str_radix(m, 8).ok().filter(|v| *v <= 0o7777).ok_or_else(|| {
            ApiError::invalid(format!("mode {m:?} is not octal permission bits (e.g. 644)"))
        })?),
    };
    let limit = st.cfg.max_upload_bytes;
    let too_large =
        || ApiError::too_large(format!("the upload is over the limit of {limit} bytes; split the file"));
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let over = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(AtomicU64::new(0));
    let (o2, s2) = (over.clone(), seen.clone());
    // A client that stops sending for longer than the stall limit ends the upload, freeing
    // the worker that feeds the agent.
    let stalled =
        || std::io::Error::new(std::io::ErrorKind::TimedOut, "the client stopped sending the upload");
    let chunks = tokio_stream::StreamExt::timeout(body.into_data_stream(), st.cfg.agent_stall)
        .map(move |r| r.map_err(|_| stalled()).and_then(|c| c.map_err(std::io::Error::other)));
    let stream = Box::pin(chunks).and_then(move |chunk: Bytes| {
        let total = s2.fetch_add(chunk.len() as u64, Ordering::Relaxed) + chunk.len() as u64;
        let r = if total > limit {
            o2.store(true, Ordering::Relaxed);
            Err(std::io::Error::other("upload limit"))
        } else {
            Ok(chunk)
        };
        std::future::ready(r)
    });
    let reader = tokio_util::io::SyncIoBridge::new(tokio_util::io::StreamReader::new(stream));
    let p2 = path.clone();
    let parents = q.parents.unwrap_or(true);
    let user = q.user.as_deref().map(|u| account_name("user", u)).transpose()?;
    let r = st
        .blocking(move |engine, st| {
            let mut conn = st.agent(engine, &id, Duration::ZERO)?;
            let mut reader = reader;
            Ok(conn.write_file_as(&p2, &mut reader, mode, false, parents, user.as_deref())?)
        })
        .await;
    if over.load(Ordering::Relaxed) {
        return Err(too_large());
    }
    let size = r?;
    let n = AuditNote { detail: Some(format!("wrote {size} bytes to {path}")), ..Default::default() };
    Ok((Extension(n), Json(Written { path, size })))
}

/// Lists a directory.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/list", tag = "files",
    params(("id" = String, Path, description = "sandbox id"), PathQuery),
    responses((status = 200, body = Vec<EntryInfo>), (status = "4XX", body = ErrorBody, description = "no such directory")))]
pub async fn list(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> ApiResult<Json<Vec<EntryInfo>>> {
    let id = sandbox_id(&id)?;
    let path = sandbox_path(&q.path)?;
    let user = q.user.as_deref().map(|u| account_name("user", u)).transpose()?;
    let out = st
        .blocking(move |engine, st| {
            let entries = st.agent(engine, &id, Duration::ZERO)?.list_dir_as(&path, user.as_deref())?;
            let base = path.trim_end_matches('/');
            Ok(entries.iter().map(|e| EntryInfo::new(e, format!("{base}/{}", e.name))).collect())
        })
        .await?;
    Ok(Json(out))
}

/// Stats a path (a final symlink is not followed).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/stat", tag = "files",
    params(("id" = String, Path, description = "sandbox id"), PathQuery),
    responses((status = 200, body = EntryInfo), (status = "4XX", body = ErrorBody, description = "no such path (404)")))]
pub async fn stat(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> ApiResult<Json<EntryInfo>> {
    let id = sandbox_id(&id)?;
    let path = sandbox_path(&q.path)?;
    let user = q.user.as_deref().map(|u| account_name("user", u)).transpose()?;
    let out = st
        .blocking(move |engine, st| {
            let s = st.agent(engine, &id, Duration::ZERO)?.stat_as(&path, user.as_deref())?;
            Ok(EntryInfo::new(&s, path))
        })
        .await?;
    Ok(Json(out))
}

/// Removes a file, or a directory (`recursive` for a non-empty one).
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "sandbox id"), RemoveQuery),
    responses((status = 204, description = "removed"), (status = "4XX", body = ErrorBody, description = "no such path (404)")))]
pub async fn remove(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<RemoveQuery>,
) -> ApiResult<StatusCode> {
    let id = sandbox_id(&id)?;
    let path = sandbox_path(&q.path)?;
    let recursive = q.recursive.unwrap_or(false);
    let user = q.user.as_deref().map(|u| account_name("user", u)).transpose()?;
    st.blocking(move |engine, st| {
        Ok(st.agent(engine, &id, Duration::ZERO)?.remove_as(&path, recursive, user.as_deref())?)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Renames a path.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/rename", tag = "files",
    params(("id" = String, Path, description = "sandbox id")), request_body = RenamePath,
    responses((status = 204, description = "renamed"), (status = "4XX", body = ErrorBody, description = "no such path (404)")))]
pub async fn rename(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<RenamePath>,
) -> ApiResult<StatusCode> {
    let id = sandbox_id(&id)?;
    let (from, to) = (sandbox_path(&req.from)?, sandbox_path(&req.to)?);
    let user = req.user.as_deref().map(|u| account_name("user", u)).transpose()?;
    st.blocking(move |engine, st| {
        Ok(st.agent(engine, &id, Duration::ZERO)?.rename_as(&from, &to, user.as_deref())?)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Whether `mkdir` made the directory.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct Made {
    /// False when it existed already.
    pub created: bool,
}

/// Creates a directory.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/mkdir", tag = "files",
    params(("id" = String, Path, description = "sandbox id")), request_body = MakeDir,
    responses((status = 200, body = Made), (status = "4XX", body = ErrorBody, description = "exists as a file (409), bad path")))]
pub async fn mkdir(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<MakeDir>,
) -> ApiResult<Json<Made>> {
    let id = sandbox_id(&id)?;
    let path = sandbox_path(&req.path)?;
    let parents = req.parents.unwrap_or(true);
    let user = req.user.as_deref().map(|u| account_name("user", u)).transpose()?;
    let created = st
        .blocking(move |engine, st| {
            let mut conn = st.agent(engine, &id, Duration::ZERO)?;
            let existed = conn.stat_as(&path, user.as_deref()).is_ok_and(|s| s.kind == FileKind::Dir);
            if existed && parents {
                return Ok(false);
            }
            conn.mkdir_as(&path, parents, user.as_deref())?;
            Ok(true)
        })
        .await?;
    Ok(Json(Made { created }))
}
