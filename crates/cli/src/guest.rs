//! `branchbox guest`: the Linux guest's kernel and root disk, built by the project's recipes
//! into the image cache (see docs/guest.md).

use crate::args::GuestCmd;
use crate::output::{print, progress_fn};
use anyhow::{anyhow, Result};
use branchbox_core::Config;
use branchbox_image::{
    cached_disk, cached_kernel, ensure_disk, ensure_kernel, external_kernel, image_id, resolve_image, Image,
    KernelRecipe, KernelSource, Recipe, BUILTIN_IMAGES, KERNEL_ENV,
};
use std::path::PathBuf;
use std::time::Instant;

/// Runs a guest subcommand; returns the exit code.
pub fn run(cfg: &Config, cmd: &GuestCmd, json: bool) -> Result<i32> {
    match cmd {
        GuestCmd::Kernel { print_path, source, cached } => {
            kernel(cfg, *print_path, source.as_ref(), *cached, json)
        }
        GuestCmd::Disk { print_path, cached, image } => disk(cfg, image, *print_path, *cached, json),
    }
}

fn kernel(cfg: &Config, print_path: bool, source: Option<&PathBuf>, cached: bool, json: bool) -> Result<i32> {
    let t = Instant::now();
    let k = match std::env::var_os(KERNEL_ENV).filter(|v| !v.is_empty()) {
        Some(path) => external_kernel(PathBuf::from(path).as_path())?,
        None => {
            let source = match source {
                Some(p) => KernelSource::tarball(p)?,
                None => KernelSource::debian()?,
            };
            if cached {
                cached_kernel(&cfg.images_dir, &source).ok_or_else(|| {
                    anyhow!(
                        "the guest kernel is not built in {} (recipe {}); build it with `branchbox guest kernel` \
                         (about 10 minutes on 2 idle cores), or name one with {KERNEL_ENV}",
                        cfg.images_dir.display(),
                        KernelRecipe::new(&source).hash()
                    )
                })?
            } else {
                ensure_kernel(&cfg.images_dir, &source, &mut progress_fn())?
            }
        }
    };
    let took = t.elapsed().as_secs_f64();
    let path = k.dir.clone().or_else(|| k.vmlinux.clone()).or_else(|| k.bzimage.clone()).unwrap_or_default();
    if print_path && !json {
        println!("{}", path.display());
        return Ok(0);
    }
    let mut v = serde_json::to_value(&k)?;
    v["seconds"] = took.into();
    print(json, &v, || {
        let how = if k.built {
            "built"
        } else if k.dir.is_some() {
            "cached"
        } else {
            "from BRANCHBOX_KERNEL"
        };
        let mut text = format!("guest kernel {} ({how} in {took:.3} s): {}", k.hash, path.display());
        for (name, file) in [("vmlinux", &k.vmlinux), ("bzImage", &k.bzimage)] {
            if let Some(f) = file {
                text.push_str(&format!("\n  {name}: {}", f.display()));
            }
        }
        text
    });
    Ok(0)
}

fn disk(cfg: &Config, name: &str, print_path: bool, cached: bool, json: bool) -> Result<i32> {
    let t = Instant::now();
    let (image, d) = if cached {
        let recipe = Recipe::named(name).ok_or_else(|| {
            anyhow!("--cached takes a built-in image ({}), not {name:?}", BUILTIN_IMAGES.join(", "))
        })?;
        let id = image_id(&recipe, &cfg.agent)?;
        let image = Image { rootfs: cfg.images_dir.join(&id).join("rootfs"), id, built: false };
        let d = cached_disk(&cfg.images_dir, &image, &cfg.agent)?.ok_or_else(|| {
            anyhow!(
                "the root disk for image {} with the agent {} is not built in {}; build it with \
                 `branchbox guest disk --image {name}`",
                image.id,
                cfg.agent.display(),
                cfg.images_dir.display()
            )
        })?;
        (image, d)
    } else {
        let mut p = progress_fn();
        let image = resolve_image(&cfg.images_dir, name, &cfg.agent, &cfg.mirror, &mut p)?;
        (image.clone(), ensure_disk(&cfg.images_dir, &image, &cfg.agent, &mut p)?)
    };
    let took = t.elapsed().as_secs_f64();
    if print_path && !json {
        println!("{}", d.path.display());
        return Ok(0);
    }
    let mut v = serde_json::to_value(&d)?;
    v["seconds"] = took.into();
    v["image"] = image.id.clone().into();
    print(json, &v, || {
        let how = if d.built { "built" } else { "cached" };
        format!(
            "root disk {} of {} ({how} in {took:.3} s, {} MiB): {}",
            d.hash,
            image.id,
            d.bytes >> 20,
            d.path.display()
        )
    });
    Ok(0)
}
