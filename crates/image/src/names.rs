//! Image names: the built-in recipes (`default`, `minimal`) and images imported from an OCI
//! image layout or a `docker save` tarball.
//!
//! An import unpacks into `oci-<hash>/rootfs` (the hash covers the layers' digests, so the same
//! image imported twice is unpacked once) and records its name in `names/<name>.json`. Like a
//! debootstrap base, that tree gets the agent in an `img-<hash>` directory when a sandbox first
//! needs it.

use crate::build::{clean_stale, ensure_image, install_agent, tmp_dir, Image};
use crate::lock::DirLock;
use crate::oci::{self, RunConfig};
use crate::recipe::{Recipe, BUILTIN_IMAGES};
use crate::unpack::{make_dir, resolve_in_root, Budget, ImportLimits};
use branchbox_model::{Error, Name, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// Bumped when how an import unpacks changes, so old trees are not reused.
const IMPORT_FORMAT: u32 = 1;
/// The agent's dynamic loader: an image without it cannot run the agent.
const LOADER: &str = "/lib64/ld-linux-x86-64.so.2";
/// Mount points the sandbox runtime mounts over; made when the image lacks them.
const MOUNT_POINTS: [(&str, u32); 6] =
    [("proc", 0o555), ("dev", 0o755), ("sys", 0o555), ("tmp", 0o1777), ("run", 0o755), ("root", 0o700)];

/// An imported image's record.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ImportedImage {
    /// Its name.
    pub name: String,
    /// Its unpacked tree in the image cache (`oci-<hash>`).
    pub tree: String,
    /// The sha256 digests of its layers' tar streams, in order.
    pub diff_ids: Vec<String>,
    /// The environment and working directory its configuration names.
    pub config: RunConfig,
    /// Where it was imported from.
    pub source: PathBuf,
    /// Device nodes and fifos its layers held, not created.
    pub skipped_entries: u64,
}

fn names_dir(images: &Path) -> PathBuf {
    images.join("names")
}

fn check_name(name: &str) -> Result<()> {
    Name::parse("image name", name)?;
    if BUILTIN_IMAGES.contains(&name) {
        return Err(Error::InvalidInput(format!(
            "{name:?} is a built-in image name ({}); import under another name",
            BUILTIN_IMAGES.join(", ")
        )));
    }
    Ok(())
}

/// The record of the imported image `name`, if there is one.
pub fn imported_image(images: &Path, name: &str) -> Result<Option<ImportedImage>> {
    if Name::parse("image name", name).is_err() {
        return Ok(None);
    }
    let path = names_dir(images).join(format!("{name}.json"));
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            Error::Backend(format!("{}: unreadable image record ({e}); import it again", path.display()))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(&path, e)),
    }
}

/// Every image name: the built-in ones, then the imported ones, sorted.
pub fn image_names(images: &Path) -> Result<Vec<String>> {
    let mut imported = Vec::new();
    if let Ok(entries) = std::fs::read_dir(names_dir(images)) {
        for e in entries.flatten() {
            if let Some(name) = e.file_name().to_str().and_then(|n| n.strip_suffix(".json")) {
                imported.push(name.to_string());
            }
        }
    }
    imported.sort();
    Ok(BUILTIN_IMAGES.iter().map(|s| s.to_string()).chain(imported).collect())
}

/// The image `name` with `agent` installed: a built-in recipe is built when the cache lacks it,
/// an imported tree gets the agent.
pub fn resolve_image(
    images: &Path,
    name: &str,
    agent: &Path,
    mirror: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<Image> {
    if let Some(recipe) = Recipe::named(name) {
        return ensure_image(images, &recipe, agent, mirror, progress);
    }
    Name::parse("image name", name)?;
    let record = imported_image(images, name)?.ok_or_else(|| {
        Error::not_found(
            "image",
            name,
            &format!(
                "use a built-in image ({}) or import one with `branchbox image import {name} PATH`",
                BUILTIN_IMAGES.join(", ")
            ),
        )
    })?;
    let tree = images.join(&record.tree).join("rootfs");
    if !tree.is_dir() {
        return Err(Error::not_found(
            "image tree",
            &record.tree,
            &format!("it was removed from the image cache; import {name} again"),
        ));
    }
    let _lock = DirLock::take(images)?;
    let meta = serde_json::json!({ "imported": record });
    install_agent(images, &tree_hash(&record.diff_ids), &tree, agent, meta, progress)
}

fn tree_hash(diff_ids: &[String]) -> String {
    hex::encode(Sha256::digest(format!("oci-tree {IMPORT_FORMAT}\n{}", diff_ids.join("\n")).as_bytes()))
}

/// What removing an imported image's name took away.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RemovedImage {
    /// The name's record, as it was.
    pub record: ImportedImage,
    /// Whether its unpacked tree went too (it stays while another name records it).
    pub tree_removed: bool,
    /// The tree's agent-installed images (`img-`) removed with it.
    pub images_removed: Vec<String>,
}

/// The ids of the images (`img-`) in the cache made from an imported image's tree, with any
/// agent: what sandboxes of that image record as theirs.
pub fn images_of(images: &Path, record: &ImportedImage) -> Vec<String> {
    let base = tree_hash(&record.diff_ids);
    let mut out = Vec::new();
    for e in std::fs::read_dir(images).into_iter().flatten().flatten() {
        let id = e.file_name().to_string_lossy().into_owned();
        if !id.starts_with("img-") {
            continue;
        }
        let meta: Option<serde_json::Value> =
            std::fs::read(e.path().join("image.json")).ok().and_then(|b| serde_json::from_slice(&b).ok());
        if meta.is_some_and(|m| m["base"] == base.as_str()) {
            out.push(id);
        }
    }
    out.sort();
    out
}

