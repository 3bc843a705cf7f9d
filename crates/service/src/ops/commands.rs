//! Commands: the agent's spec of a command a client asks for (its shell line or argv, the
//! sandbox's environment, cwd, account, timeout and output cap, all checked), and the defaults
//! of the template the sandbox came from. The native API, its terminals and envd's Start all
//! build their commands here.

use super::types::RunCommand;
use crate::error::{ApiError, ApiResult};
use crate::extract::{account_name, check_map, sandbox_path, seconds};
use crate::state::AppState;
use branchbox_core::Engine;
use branchbox_model::SandboxId;
use branchbox_protocol::{Command, ExecSpec};
use std::time::Duration;

/// Largest command description (argv, shell line, environment, cwd); the agent protocol's
/// frame header is 64 KiB and the spec travels in it.
const MAX_SPEC_BYTES: usize = 48 * 1024;

/// Builds the agent's spec from a request and the sandbox's environment.
pub fn spec(st: &AppState, id: &SandboxId, req: &RunCommand) -> ApiResult<ExecSpec> {
    let cmd = match (&req.cmd, &req.argv) {
        (Some(line), None) if !line.trim().is_empty() => Command::Shell(line.clone()),
        (None, Some(argv)) if argv.first().is_some_and(|a| !a.is_empty()) => Command::Argv(argv.clone()),
        _ => {
            return Err(ApiError::invalid(
                "give exactly one of cmd (a non-empty shell line) or argv (a non-empty list)",
            ))
        }
    };
    let extra = req.envs.clone().unwrap_or_default();
    check_map("envs", &extra, true)?;
    let mut s = ExecSpec::new(cmd);
    s.env = st.db().get(id)?.map(|m| m.envs).unwrap_or_default();
    s.env.extend(extra);
    s.cwd = req.cwd.as_deref().map(sandbox_path).transpose()?;
    s.user = req.user.as_deref().map(|u| account_name("user", u)).transpose()?;
    let t = seconds(
        "timeout",
        req.timeout.unwrap_or(st.cfg.default_exec_timeout_s as f64),
        st.cfg.max_exec_timeout_s,
    )?;
    s.timeout_ms = Some(t.as_millis().max(1) as u64);
    s.output_cap = Some(st.cfg.max_output_bytes);
    if serde_json::to_vec(&s).map(|v| v.len()).unwrap_or(usize::MAX) > MAX_SPEC_BYTES {
        return Err(ApiError::too_large(format!(
            "the command, its environment and cwd take more than {MAX_SPEC_BYTES} bytes; put long scripts in a file"
        )));
    }
    let has_nul = match &s.cmd {
        Command::Argv(a) => a.iter().any(|x| x.contains('\0')),
        Command::Shell(l) => l.contains('\0'),
    };
    if has_nul {
        return Err(ApiError::invalid("commands must not contain NUL bytes"));
    }
    Ok(s)
}

/// How long a command may run, beyond which its agent connection counts as stalled (the
/// agent answers at the command's timeout, when it kills it).
pub fn run_time(spec: &ExecSpec) -> Duration {
    Duration::from_millis(spec.timeout_ms.unwrap_or(0))
}

/// A template's commands' defaults applied to a command for one of its sandboxes.
pub fn with_defaults(engine: &Engine, id: &SandboxId, mut spec: ExecSpec) -> ApiResult<ExecSpec> {
    if let Some(d) = engine.exec_defaults(id)? {
        d.apply(&mut spec);
    }
    Ok(spec)
}
