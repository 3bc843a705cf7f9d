//! Building and caching images.

use crate::lock::DirLock;
use crate::recipe::Recipe;
use crate::unpack::{remove_any, resolve_in_root};
use branchbox_model::{Error, Result};
use sha2::{Digest, Sha256};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A built image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// `img-` followed by 16 hex digits of the image hash.
    pub id: String,
    /// Its root filesystem (mount read-only).
    pub rootfs: PathBuf,
    /// False when it came from the cache.
    pub built: bool,
}

/// Where images install the agent.
pub(crate) const AGENT_IN_IMAGE: &str = "usr/local/bin/branchbox-agent";
/// Where images install the statx compatibility library (`compat/statx_compat.c`).
pub const STATX_COMPAT_IN_IMAGE: &str = "/usr/local/lib/branchbox/libbranchbox-statx.so";
/// The compiled compatibility library.
const STATX_COMPAT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libbranchbox-statx.so"));

/// Hash of everything installed on top of the base: the agent, the compat library and how.
fn payload_hash(path: &Path) -> Result<String> {
    let mut bytes = std::fs::read(path).map_err(|e| {
        Error::Unavailable(format!(
            "the agent binary {} cannot be read ({e}); build it with `cargo build --release -p branchbox-agent` \
             or set BRANCHBOX_AGENT",
            path.display()
        ))
    })?;
    bytes.extend_from_slice(STATX_COMPAT);
    // How the stage installs them: bumped when that changes (2: modes set whatever the umask),
    // so images made the old way are not reused.
    bytes.extend_from_slice(b"agent stage 2");
    Ok(hex::encode(Sha256::digest(&bytes)))
}

pub(crate) fn tmp_dir(images: &Path, stem: &str) -> PathBuf {
    images.join(format!("tmp-{stem}-{:08x}", rand::random::<u32>()))
}

/// The id of the image for `recipe` with `agent`, whether or not it is built.
pub fn image_id(recipe: &Recipe, agent: &Path) -> Result<String> {
    Ok(id_of(&recipe.hash(), &payload_hash(agent)?))
}

fn id_of(base_hash: &str, agent_hash: &str) -> String {
    let image_hash = hex::encode(Sha256::digest(format!("{base_hash}\n{agent_hash}").as_bytes()));
    format!("img-{}", &image_hash[..16])
}