/// True when another name than `name` records `record`'s tree (importing the same image twice
/// shares it): removing `name` then leaves the tree and its agent images to that name.
pub fn tree_shared(images: &Path, name: &str, record: &ImportedImage) -> Result<bool> {
    for other in image_names(images)? {
        if other != name && imported_image(images, &other)?.is_some_and(|r| r.tree == record.tree) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Removes the imported image `name`: its record, then, unless another name records the same
/// tree, the tree and those of its agent-installed images that `keep` does not hold on to (a
/// sandbox or snapshot still using one). The caller checks first that no live sandbox or
/// template needs the name; built-in names are refused.
pub fn remove_image(images: &Path, name: &str, keep: &dyn Fn(&str) -> bool) -> Result<RemovedImage> {
    if BUILTIN_IMAGES.contains(&name) {
        return Err(Error::InvalidInput(format!(
            "{name:?} is a built-in image ({}); only imported images can be removed",
            BUILTIN_IMAGES.join(", ")
        )));
    }
    let _lock = DirLock::take(images)?;
    let record = imported_image(images, name)?
        .ok_or_else(|| Error::not_found("image", name, "`branchbox image ls` lists the imported ones"))?;
    let file = names_dir(images).join(format!("{name}.json"));
    std::fs::remove_file(&file).map_err(|e| Error::io(&file, e))?;
    let shared = tree_shared(images, name, &record)?;
    let mut images_removed = Vec::new();
    if !shared {
        for id in images_of(images, &record).into_iter().filter(|id| !keep(id)) {
            let dir = images.join(&id);
            std::fs::remove_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
            images_removed.push(id);
        }
        let tree = images.join(&record.tree);
        std::fs::remove_dir_all(&tree).map_err(|e| Error::io(&tree, e))?;
    }
    Ok(RemovedImage { record, tree_removed: !shared, images_removed })
}

/// Imports the OCI image layout (directory or tarball) or `docker save` tarball at `path` as
/// `name`, replacing an import of the same name.
pub fn import_image(
    images: &Path,
    name: &str,
    path: &Path,
    limits: ImportLimits,
    progress: &mut dyn FnMut(&str),
) -> Result<ImportedImage> {
    check_name(name)?;
    std::fs::create_dir_all(names_dir(images)).map_err(|e| Error::io(images, e))?;
    let _lock = DirLock::take(images)?;
    clean_stale(images);
    let tmp = tmp_dir(images, "import");
    let root = tmp.join("rootfs");
    let mut budget = Budget::new(limits);
    let unpacked = std::fs::create_dir_all(&root)
        .map_err(|e| Error::io(&root, e))
        .and_then(|()| oci::unpack(path, &root, &mut budget, progress))
        .and_then(|plan| finish_tree(&root).map(|()| plan));
    let plan = match unpacked {
        Ok(plan) => plan,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
    };
    let hash = tree_hash(&plan.diff_ids);
    let tree = format!("oci-{}", &hash[..16]);
    let dest = images.join(&tree);
    if dest.join("rootfs").is_dir() {
        progress(&format!("tree {tree} is cached"));
        let _ = std::fs::remove_dir_all(&tmp);
    } else {
        std::fs::rename(&tmp, &dest).map_err(|e| Error::io(&dest, e))?;
    }
    let record = ImportedImage {
        name: name.to_string(),
        tree,
        diff_ids: plan.diff_ids,
        config: plan.config,
        source: std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()),
        skipped_entries: budget.skipped,
    };
    let file = names_dir(images).join(format!("{name}.json"));
    let part = names_dir(images).join(format!(".{name}.json.part"));
    let text = serde_json::to_vec_pretty(&record).map_err(|e| Error::Backend(e.to_string()))?;
    std::fs::write(&part, text)
        .and_then(|()| std::fs::rename(&part, &file))
        .map_err(|e| Error::io(&file, e))?;
    progress(&format!("image {name} imported as {}", record.tree));
    Ok(record)
}

/// Makes the mount points the runtime needs and checks the agent can run in the tree.
fn finish_tree(root: &Path) -> Result<()> {
    for (d, mode) in MOUNT_POINTS {
        let p = resolve_in_root(root, d, true)?;
        if std::fs::symlink_metadata(&p).is_err() {
            make_dir(&p, mode)?;
        }
    }
    if !exists_in_root(root, LOADER)? {
        return Err(Error::InvalidInput(format!(
            "the image has no {LOADER}: branchbox's agent needs glibc (Debian, Ubuntu or similar \
             images; Alpine's musl is not supported)"
        )));
    }
    Ok(())
}

/// Whether `path` names something inside `root`, following symlinks (the last one too) as the
/// sandbox would.
fn exists_in_root(root: &Path, path: &str) -> Result<bool> {
    let mut path = PathBuf::from(path);
    for _ in 0..40 {
        let host = match resolve_in_root(root, &path, false) {
            Ok(p) => p,
            Err(_) => return Ok(false),
        };
        match std::fs::symlink_metadata(&host) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(&host).map_err(|e| Error::io(&host, e))?;
                path = match path.parent() {
                    Some(dir) if target.is_relative() => dir.join(target),
                    _ => target,
                };
                path = normalize(&path);
            }
            Ok(_) => return Ok(true),
            Err(_) => return Ok(false),
        }
    }
    Ok(false)
}

/// `path` with `.` and `..` folded (clamped at `/`), as the kernel resolves them.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            std::path::Component::Normal(n) => out.push(n),
            std::path::Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}
