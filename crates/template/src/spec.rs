//! The typed definition and the one validation every source passes through.
//!
//! Steps have one wire shape for TOML and JSON (a table with exactly one of `run`, `upload`,
//! `file`, `env`, `workdir`, `user`); [`Step`] is built from it only through
//! [`Step::try_from`], so an invalid step never exists.

use crate::{Error, Result};
use crate::{
    MAX_ARGV, MAX_COMMAND_BYTES, MAX_ENV_VALUE_BYTES, MAX_ENV_VARS, MAX_INLINE_BYTES, MAX_PATH_BYTES,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The image a template starts from when it names none.
pub const DEFAULT_IMAGE: &str = "default";

/// A template's definition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateSpec {
    /// Its name (the snapshot naming rule).
    pub name: String,
    /// What it starts from: `default` (the default image), `image:NAME`, `template:NAME`, or a
    /// bare name (a template when one has it, else an image).
    #[serde(default = "default_base")]
    pub base: String,
    /// The steps, in order.
    #[serde(default)]
    pub steps: Vec<Step>,
}

fn default_base() -> String {
    DEFAULT_IMAGE.to_string()
}

/// What a template's base names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Base {
    /// An image by name.
    Image(String),
    /// Another template.
    Template(String),
    /// A template when one has this name, else an image.
    Either(String),
}

impl TemplateSpec {
    /// Checks what serde cannot: the name, the base and the step count.
    pub fn validate(&self) -> Result<()> {
        branchbox_model::Name::parse("template name", &self.name)
            .map_err(|e| Error::Invalid(e.to_string()))?;
        self.base()?;
        if self.steps.len() > crate::MAX_STEPS {
            return Err(Error::Invalid(format!(
                "template {:?} has {} steps, over the limit of {}; split it into a base template and one built on it",
                self.name,
                self.steps.len(),
                crate::MAX_STEPS
            )));
        }
        Ok(())
    }

    /// The base, parsed.
    pub fn base(&self) -> Result<Base> {
        let (kind, name) = match self.base.split_once(':') {
            Some(("image", n)) => (0, n),
            Some(("template", n)) => (1, n),
            Some((k, _)) => {
                return Err(Error::Invalid(format!(
                    "base {:?}: unknown kind {k:?}; write `image:NAME`, `template:NAME` or a bare name",
                    self.base
                )))
            }
            None => (2, self.base.as_str()),
        };
        let name =
            branchbox_model::Name::parse("base name", name).map_err(|e| Error::Invalid(e.to_string()))?;
        let name = name.to_string();
        Ok(match kind {
            0 => Base::Image(name),
            1 => Base::Template(name),
            _ => Base::Either(name),
        })
    }
}

/// A command of a `run` step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RunCmd {
    /// One line for `/bin/sh -c`.
    Shell(String),
    /// Words run directly.
    Argv(Vec<String>),
}

/// One step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawStep", into = "RawStep")]
pub enum Step {
    /// Run a command; a non-zero exit fails the build.
    Run(RunCmd),
    /// Copy a local file or tree (relative to the build context) to `to` in the sandbox: a
    /// directory's contents go into `to`; a file goes to `to`, or into it when `to` ends in `/`.
    Upload {
        /// Local path, relative to the context directory.
        src: String,
        /// Absolute destination.
        to: String,
    },
    /// Write a file whose content is given inline (the API's way to send files).
    File {
        /// Absolute path.
        path: String,
        /// Its content.
        content: String,
        /// Permission bits (0644 when absent).
        mode: Option<u32>,
    },
    /// Set environment variables for later steps and for sandboxes made from the template.
    Env(BTreeMap<String, String>),
    /// Set the working directory likewise.
    Workdir(String),
    /// Run later commands, and those of sandboxes made from the template, as this user.
    User(String),
}

/// The wire shape of a step.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStep {
    #[serde(skip_serializing_if = "Option::is_none")]
    run: Option<RunCmd>,
    #[serde(skip_serializing_if = "Option::is_none")]
    upload: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    to: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mode: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    env: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    workdir: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<String>,
}

fn invalid(msg: String) -> Error {
    Error::Invalid(msg)
}

fn no_nul(what: &str, s: &str) -> Result<()> {
    if s.contains('\0') {
        return Err(invalid(format!("{what} contains a NUL byte, which no command or path can carry")));
    }
    Ok(())
}

