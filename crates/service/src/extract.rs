//! Typed request parsing with the service's own errors, for every surface: bodies and queries
//! are parsed into typed values at the boundary, ids, paths, names, durations and maps are
//! checked, and every rejection says what was wrong.

use crate::error::ApiError;
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::{FromRef, FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use branchbox_model::SandboxId;
use serde::de::DeserializeOwned;

/// A JSON body; an empty body reads as `{}` so bodies with only optional fields may be left out.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T>
where
    AppState: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let st = AppState::from_ref(state);
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::too_large(format!(
                    "the JSON body is over {} bytes; send less (files go through PUT /v1/sandboxes/{{id}}/files)",
                    st.cfg.max_json_bytes
                ))
            } else {
                ApiError::bad_request("bad_body", format!("the request body could not be read: {e}"))
            }
        })?;
        let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) { b"{}" } else { &bytes };
        serde_json::from_slice(bytes).map(ApiJson).map_err(|e| {
            if e.is_data() {
                ApiError::new(
                    axum::http::StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_body",
                    format!("the JSON body does not fit this operation: {e}; see /openapi.json"),
                )
            } else {
                ApiError::bad_request("bad_json", format!("the request body is not valid JSON: {e}"))
            }
        })
    }
}

/// A query string.
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let q = parts.uri.query().unwrap_or("");
        serde_urlencoded::from_str(q).map(ApiQuery).map_err(|e| {
            ApiError::bad_request("bad_query", format!("the query string does not fit this operation: {e}"))
        })
    }
}

/// Parses a sandbox id from the URL (400 when it is not one).
pub fn sandbox_id(s: &str) -> Result<SandboxId, ApiError> {
    SandboxId::parse(s).map_err(|e| ApiError::bad_request("invalid_id", e.to_string()))
}

/// Parses a process id from the URL (400 when it is not a positive integer).
pub fn pid(s: &str) -> Result<i32, ApiError> {
    s.parse::<i32>().ok().filter(|p| *p > 0).ok_or_else(|| {
        ApiError::bad_request("invalid_id", format!("{s:?} is not a process id (a positive integer)"))
    })
}

/// Checks a snapshot reference: an id, or a name under the one naming rule
/// (`branchbox_model::names`).
pub fn snapshot_ref(s: &str) -> Result<String, ApiError> {
    branchbox_model::check_snapshot_ref(s).map_err(|e| ApiError::bad_request("invalid_id", e.to_string()))?;
    Ok(s.to_string())
}

/// Checks a path inside a sandbox (`branchbox_protocol::limits::check_guest_path`).
pub fn sandbox_path(p: &str) -> Result<String, ApiError> {
    branchbox_protocol::limits::check_guest_path(p).map_err(ApiError::invalid)?;
    Ok(p.to_string())
}

/// Checks the name of an account in a sandbox's image (`user`, `root`): the agent looks it up
/// in the guest's `/etc/passwd`, so only what such a name can be is passed on.
pub fn account_name(what: &str, name: &str) -> Result<String, ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && !name.starts_with('-')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if !ok {
        return Err(ApiError::invalid(format!(
            "{what} {:?} is not an account name: letters, digits, '_', '-' and '.', at most 32 bytes",
            name.chars().take(40).collect::<String>()
        )));
    }
    Ok(name.to_string())
}

/// Checks a duration in seconds against `0 < t <= max`.
pub fn seconds(what: &str, t: f64, max: u64) -> Result<std::time::Duration, ApiError> {
    if !(t.is_finite() && t > 0.0 && t <= max as f64) {
        return Err(ApiError::invalid(format!(
            "{what} must be a number of seconds above 0 and at most {max}"
        )));
    }
    Ok(std::time::Duration::from_secs_f64(t))
}

/// Checks string maps from clients (metadata, environment): counts and sizes bounded.
pub fn check_map(
    what: &str,
    m: &std::collections::BTreeMap<String, String>,
    env_names: bool,
) -> Result<(), ApiError> {
    if m.len() > 64 {
        return Err(ApiError::invalid(format!("{what} has {} entries; at most 64 are allowed", m.len())));
    }
    for (k, v) in m {
        let key_ok = !k.is_empty()
            && k.len() <= 128
            && if env_names {
                k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') && !k.as_bytes()[0].is_ascii_digit()
            } else {
                !k.contains('\0')
            };
        if !key_ok {
            return Err(ApiError::invalid(format!(
                "{what} key {:?} is not allowed: use 1-128 characters{}",
                k.chars().take(64).collect::<String>(),
                if env_names { " of A-Z a-z 0-9 _, not starting with a digit" } else { " without NUL" }
            )));
        }
        if v.len() > 4096 || v.contains('\0') {
            return Err(ApiError::invalid(format!(
                "{what} value of {k:?} must be at most 4096 bytes, without NUL"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn account_names_are_what_passwd_names_can_be() {
        for good in ["user", "root", "www-data", "a.b_c", &"u".repeat(32)] {
            assert_eq!(account_name("user", good).unwrap(), good);
        }
        for bad in ["", "-rf", "a b", "x;id", "a/b", "a:b", "é", &"u".repeat(33)] {
            assert!(account_name("user", bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn hostile_ids_and_names_are_refused() {
        for bad in ["", "..", ".", "../etc", "snap-../../x", "a b", "a/b", &"n".repeat(129)] {
            assert!(snapshot_ref(bad).is_err(), "{bad:?}");
        }
        assert_eq!(snapshot_ref("warm-1.0").unwrap(), "warm-1.0");
        assert_eq!(snapshot_ref("snap-named").unwrap(), "snap-named");
        assert!(sandbox_id("sbx-0123456789abcdef").is_ok());
        assert_eq!(sandbox_id("sbx-1").unwrap_err().status.as_u16(), 400);
    }

    #[test]
    fn durations_must_be_positive_finite_and_bounded() {
        assert!(seconds("timeout", 0.5, 10).is_ok());
        for bad in [0.0, -1.0, 11.0, f64::NAN, f64::INFINITY] {
            assert_eq!(seconds("timeout", bad, 10).unwrap_err().status.as_u16(), 422);
        }
    }

    #[test]
    fn env_names_are_shell_identifiers() {
        let m = |k: &str| std::collections::BTreeMap::from([(k.to_string(), "v".to_string())]);
        assert!(check_map("envs", &m("LANG_2"), true).is_ok());
        for bad in ["", "1X", "A=B", "A B"] {
            assert!(check_map("envs", &m(bad), true).is_err(), "{bad:?}");
        }
        assert!(check_map("metadata", &m("a b"), false).is_ok());
    }

    #[test]
    fn sandbox_paths_must_be_absolute_and_clean() {
        assert!(sandbox_path("/tmp/x").is_ok());
        for bad in ["tmp/x", "", "/a\0b"] {
            assert!(sandbox_path(bad).is_err(), "{bad:?}");
        }
    }
}
