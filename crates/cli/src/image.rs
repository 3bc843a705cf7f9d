//! `branchbox image`: build, import and list images (see docs/image.md).

use crate::args::ImageCmd;
use crate::commands::progress_fn;
use crate::output::print;
use anyhow::Result;
use branchbox_core::Engine;
use branchbox_image::{image_names, import_image, imported_image, ImportLimits, BUILTIN_IMAGES};

/// Runs one image subcommand.
pub fn run(engine: &Engine, cmd: ImageCmd, json: bool) -> Result<i32> {
    match cmd {
        ImageCmd::Build { name } => build(engine, &name, json),
        ImageCmd::Import { name, path, max_mib } => {
            let t = std::time::Instant::now();
            let limits =
                ImportLimits { max_bytes: max_mib.saturating_mul(1 << 20), ..ImportLimits::default() };
            let mut p = progress_fn();
            let record = import_image(&engine.config().images_dir, &name, &path, limits, &mut p)?;
            // Install the agent now, so the first sandbox does not wait for it.
            let image = engine.build_image(&name, &mut p)?;
            let took = t.elapsed().as_secs_f64();
            let mut v = serde_json::to_value(&record)?;
            v["id"] = image.id.clone().into();
            v["seconds"] = took.into();
            print(json, &v, || {
                let skipped = match record.skipped_entries {
                    0 => String::new(),
                    n => format!(" ({n} device nodes or fifos skipped)"),
                };
                format!("{name}: {} in {took:.3} s{skipped}; use `branchbox create --image {name}`", image.id)
            });
            Ok(0)
        }
        ImageCmd::Ls => {
            let images = &engine.config().images_dir;
            let mut rows = Vec::new();
            for name in image_names(images)? {
                let kind = if BUILTIN_IMAGES.contains(&name.as_str()) { "built-in" } else { "imported" };
                let from = imported_image(images, &name)?.map(|r| r.source.display().to_string());
                rows.push(serde_json::json!({ "name": name, "kind": kind, "source": from }));
            }
            print(json, &rows, || {
                rows.iter()
                    .map(|r| {
                        let from = r["source"].as_str().map(|s| format!(" from {s}")).unwrap_or_default();
                        format!(
                            "{}\t{}{from}",
                            r["name"].as_str().unwrap_or(""),
                            r["kind"].as_str().unwrap_or("")
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            });
            Ok(0)
        }
    }
}

fn build(engine: &Engine, name: &str, json: bool) -> Result<i32> {
    let t = std::time::Instant::now();
    let mut p = progress_fn();
    let image = engine.build_image(name, &mut p)?;
    let took = t.elapsed();
    let v = serde_json::json!({
        "name": name, "id": image.id, "rootfs": image.rootfs, "built": image.built, "seconds": took.as_secs_f64()
    });
    print(json, &v, || {
        let how = if image.built { "built" } else { "cached" };
        format!("{name}: {} ({how} in {:.3} s): {}", image.id, took.as_secs_f64(), image.rootfs.display())
    });
    Ok(0)
}
