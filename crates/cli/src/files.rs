//! `branchbox files`: copying a file into or out of a sandbox and listing a directory of it,
//! over a connection to the sandbox's agent.

use crate::args::FilesCmd;
use crate::output::{clean, print};
use anyhow::{anyhow, Context, Result};
use branchbox_core::Engine;
use branchbox_model::SandboxId;

/// Runs one `branchbox files` subcommand.
pub fn run(engine: &Engine, cmd: FilesCmd, json: bool) -> Result<i32> {
    match cmd {
        FilesCmd::Get { id, path, local } => {
            let mut conn = engine.connect(&SandboxId::parse(&id)?)?;
            let size =
                crate::download::get(&mut conn, &path, local.as_deref().filter(|l| l.as_os_str() != "-"))?;
            if json {
                print(true, &serde_json::json!({"path": path, "size": size}), String::new);
            }
            Ok(0)
        }
        FilesCmd::Put { id, local, path, mode } => {
            let mode = match mode {
                Some(m) => {
                    Some(u32::from_str_radix(&m, 8).map_err(|_| anyhow!("--mode {m:?} is not octal"))?)
                }
                None => None,
            };
            let mut conn = engine.connect(&SandboxId::parse(&id)?)?;
            let size = if local.as_os_str() == "-" {
                conn.write_file(&path, &mut std::io::stdin(), mode, false, false)?
            } else {
                let mut f =
                    std::fs::File::open(&local).with_context(|| format!("opening {}", local.display()))?;
                conn.write_file(&path, &mut f, mode, false, false)?
            };
            print(json, &serde_json::json!({"path": path, "size": size}), || {
                format!("{size} bytes -> {path}")
            });
            Ok(0)
        }
        FilesCmd::Ls { id, path } => {
            let entries = engine.connect(&SandboxId::parse(&id)?)?.list_dir(&path)?;
            print(json, &entries, || {
                entries
                    .iter()
                    .map(|e| {
                        format!(
                            "{:>4o} {:>10}  {}{}",
                            e.mode,
                            e.size,
                            clean(&e.name),
                            if e.kind == branchbox_protocol::FileKind::Dir { "/" } else { "" }
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            });
            Ok(0)
        }
    }
}