/// An absolute path in the sandbox.
pub(crate) fn check_abs(what: &str, p: &str) -> Result<()> {
    no_nul(what, p)?;
    if !p.starts_with('/') {
        return Err(invalid(format!("{what} {p:?} is not absolute; start it with '/'")));
    }
    if p.len() > MAX_PATH_BYTES {
        return Err(invalid(format!("{what} is {} bytes long, over the limit of {MAX_PATH_BYTES}", p.len())));
    }
    Ok(())
}

/// A local path that stays inside the context directory (checked again on disk, where
/// symlinks are refused).
pub(crate) fn check_rel(what: &str, p: &str) -> Result<()> {
    no_nul(what, p)?;
    if p.is_empty() || p.len() > MAX_PATH_BYTES {
        return Err(invalid(format!("{what} {p:?} must be 1 to {MAX_PATH_BYTES} bytes")));
    }
    let path = std::path::Path::new(p);
    if path.is_absolute() || path.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
        return Err(invalid(format!(
            "{what} {p:?} leaves the build context; name a path inside it, without '..' or a leading '/'"
        )));
    }
    Ok(())
}

pub(crate) fn check_env_key(k: &str) -> Result<()> {
    let mut chars = k.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && k.len() <= 256;
    if !ok {
        return Err(invalid(format!(
            "environment variable name {k:?} is not valid; use letters, digits and '_' (not first a digit), at most 256 bytes"
        )));
    }
    Ok(())
}

pub(crate) fn check_user(u: &str) -> Result<()> {
    let mut chars = u.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && u.len() <= 32;
    if !ok {
        return Err(invalid(format!(
            "user {u:?} is not a valid user name or uid; use letters, digits, '_', '-', '.' (at most 32 bytes)"
        )));
    }
    Ok(())
}

fn check_run(cmd: &RunCmd) -> Result<()> {
    match cmd {
        RunCmd::Shell(s) => {
            no_nul("run", s)?;
            if s.trim().is_empty() {
                return Err(invalid("run: the command is empty".into()));
            }
            if s.len() > MAX_COMMAND_BYTES {
                return Err(invalid(format!(
                    "run: the command is {} bytes, over the limit of {MAX_COMMAND_BYTES}; upload a script and run that",
                    s.len()
                )));
            }
        }
        RunCmd::Argv(words) => {
            if words.is_empty() || words[0].is_empty() {
                return Err(invalid("run: the argument list is empty or names no program".into()));
            }
            if words.len() > MAX_ARGV {
                return Err(invalid(format!("run: {} words, over the limit of {MAX_ARGV}", words.len())));
            }
            let total: usize = words.iter().map(String::len).sum();
            if total > MAX_COMMAND_BYTES {
                return Err(invalid(format!(
                    "run: {total} bytes of arguments, over the limit of {MAX_COMMAND_BYTES}"
                )));
            }
            words.iter().try_for_each(|w| no_nul("run", w))?;
        }
    }
    Ok(())
}

fn check_env(vars: &BTreeMap<String, String>) -> Result<()> {
    if vars.is_empty() || vars.len() > MAX_ENV_VARS {
        return Err(invalid(format!("env: set 1 to {MAX_ENV_VARS} variables, not {}", vars.len())));
    }
    for (k, v) in vars {
        check_env_key(k)?;
        no_nul(&format!("env {k}"), v)?;
        if v.len() > MAX_ENV_VALUE_BYTES {
            return Err(invalid(format!(
                "env {k}: the value is {} bytes, over the limit of {MAX_ENV_VALUE_BYTES}",
                v.len()
            )));
        }
    }
    Ok(())
}

fn parse_mode(m: &str) -> Result<u32> {
    u32::from_str_radix(m, 8)
        .ok()
        .filter(|v| *v <= 0o7777)
        .ok_or_else(|| invalid(format!("mode {m:?} is not octal permission bits (0 to 7777), e.g. \"755\"")))
}

