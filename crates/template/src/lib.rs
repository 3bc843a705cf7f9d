//! Templates: a name, a base (an image or another template) and ordered steps, each of whose
//! results the engine caches as a snapshot keyed by a chain hash.
//!
//! This crate is the part that needs no sandbox: the typed definition ([`TemplateSpec`]), its
//! three sources (a TOML file, the API's JSON, a Dockerfile subset), the limits every source
//! passes through, the chain hashes ([`chain`]) and the exec defaults a template gives its
//! sandboxes ([`ExecDefaults`]). Everything here treats its input as hostile: sizes are bounded
//! before parsing and every error names the step or line and what to change.
//!
//! Not for: running steps or storing snapshots (branchbox-core's engine does that).

pub mod chain;
mod context_file;
mod defaults;
pub mod dockerfile;
mod spec;
mod toml_file;

pub use context_file::Scanned;
pub use defaults::{command, ExecDefaults};
pub use spec::{Base, RunCmd, Step, TemplateSpec, DEFAULT_IMAGE};
pub use toml_file::parse_toml;

/// Largest template file (TOML or Dockerfile), bytes.
pub const MAX_FILE_BYTES: usize = 1 << 20;
/// Most steps in one template.
pub const MAX_STEPS: usize = 256;
/// Longest shell command or sum of argv bytes of one `run` step.
pub const MAX_COMMAND_BYTES: usize = 64 << 10;
/// Most argv words of one `run` step.
pub const MAX_ARGV: usize = 1024;
/// Most variables one `env` step sets.
pub const MAX_ENV_VARS: usize = 256;
/// Longest environment variable value, bytes.
pub const MAX_ENV_VALUE_BYTES: usize = 64 << 10;
/// Longest path in a step, bytes (as Linux's PATH_MAX).
pub const MAX_PATH_BYTES: usize = 4096;
/// Largest inline `file` content, bytes.
pub const MAX_INLINE_BYTES: usize = 1 << 20;
/// Most files and directories one `upload` step sends.
pub const MAX_UPLOAD_ENTRIES: usize = 10_000;
/// Most bytes one `upload` step sends.
pub const MAX_UPLOAD_BYTES: u64 = 512 << 20;

/// Why a template definition or its inputs were refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The definition is wrong; the message names the step, line or field.
    #[error("{0}")]
    Invalid(String),
    /// A local input (an uploaded file or tree) could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
}

impl Error {
    fn io(path: &std::path::Path, source: std::io::Error) -> Error {
        Error::Io { path: path.display().to_string(), source }
    }
}

impl From<Error> for branchbox_model::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Invalid(m) => branchbox_model::Error::InvalidInput(m),
            Error::Io { path, source } => branchbox_model::Error::Io { path, source },
        }
    }
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, Error>;
