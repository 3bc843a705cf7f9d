//! `branchbox template`: build (from a TOML file or a Dockerfile subset), ls, rm, log.

use crate::args::TemplateCmd;
use crate::output::{clean, each_target, print};
use anyhow::{bail, Context, Result};
use branchbox_core::{BuildEvent, Engine, Template, TemplateStatus};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Runs a template subcommand.
pub fn run(engine: &Engine, cmd: TemplateCmd, json: bool) -> Result<i32> {
    match cmd {
        TemplateCmd::Build { name, file, context } => build(engine, name, &file, context, json),
        TemplateCmd::Ls => {
            let all = engine.templates()?;
            print(json, &all, || all.iter().map(line).collect::<Vec<_>>().join("\n"));
            Ok(0)
        }
        TemplateCmd::Rm { names } => each_target(json, "template rm", "removed", false, &names, |n| {
            engine.delete_template(n)?;
            Ok(vec![n.to_string()])
        }),
        TemplateCmd::Log { name } => {
            engine.template(&name)?;
            let path = engine.template_log_path(&name)?;
            let text = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            std::io::stdout().write_all(&text)?;
            Ok(0)
        }
    }
}

fn line(t: &Template) -> String {
    let status = match &t.status {
        TemplateStatus::Ready => "ready".to_string(),
        TemplateStatus::Failed { step, exit_code, .. } => match exit_code {
            Some(c) => format!("failed at step {step} (exit {c})"),
            None => format!("failed at step {step}"),
        },
    };
    let snap = t.built.as_ref().map(|b| b.snapshot.to_string()).unwrap_or_else(|| "-".into());
    format!(
        "{:<24} {:<24} {:>3} steps  {snap}  {status}",
        clean(&t.spec.name),
        clean(&t.spec.base),
        t.spec.steps.len()
    )
}

fn build(
    engine: &Engine,
    name: Option<String>,
    file: &Path,
    context: Option<PathBuf>,
    json: bool,
) -> Result<i32> {
    let meta = std::fs::metadata(file).with_context(|| format!("reading {}", file.display()))?;
    if meta.len() > branchbox_template::MAX_FILE_BYTES as u64 {
        bail!(
            "{} is {} bytes, over the limit of {} for template files",
            file.display(),
            meta.len(),
            branchbox_template::MAX_FILE_BYTES
        );
    }
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let is_toml = file.extension().is_some_and(|e| e == "toml");
    let mut spec = if is_toml {
        branchbox_template::parse_toml(&text).map_err(branchbox_model::Error::from)?
    } else {
        let Some(n) = &name else {
            bail!("a Dockerfile names no template: `branchbox template build NAME -f {}`", file.display())
        };
        branchbox_template::dockerfile::parse(n, &text).map_err(branchbox_model::Error::from)?
    };
    if let Some(n) = name {
        spec.name = n;
        spec.validate().map_err(branchbox_model::Error::from)?;
    }
    let context = match context {
        Some(c) => c,
        None => file.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf(),
    };
    let mut err = std::io::stderr();
    let t = engine.build_template(spec, Some(&context), &mut |ev| match ev {
        BuildEvent::Step { index, total, step, cached } => {
            let how = if *cached { " (cached)" } else { "" };
            let _ = writeln!(err, "step {index}/{total}: {}{how}", clean(step));
        }
        BuildEvent::Output { data, .. } => {
            let _ = err.write_all(data.as_bytes());
        }
        BuildEvent::StepDone { cached: false, snapshot, ms, .. } => {
            let _ = writeln!(err, "  -> {snapshot} in {ms} ms");
        }
        BuildEvent::StepDone { .. } => {}
    })?;
    print(json, &t, || {
        let cached = t.steps.iter().filter(|s| s.cached).count();
        let snap = t.built.as_ref().map(|b| b.snapshot.to_string()).unwrap_or_default();
        format!(
            "{}: {} steps ({cached} cached) in {:.3} s, ready at {snap}",
            t.spec.name,
            t.steps.len(),
            t.build_ms as f64 / 1000.0
        )
    });
    Ok(0)
}