impl Step {
    /// Checks the step's own fields against the limits.
    pub fn validate(&self) -> Result<()> {
        match self {
            Step::Run(cmd) => check_run(cmd),
            Step::Upload { src, to } => {
                check_rel("upload", src)?;
                check_abs("upload's `to`", to)
            }
            Step::File { path, content, mode } => {
                check_abs("file", path)?;
                if content.len() > MAX_INLINE_BYTES {
                    return Err(invalid(format!(
                        "file {path}: {} bytes of content, over the limit of {MAX_INLINE_BYTES}; upload larger files",
                        content.len()
                    )));
                }
                match mode {
                    Some(m) if *m > 0o7777 => Err(invalid(format!("file {path}: mode {m:o} is over 7777"))),
                    _ => Ok(()),
                }
            }
            Step::Env(vars) => check_env(vars),
            Step::Workdir(p) => check_abs("workdir", p),
            Step::User(u) => check_user(u),
        }
    }

    /// One line for progress and logs.
    pub fn describe(&self) -> String {
        let mut s = match self {
            Step::Run(RunCmd::Shell(c)) => format!("run {c}"),
            Step::Run(RunCmd::Argv(w)) => format!("run {w:?}"),
            Step::Upload { src, to } => format!("upload {src} -> {to}"),
            Step::File { path, content, .. } => format!("file {path} ({} bytes)", content.len()),
            Step::Env(vars) => format!("env {}", vars.keys().cloned().collect::<Vec<_>>().join(" ")),
            Step::Workdir(p) => format!("workdir {p}"),
            Step::User(u) => format!("user {u}"),
        };
        if s.len() > 120 {
            let mut cut = 117;
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            s.truncate(cut);
            s.push_str("...");
        }
        s.replace(|c: char| c.is_control(), " ")
    }

    /// True when the step changes the sandbox (so its result is a new snapshot); env and user
    /// only change how later commands run. A workdir is created when missing, so it counts.
    pub fn changes_sandbox(&self) -> bool {
        matches!(self, Step::Run(_) | Step::Upload { .. } | Step::File { .. } | Step::Workdir(_))
    }
}

impl TryFrom<RawStep> for Step {
    type Error = Error;
    fn try_from(r: RawStep) -> Result<Step> {
        let kinds = [
            ("run", r.run.is_some()),
            ("upload", r.upload.is_some()),
            ("file", r.file.is_some()),
            ("env", r.env.is_some()),
            ("workdir", r.workdir.is_some()),
            ("user", r.user.is_some()),
        ];
        let set: Vec<&str> = kinds.iter().filter(|(_, on)| *on).map(|(k, _)| *k).collect();
        if set.len() != 1 {
            return Err(invalid(format!(
                "a step sets exactly one of run, upload, file, env, workdir, user; this one sets {}",
                if set.is_empty() { "none".to_string() } else { set.join(" and ") }
            )));
        }
        if r.to.is_some() && r.upload.is_none() {
            return Err(invalid("`to` belongs to an upload step".into()));
        }
        if (r.content.is_some() || r.mode.is_some()) && r.file.is_none() {
            return Err(invalid("`content` and `mode` belong to a file step".into()));
        }
        let step = if let Some(run) = r.run {
            Step::Run(run)
        } else if let Some(src) = r.upload {
            let to = r
                .to
                .ok_or_else(|| invalid(format!("upload {src:?} has no `to` (the absolute destination)")))?;
            Step::Upload { src, to }
        } else if let Some(path) = r.file {
            let mode = r.mode.as_deref().map(parse_mode).transpose()?;
            Step::File { path, content: r.content.unwrap_or_default(), mode }
        } else if let Some(env) = r.env {
            Step::Env(env)
        } else if let Some(w) = r.workdir {
            Step::Workdir(w)
        } else {
            Step::User(r.user.unwrap_or_default())
        };
        step.validate()?;
        Ok(step)
    }
}

impl From<Step> for RawStep {
    fn from(s: Step) -> RawStep {
        match s {
            Step::Run(c) => RawStep { run: Some(c), ..RawStep::default() },
            Step::Upload { src, to } => RawStep { upload: Some(src), to: Some(to), ..RawStep::default() },
            Step::File { path, content, mode } => RawStep {
                file: Some(path),
                content: Some(content),
                mode: mode.map(|m| format!("{m:o}")),
                ..RawStep::default()
            },
            Step::Env(e) => RawStep { env: Some(e), ..RawStep::default() },
            Step::Workdir(w) => RawStep { workdir: Some(w), ..RawStep::default() },
            Step::User(u) => RawStep { user: Some(u), ..RawStep::default() },
        }
    }
}
