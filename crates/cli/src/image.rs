//! `branchbox image`: build, import and list images (see docs/image.md).

use crate::args::ImageCmd;
use crate::output::{print, progress_fn};
use anyhow::{bail, Result};
use branchbox_core::Engine;
use branchbox_image::{
    image_names, images_of, import_image, imported_image, remove_image, tree_shared, ImportLimits,
    BUILTIN_IMAGES,
};
use branchbox_model::SandboxState;
use branchbox_template::Base;
use std::collections::BTreeSet;

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
        ImageCmd::Rm { name } => remove(engine, &name, json),
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

/// Removes an imported image once nothing live needs it: no sandbox that is not lost runs on
/// its tree (unless another name records the same tree, which then keeps it), no template
/// names it as its base. Its agent-installed images stay while a sandbox record
/// or a snapshot refers to one (so they can still be restored), and whenever the image cache is
/// shared with other data directories (`BRANCHBOX_IMAGES`), whose use cannot be seen from here.
fn remove(engine: &Engine, name: &str, json: bool) -> Result<i32> {
    let cfg = engine.config();
    let images = &cfg.images_dir;
    if let Some(record) = imported_image(images, name)? {
        // A tree another name records stays, and with it what its sandboxes run on.
        let ids = if tree_shared(images, name, &record)? { Vec::new() } else { images_of(images, &record) };
        let running: Vec<String> = engine
            .list()?
            .into_iter()
            .filter(|v| v.sandbox.state != SandboxState::Lost && ids.contains(&v.sandbox.image))
            .map(|v| v.sandbox.id.to_string())
            .collect();
        if !running.is_empty() {
            bail!(
                "image {name} is in use by sandbox(es) {}; kill them first (`branchbox kill ID...`)",
                running.join(", ")
            );
        }
        let templates = engine.templates()?;
        let is_template = |n: &str| templates.iter().any(|t| t.spec.name == n);
        let bases: Vec<String> = templates
            .iter()
            .filter(|t| match t.spec.base() {
                Ok(Base::Image(n)) => n == name,
                Ok(Base::Either(n)) => n == name && !is_template(&n),
                _ => false,
            })
            .map(|t| t.spec.name.clone())
            .collect();
        if !bases.is_empty() {
            bail!(
                "image {name} is the base of template(s) {}; remove them first (`branchbox template rm NAME`)",
                bases.join(", ")
            );
        }
    }
    let shared_cache = *images != cfg.data_dir.join("images");
    let mut used: BTreeSet<String> = engine.sandbox_records()?.into_iter().map(|s| s.image).collect();
    used.extend(engine.snapshots()?.into_iter().filter(|s| s.deleted_ms.is_none()).map(|s| s.image));
    let gone = remove_image(images, name, &|id| shared_cache || used.contains(id))?;
    print(json, &gone, || {
        let tree = if gone.tree_removed {
            format!("its tree {} removed", gone.record.tree)
        } else {
            format!("its tree {} stays: another name records it", gone.record.tree)
        };
        format!("removed image {name}; {tree}; {} agent image(s) removed", gone.images_removed.len())
    });
    Ok(0)
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