/// Returns the image for `recipe` with `agent` installed, building what the cache lacks.
/// `progress` receives one line per step.
pub fn ensure_image(
    images: &Path,
    recipe: &Recipe,
    agent: &Path,
    mirror: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<Image> {
    std::fs::create_dir_all(images).map_err(|e| Error::io(images, e))?;
    let base_hash = recipe.hash();
    let id = id_of(&base_hash, &payload_hash(agent)?);
    let image_dir = images.join(&id);
    if image_dir.join("rootfs").is_dir() {
        return Ok(Image { id, rootfs: image_dir.join("rootfs"), built: false });
    }
    let _lock = DirLock::take(images)?;
    if image_dir.join("rootfs").is_dir() {
        return Ok(Image { id, rootfs: image_dir.join("rootfs"), built: false });
    }
    clean_stale(images);
    let base_dir = base_dir_of(images, recipe);
    if base_dir.join("rootfs").is_dir() {
        progress(&format!("base filesystem {} is cached", base_dir.display()));
    } else {
        build_base(images, &base_dir, recipe, mirror, progress)?;
    }
    install_agent(
        images,
        &base_hash,
        &base_dir.join("rootfs"),
        agent,
        serde_json::json!({"recipe": recipe}),
        progress,
    )
}

/// Stage 2, shared by recipe and imported images: `source` (a cached tree keyed by
/// `source_hash`) hard-linked, plus the agent and the compat library. The caller holds the lock.
pub(crate) fn install_agent(
    images: &Path,
    source_hash: &str,
    source: &Path,
    agent: &Path,
    mut meta: serde_json::Value,
    progress: &mut dyn FnMut(&str),
) -> Result<Image> {
    let agent_hash = payload_hash(agent)?;
    let id = id_of(source_hash, &agent_hash);
    let image_dir = images.join(&id);
    if image_dir.join("rootfs").is_dir() {
        return Ok(Image { id, rootfs: image_dir.join("rootfs"), built: false });
    }
    progress("installing the agent");
    let tmp = tmp_dir(images, &id);
    let result = (|| {
        std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
        run_checked(Command::new("cp").arg("-a").arg("--link").arg(source).arg(tmp.join("rootfs")), "cp")?;
        let root = tmp.join("rootfs");
        // Resolved inside the tree: an imported image may make these directories symlinks.
        let dest = resolve_in_root(&root, AGENT_IN_IMAGE, true)?;
        // Unlink first: the tree is hard-linked to the base, and writing through a link would
        // change the cached base.
        remove_any(&dest)?;
        std::fs::copy(agent, &dest).map_err(|e| Error::io(&dest, e))?;
        let compat = resolve_in_root(&root, STATX_COMPAT_IN_IMAGE, true)?;
        remove_any(&compat)?;
        std::fs::write(&compat, STATX_COMPAT).map_err(|e| Error::io(&compat, e))?;
        // Every user in the sandbox preloads it; the CLI's umask 077 would make it root's only.
        use std::os::unix::fs::PermissionsExt;
        for (path, mode) in [(&compat, 0o644), (&dest, 0o755)] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
                .map_err(|e| Error::io(path, e))?;
        }
        meta["base"] = source_hash.into();
        meta["agent_sha256"] = agent_hash.clone().into();
        std::fs::write(tmp.join("image.json"), meta.to_string()).map_err(|e| Error::io(&tmp, e))?;
        std::fs::rename(&tmp, &image_dir).map_err(|e| Error::io(&image_dir, e))
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result?;
    progress(&format!("image {id} ready"));
    Ok(Image { id, rootfs: image_dir.join("rootfs"), built: true })
}

/// Removes temporary directories left by interrupted builds (the caller holds the lock).
pub(crate) fn clean_stale(images: &Path) {
    if let Ok(entries) = std::fs::read_dir(images) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with("tmp-") {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

pub(crate) fn run_checked(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::Unavailable(format!("cannot run {what}: {e}")))?;
    if !out.status.success() {
        return Err(Error::Backend(format!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

fn base_dir_of(images: &Path, recipe: &Recipe) -> PathBuf {
    images.join(format!("base-{}", &recipe.hash()[..16]))
}

/// Builds the base tree of `recipe`: debootstrap, or, for a recipe with an apt stage, a copy of
/// its parent's tree (built first when missing) with the packages installed by apt-get.
fn build_base(
    images: &Path,
    base_dir: &Path,
    recipe: &Recipe,
    mirror: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Error::Unavailable("building an image needs root (debootstrap); run as root".into()));
    }
    // The account is made in the same chroot shell as the apt stage, after it.
    let account = match recipe.user_setup() {
        None => String::new(),
        Some(Ok(setup)) => format!(" && {setup}"),
        Some(Err(why)) => return Err(Error::InvalidInput(why)),
    };
    let parent = match recipe.parent() {
        Some(parent) => {
            let dir = base_dir_of(images, &parent);
            if !dir.join("rootfs").is_dir() {
                build_base(images, &dir, &parent, mirror, progress)?;
            }
            Some(dir)
        }
        None => None,
    };
    let tmp = tmp_dir(images, "base");
    let rootfs = tmp.join("rootfs");
    std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let made = match &parent {
        None => {
            progress(&format!(
                "building the base filesystem: debootstrap {} {} with {} (about two minutes)",
                recipe.variant,
                recipe.suite,
                recipe.include.join(",")
            ));
            let mut cmd = Command::new("debootstrap");
            cmd.arg(format!("--variant={}", recipe.variant))
                .arg(format!("--include={}", recipe.include.join(",")))
                .arg(&recipe.suite)
                .arg(&rootfs)
                .arg(mirror);
            run_streaming(
                cmd,
                "debootstrap",
                "install it: apt-get install debootstrap",
                mirror,
                &mut |line| line.strip_prefix("I: ").map(|s| s.to_string()),
                progress,
            )
        }
        Some(parent) => {
            progress(&format!("installing {} with apt-get (a few minutes)", recipe.apt.join(",")));
            run_checked(Command::new("cp").arg("-a").arg(parent.join("rootfs")).arg(&rootfs), "cp").and_then(
                |()| {
                    let mut cmd = Command::new("chroot");
                    cmd.arg(&rootfs)
                        .args(["/usr/bin/env", "DEBIAN_FRONTEND=noninteractive", "/bin/sh", "-c"])
                        // No fsync per file (hundreds of small node packages): the tree is
                        // synced once below, before it is renamed into the cache.
                        .arg(format!(
                            "apt-get update -q && apt-get install -y -q --no-install-recommends \
                             -o Dpkg::Options::=--force-unsafe-io {}{account}",
                            recipe.apt.join(" ")
                        ));
                    run_streaming(
                        cmd,
                        "apt-get",
                        "it runs in the image tree with chroot",
                        mirror,
                        &mut |line| line.starts_with("Setting up ").then(|| line.to_string()),
                        progress,
                    )
                },
            )
        }
    };
    let result = made.and_then(|()| {
        if parent.is_some() {
            run_checked(Command::new("sync").arg("-f").arg(&rootfs), "sync")?;
        }
        // Package caches are not part of the image.
        for d in ["var/cache/apt/archives", "var/lib/apt/lists", "var/cache/apt"] {
            if let Ok(entries) = std::fs::read_dir(rootfs.join(d)) {
                for e in entries.flatten() {
                    if e.path().is_file() {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
            }
        }
        std::fs::write(tmp.join("recipe.json"), serde_json::to_vec_pretty(recipe).unwrap_or_default())
            .map_err(|e| Error::io(&tmp, e))?;
        std::fs::rename(&tmp, base_dir).map_err(|e| Error::io(base_dir, e))
    });
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

/// Runs `cmd`, passing the lines `step` picks to `progress`; on failure, reports the last lines.
fn run_streaming(
    mut cmd: Command,
    what: &str,
    install_hint: &str,
    mirror: &str,
    step: &mut dyn FnMut(&str) -> Option<String>,
    progress: &mut dyn FnMut(&str),
) -> Result<()> {
    let (reader, writer) = std::io::pipe().map_err(|e| Error::io("pipe", e))?;
    let writer2 = writer.try_clone().map_err(|e| Error::io("pipe", e))?;
    cmd.stdin(Stdio::null()).stdout(writer).stderr(writer2);
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::Unavailable(format!("{what} cannot be started ({e}); {install_hint}")))?;
    drop(cmd);
    let mut tail: Vec<String> = Vec::new();
    for line in BufReader::new(reader).lines().map_while(|l| l.ok()) {
        if let Some(s) = step(&line) {
            progress(&s);
        }
        tail.push(line);
        if tail.len() > 12 {
            tail.remove(0);
        }
    }
    let status = child.wait().map_err(|e| Error::io(what, e))?;
    if !status.success() {
        return Err(Error::Backend(format!(
            "{what} failed ({status}); is {mirror} reachable? Last output: {}",
            tail.join(" / ")
        )));
    }
    Ok(())
}
