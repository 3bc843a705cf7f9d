//! The error type every library crate converts into at the core's boundary.

/// Stable error classes; the service maps them to HTTP status codes and the CLI to messages.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No such sandbox, snapshot or image.
    #[error("{what} {id} not found{hint}")]
    NotFound {
        /// Kind of object.
        what: &'static str,
        /// The id that was asked for.
        id: String,
        /// What to do next (starts with "; " when present).
        hint: String,
    },
    /// The request itself is wrong (bad id, bad count, bad path).
    #[error("{0}")]
    InvalidInput(String),
    /// The object is in a state that does not allow the operation.
    #[error("{0}")]
    Conflict(String),
    /// Something this host needs is missing or unusable.
    #[error("{0}")]
    Unavailable(String),
    /// The sandbox runtime or agent failed.
    #[error("{0}")]
    Backend(String),
    /// The metadata store failed.
    #[error("metadata store: {0}")]
    Store(String),
    /// A file operation on the host failed.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
}

impl Error {
    /// A not-found error with a hint (e.g. "; `branchbox ls` lists sandboxes").
    pub fn not_found(what: &'static str, id: impl Into<String>, hint: &str) -> Self {
        let hint = if hint.is_empty() { String::new() } else { format!("; {hint}") };
        Error::NotFound { what, id: id.into(), hint }
    }

    /// An I/O error on `path`.
    pub fn io(path: impl AsRef<std::path::Path>, source: std::io::Error) -> Self {
        Error::Io { path: path.as_ref().display().to_string(), source }
    }

    /// A stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Error::NotFound { .. } => "not_found",
            Error::InvalidInput(_) => "invalid_input",
            Error::Conflict(_) => "conflict",
            Error::Unavailable(_) => "unavailable",
            Error::Backend(_) => "backend",
            Error::Store(_) => "store",
            Error::Io { .. } => "io",
        }
    }
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
