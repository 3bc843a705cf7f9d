//! The service's one error type: a status, a stable code and a message that says what to do.
//! Every failure, from a malformed body to a dead sandbox, leaves the service as
//! `{"error": {"code": ..., "message": ...}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use branchbox_model::Error as EngineError;
use branchbox_protocol::{ClientError, ErrorCode};
use serde::Serialize;
use utoipa::ToSchema;

/// An error answered to a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code (documented in `docs/service.md`).
    pub code: &'static str,
    /// What went wrong and what to do about it.
    pub message: String,
}

/// The JSON body of every error.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// Code and message of an error.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable machine-readable code.
    pub code: String,
    /// Human-readable message saying what to do next.
    pub message: String,
}

impl ApiError {
    /// An error with this status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into() }
    }

    /// 400: the request is malformed.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// 422: the request is well-formed but a value is not acceptable.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_input", message)
    }

    /// 413: a body or stream is over its limit.
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
    }

    /// 404 for a route or object that does not exist.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 500: a bug or a host failure the client cannot fix.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// The JSON body.
    pub fn body(&self) -> ErrorBody {
        ErrorBody { error: ErrorDetail { code: self.code.to_string(), message: self.message.clone() } }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status.as_u16(), self.code, self.message)
    }
}

/// The HTTP status of an engine error's class.
pub fn engine_status(e: &EngineError) -> StatusCode {
    match e {
        EngineError::NotFound { .. } => StatusCode::NOT_FOUND,
        EngineError::InvalidInput(_) => StatusCode::UNPROCESSABLE_ENTITY,
        EngineError::Conflict(_) => StatusCode::CONFLICT,
        EngineError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        EngineError::Backend(_) => StatusCode::BAD_GATEWAY,
        EngineError::Store(_) | EngineError::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl std::error::Error for ApiError {}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        let status = engine_status(&e);
        // The engine's hints name CLI commands; the HTTP equivalents are documented in
        // docs/service.md, and the CLI wording still tells a person what to do.
        ApiError::new(status, e.code(), e.to_string())
    }
}

/// The service database failing is the service's fault, never the client's.
impl From<rusqlite::Error> for ApiError {
    fn from(e: rusqlite::Error) -> Self {
        ApiError::internal(format!("the service database failed: {e}"))
    }
}

impl From<ClientError> for ApiError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Agent { code, message } => {
                let (status, code) = match code {
                    ErrorCode::NotFound => (StatusCode::NOT_FOUND, "path_not_found"),
                    ErrorCode::AlreadyExists => (StatusCode::CONFLICT, "already_exists"),
                    ErrorCode::PermissionDenied => (StatusCode::FORBIDDEN, "permission_denied"),
                    ErrorCode::BadRequest => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_input"),
                    ErrorCode::SpawnFailed => (StatusCode::UNPROCESSABLE_ENTITY, "spawn_failed"),
                    // Inside the sandbox an I/O failure is nearly always caused by the request
                    // (a directory read as a file, a full disk), not by the service.
                    ErrorCode::Io => (StatusCode::UNPROCESSABLE_ENTITY, "sandbox_io"),
                    ErrorCode::UnsupportedVersion => (StatusCode::BAD_GATEWAY, "agent_version"),
                };
                ApiError::new(status, code, message)
            }
            other => ApiError::new(
                StatusCode::BAD_GATEWAY,
                "agent_unavailable",
                format!("talking to the sandbox's agent failed: {other}; check the sandbox with GET /v1/sandboxes/{{id}}"),
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        // Lets the metrics and audit layers see the code without parsing the body.
        r.extensions_mut().insert(ErrorCodeTag(self.code));
        r
    }
}

/// The error code of a response, for the layers that record outcomes.
#[derive(Debug, Clone, Copy)]
pub struct ErrorCodeTag(pub &'static str);

/// Result with [`ApiError`].
pub type ApiResult<T> = Result<T, ApiError>;

/// An error in E2B's REST shape: `{"code": <HTTP status>, "message": "..."}`.
#[derive(Debug)]
pub struct E2bError(pub ApiError);

impl From<ApiError> for E2bError {
    fn from(e: ApiError) -> Self {
        E2bError(e)
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let e = self.0;
        let body = serde_json::json!({ "code": e.status.as_u16(), "message": e.message });
        let mut r = (e.status, axum::Json(body)).into_response();
        r.extensions_mut().insert(ErrorCodeTag(e.code));
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_map_to_statuses_by_class() {
        let cases = [
            (EngineError::not_found("sandbox", "sbx-1", "list them"), 404, "not_found"),
            (EngineError::InvalidInput("bad".into()), 422, "invalid_input"),
            (EngineError::Conflict("paused".into()), 409, "conflict"),
            (EngineError::Unavailable("no runsc".into()), 503, "unavailable"),
            (EngineError::Backend("runsc died".into()), 502, "backend"),
            (EngineError::Store("locked".into()), 500, "store"),
        ];
        for (e, status, code) in cases {
            let a = ApiError::from(e);
            assert_eq!((a.status.as_u16(), a.code), (status, code));
        }
    }

    #[test]
    fn agent_errors_keep_the_agents_message_and_map_its_class() {
        let a = ApiError::from(ClientError::Agent {
            code: ErrorCode::NotFound,
            message: "/x: no such file".into(),
        });
        assert_eq!(
            (a.status.as_u16(), a.code, a.message.as_str()),
            (404, "path_not_found", "/x: no such file")
        );
        let closed = ApiError::from(ClientError::Closed);
        assert_eq!((closed.status.as_u16(), closed.code), (502, "agent_unavailable"));
    }

    #[test]
    fn database_failures_are_the_services_not_the_clients() {
        let a = ApiError::from(rusqlite::Error::InvalidQuery);
        assert_eq!((a.status.as_u16(), a.code), (500, "internal"));
        assert!(a.message.starts_with("the service database failed: "), "{}", a.message);
    }

    #[test]
    fn error_body_has_code_and_message() {
        let v = serde_json::to_value(ApiError::invalid("count must be 1..64").body()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"error": {"code": "invalid_input", "message": "count must be 1..64"}})
        );
    }
}
