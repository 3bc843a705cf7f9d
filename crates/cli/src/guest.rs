//! `branchbox guest`: the Linux guest's kernel and root disk, built by the project's recipes
//! into the image cache (see docs/guest.md).

use crate::args::GuestCmd;
use crate::commands::progress_fn;
use crate::output::print;
use anyhow::Result;
use branchbox_core::Config;
use branchbox_image::{
    ensure_disk, ensure_image, ensure_kernel, external_kernel, KernelSource, Recipe, KERNEL_ENV,
};
use std::path::PathBuf;
use std::time::Instant;

/// Runs a guest subcommand; returns the exit code.
pub fn run(cfg: &Config, cmd: &GuestCmd, json: bool) -> Result<i32> {
    match cmd {
        GuestCmd::Kernel { print_path, source } => kernel(cfg, *print_path, source.as_ref(), json),
        GuestCmd::Disk { print_path } => disk(cfg, *print_path, json),
    }
}

fn kernel(cfg: &Config, print_path: bool, source: Option<&PathBuf>, json: bool) -> Result<i32> {
    let t = Instant::now();
    let k = match std::env::var_os(KERNEL_ENV).filter(|v| !v.is_empty()) {
        Some(path) => external_kernel(PathBuf::from(path).as_path())?,
        None => {
            let source = match source {
                Some(p) => KernelSource::tarball(p)?,
                None => KernelSource::debian()?,
            };
            ensure_kernel(&cfg.images_dir, &source, &mut progress_fn())?
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
        format!("guest kernel {} ({how} in {took:.3} s): {}", k.hash, path.display())
    });
    Ok(0)
}

fn disk(cfg: &Config, print_path: bool, json: bool) -> Result<i32> {
    let t = Instant::now();
    let mut p = progress_fn();
    let image = ensure_image(&cfg.images_dir, &Recipe::default(), &cfg.agent, &cfg.mirror, &mut p)?;
    let d = ensure_disk(&cfg.images_dir, &image, &cfg.agent, &mut p)?;
    drop(p);
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
