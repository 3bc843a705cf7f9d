//! The guest kernel: built from Debian's `linux-source-6.12` with the config fragments under
//! `images/kernel/`, cached by recipe hash under `<images>/kernel/<hash>/`.
//!
//! The build: extract the source, `make tinyconfig`, merge the fragments
//! (`scripts/kconfig/merge_config.sh`), `make olddefconfig`, check that every fragment option
//! stuck, `make bzImage` (which links `vmlinux` first). All of it happens in a temporary
//! directory; only the finished outputs are renamed into the cache, so an interrupted build
//! never leaves a directory that looks complete. This module installs nothing: a missing
//! source package or tool is an error that says what to install.

use crate::build::{clean_stale, run_checked, tmp_dir};
use crate::kconfig;
use crate::lock::DirLock;
use branchbox_model::{Error, Result};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Bumped when the build steps change in a way that changes the outputs.
pub const KERNEL_BUILDER_VERSION: u32 = 1;

/// The config fragments, merged in this order over `make tinyconfig`.
pub const KERNEL_FRAGMENTS: &[(&str, &str)] = &[
    ("microvm.config", include_str!("../../../images/kernel/microvm.config")),
    ("qemu-q35.config", include_str!("../../../images/kernel/qemu-q35.config")),
];

/// The Debian package whose tarball is the default source.
pub const KERNEL_SOURCE_PACKAGE: &str = "linux-source-6.12";

/// Names a kernel image to use instead of building one (a `vmlinux` ELF or a `bzImage`).
pub const KERNEL_ENV: &str = "BRANCHBOX_KERNEL";

/// Where the source comes from, and the identity that goes into the recipe hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSource {
    /// A `linux-*.tar.xz` (or any tarball `tar` can read) with one top-level directory.
    pub tarball: PathBuf,
    /// The package version, or the tarball's SHA-256 for a tarball given by the user.
    pub identity: String,
}

impl KernelSource {
    /// Debian's `linux-source-6.12` package, as installed.
    pub fn debian() -> Result<KernelSource> {
        let install = "install it with ./scripts/setup.sh (or: apt-get install linux-source-6.12 bc flex bison libelf-dev)";
        let out = Command::new("dpkg-query")
            .args(["-W", "-f=${Version}", KERNEL_SOURCE_PACKAGE])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| Error::Unavailable(format!("cannot run dpkg-query ({e}): is this Debian?")))?;
        let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() || version.is_empty() {
            return Err(Error::Unavailable(format!("{KERNEL_SOURCE_PACKAGE} is not installed; {install}")));
        }
        let tarball = PathBuf::from(format!("/usr/src/{KERNEL_SOURCE_PACKAGE}.tar.xz"));
        if !tarball.is_file() {
            return Err(Error::Unavailable(format!("{} is missing; {install}", tarball.display())));
        }
        Ok(KernelSource { tarball, identity: format!("{KERNEL_SOURCE_PACKAGE} {version}") })
    }

    /// A tarball the user names; identified by its contents.
    pub fn tarball(path: &Path) -> Result<KernelSource> {
        let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let mut h = Sha256::new();
        std::io::copy(&mut f, &mut h).map_err(|e| Error::io(path, e))?;
        Ok(KernelSource {
            tarball: path.to_path_buf(),
            identity: format!("sha256 {}", hex::encode(h.finalize())),
        })
    }
}

/// Everything that decides the kernel's outputs.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct KernelRecipe {
    /// [`KERNEL_BUILDER_VERSION`].
    pub builder: u32,
    /// [`KernelSource::identity`].
    pub source: String,
    /// Fragment names and contents, in merge order.
    pub fragments: Vec<(String, String)>,
}

impl KernelRecipe {
    /// The project's recipe over `source`.
    pub fn new(source: &KernelSource) -> KernelRecipe {
        KernelRecipe {
            builder: KERNEL_BUILDER_VERSION,
            source: source.identity.clone(),
            fragments: KERNEL_FRAGMENTS.iter().map(|(n, t)| (n.to_string(), t.to_string())).collect(),
        }
    }

    /// The cache key: 16 hex digits of the SHA-256 of the recipe's JSON.
    pub fn hash(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        hex::encode(Sha256::digest(&json))[..16].to_string()
    }
}

/// A kernel ready to boot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Kernel {
    /// The recipe hash, or `external` for a kernel named by the user.
    pub hash: String,
    /// The cache directory (None for a kernel named by the user).
    pub dir: Option<PathBuf>,
    /// The uncompressed ELF image (what branchbox's VMM loads).
    pub vmlinux: Option<PathBuf>,
    /// The compressed bootable image (what QEMU's `-kernel` takes).
    pub bzimage: Option<PathBuf>,
    /// False when it came from the cache or from the user.
    pub built: bool,
}

/// What a kernel image file is, from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelFormat {
    /// An ELF file (`vmlinux`).
    Elf,
    /// An x86 bzImage (boot protocol header `HdrS` at 0x202).
    BzImage,
}

/// Classifies a kernel image by its header bytes; `None` for anything else.
pub fn kernel_format(head: &[u8]) -> Option<KernelFormat> {
    if head.starts_with(b"\x7fELF") {
        return Some(KernelFormat::Elf);
    }
    (head.get(0x202..0x206) == Some(b"HdrS")).then_some(KernelFormat::BzImage)
}

/// A kernel named by the user (`BRANCHBOX_KERNEL` or an option): used as is, never built.
pub fn external_kernel(path: &Path) -> Result<Kernel> {
    let mut head = vec![0u8; 0x206];
    let n = {
        use std::io::Read;
        let mut f = std::fs::File::open(path).map_err(|e| {
            Error::InvalidInput(format!(
                "kernel {} cannot be opened ({e}); name a vmlinux or bzImage",
                path.display()
            ))
        })?;
        f.read(&mut head).map_err(|e| Error::io(path, e))?
    };
    let path = path.to_path_buf();
    match kernel_format(&head[..n]) {
        Some(KernelFormat::Elf) => Ok(Kernel {
            hash: "external".into(),
            dir: None,
            vmlinux: Some(path),
            bzimage: None,
            built: false,
        }),
        Some(KernelFormat::BzImage) => Ok(Kernel {
            hash: "external".into(),
            dir: None,
            vmlinux: None,
            bzimage: Some(path),
            built: false,
        }),
        None => Err(Error::InvalidInput(format!(
            "kernel {} is neither an ELF vmlinux nor an x86 bzImage; unset {KERNEL_ENV} to use the built one",
            path.display()
        ))),
    }
}

fn cached(dir: &Path, hash: &str) -> Option<Kernel> {
    let (vmlinux, bzimage) = (dir.join("vmlinux"), dir.join("bzImage"));
    (vmlinux.is_file() && bzimage.is_file()).then(|| Kernel {
        hash: hash.to_string(),
        dir: Some(dir.to_path_buf()),
        vmlinux: Some(vmlinux),
        bzimage: Some(bzimage),
        built: false,
    })
}

/// The kernel for `source` with the project's fragments if the cache under `images` has it;
/// builds nothing.
pub fn cached_kernel(images: &Path, source: &KernelSource) -> Option<Kernel> {
    let hash = KernelRecipe::new(source).hash();
    cached(&images.join("kernel").join(&hash), &hash)
}

/// Returns the kernel for `source` with the project's fragments, building it when the cache
/// under `images` lacks it. `progress` gets a line per phase and, while compiling, every few
/// seconds.
pub fn ensure_kernel(images: &Path, source: &KernelSource, progress: &mut dyn FnMut(&str)) -> Result<Kernel> {
    let recipe = KernelRecipe::new(source);
    let hash = recipe.hash();
    let root = images.join("kernel");
    let dir = root.join(&hash);
    if let Some(k) = cached(&dir, &hash) {
        return Ok(k);
    }
    std::fs::create_dir_all(&root).map_err(|e| Error::io(&root, e))?;
    let _lock = match DirLock::try_take(&root)? {
        Some(l) => l,
        None => {
            progress("waiting for another build of the guest kernel to finish");
            DirLock::take(&root)?
        }
    };
    if let Some(k) = cached(&dir, &hash) {
        return Ok(k);
    }
    clean_stale(&root);
    let tmp = tmp_dir(&root, &hash);
    let result = build(&tmp, &recipe, source, progress)
        .and_then(|out| std::fs::rename(&out, &dir).map_err(|e| Error::io(&dir, e)));
    if let Err(e) = result {
        // Keep the log of a failed build where the error message points.
        let log = root.join(format!("failed-{hash}.log"));
        let _ = std::fs::rename(tmp.join("out").join("build.log"), &log);
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(match e {
            Error::Backend(m) => {
                Error::Backend(format!("{m}; full log: {}{}", log.display(), log_tail(&log)))
            }
            other => other,
        });
    }
    let _ = std::fs::remove_dir_all(&tmp);
    let mut k = cached(&dir, &hash).ok_or_else(|| {
        Error::Backend(format!("{}: the kernel build left no vmlinux/bzImage", dir.display()))
    })?;
    k.built = true;
    Ok(k)
}

/// The last lines of a failed build's log, for the error message (make's error is at the end).
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
    if tail.is_empty() {
        String::new()
    } else {
        format!("; it ends with:\n{}", tail.join("\n"))
    }
}

/// Lines of a failed build's log shown in the error.
const LOG_TAIL_LINES: usize = 15;

/// The build log: every command's output, appended.
struct Log {
    file: std::fs::File,
    path: PathBuf,
}

impl Log {
    fn run(&mut self, src: &Path, args: &[&str], what: &str) -> Result<()> {
        writeln!(self.file, "$ {}", args.join(" ")).map_err(|e| Error::io(&self.path, e))?;
        let out = self.file.try_clone().map_err(|e| Error::io(&self.path, e))?;
        let err = self.file.try_clone().map_err(|e| Error::io(&self.path, e))?;
        run_checked(Command::new(args[0]).args(&args[1..]).current_dir(src).stdout(out).stderr(err), what)
            .map_err(|e| Error::Backend(format!("{e} (see the last lines of {})", self.path.display())))
    }
}

fn build(
    tmp: &Path,
    recipe: &KernelRecipe,
    source: &KernelSource,
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf> {
    let (src, out) = (tmp.join("src"), tmp.join("out"));
    for d in [&src, &out] {
        std::fs::create_dir_all(d).map_err(|e| Error::io(d, e))?;
    }
    let log_path = out.join("build.log");
    let file = std::fs::File::create(&log_path).map_err(|e| Error::io(&log_path, e))?;
    let mut log = Log { file, path: log_path };
    let started = Instant::now();
    progress(&format!("guest kernel: extracting {}", source.tarball.display()));
    let tarball = source.tarball.to_string_lossy().into_owned();
    log.run(&src, &["tar", "-xf", &tarball, "--strip-components=1"], "tar (extracting the kernel source)")?;

    progress("guest kernel: configuring (tinyconfig + fragments)");
    let mut fragment_paths = Vec::new();
    let mut wanted = std::collections::BTreeMap::new();
    for (name, text) in &recipe.fragments {
        wanted.extend(kconfig::parse(name, text).map_err(|e| Error::InvalidInput(e.to_string()))?);
        let p = out.join(name);
        std::fs::write(&p, text).map_err(|e| Error::io(&p, e))?;
        fragment_paths.push(p.to_string_lossy().into_owned());
    }
    log.run(&src, &["make", "ARCH=x86_64", "tinyconfig"], "make tinyconfig")?;
    let mut merge = vec!["scripts/kconfig/merge_config.sh", "-m", ".config"];
    merge.extend(fragment_paths.iter().map(String::as_str));
    log.run(&src, &merge, "merge_config.sh")?;
    log.run(&src, &["make", "ARCH=x86_64", "olddefconfig"], "make olddefconfig")?;
    let config_path = src.join(".config");
    let config_text = std::fs::read_to_string(&config_path).map_err(|e| Error::io(&config_path, e))?;
    let config = kconfig::parse(".config", &config_text).map_err(|e| Error::Backend(e.to_string()))?;
    let missing = kconfig::not_stuck(&wanted, &config);
    if !missing.is_empty() {
        return Err(Error::Backend(format!(
            "the kernel config dropped {} option(s) the fragments ask for (a dependency is missing; \
             add it to images/kernel/*.config): {}",
            missing.len(),
            missing.join(", ")
        )));
    }

    let jobs = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    progress(&format!(
        "guest kernel: compiling with {jobs} job(s) (about 20 CPU-minutes: 10 minutes on 2 idle cores)"
    ));
    make_images(&src, &mut log, jobs, started, progress)?;
    for (from, to) in [
        (src.join("vmlinux"), out.join("vmlinux")),
        (src.join("arch/x86/boot/bzImage"), out.join("bzImage")),
        (config_path, out.join("config")),
    ] {
        std::fs::rename(&from, &to).map_err(|e| Error::io(&from, e))?;
    }
    for (name, _) in &recipe.fragments {
        let _ = std::fs::remove_file(out.join(name));
    }
    let meta = serde_json::json!({"recipe": recipe, "seconds": started.elapsed().as_secs()});
    let meta_path = out.join("recipe.json");
    std::fs::write(&meta_path, serde_json::to_vec_pretty(&meta).unwrap_or_default())
        .map_err(|e| Error::io(&meta_path, e))?;
    Ok(out)
}

/// `make bzImage`, its output into the log, a progress line every few seconds: elapsed time,
/// objects compiled so far and the current step.
fn make_images(
    src: &Path,
    log: &mut Log,
    jobs: usize,
    started: Instant,
    progress: &mut dyn FnMut(&str),
) -> Result<()> {
    let (reader, writer) = std::io::pipe().map_err(|e| Error::io("pipe", e))?;
    let writer2 = writer.try_clone().map_err(|e| Error::io("pipe", e))?;
    let mut cmd = Command::new("make");
    cmd.args(["ARCH=x86_64", &format!("-j{jobs}"), "bzImage"])
        .env("KBUILD_BUILD_USER", "branchbox")
        .env("KBUILD_BUILD_HOST", "branchbox")
        .current_dir(src)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(writer2);
    let mut child = cmd.spawn().map_err(|e| {
        Error::Unavailable(format!("make cannot be started ({e}); install it with ./scripts/setup.sh"))
    })?;
    drop(cmd);
    let (mut compiled, mut last) = (0usize, Instant::now());
    for line in BufReader::new(reader).lines().map_while(|l| l.ok()) {
        let _ = writeln!(log.file, "{line}");
        let step = line.trim_start();
        if step.starts_with("CC ") || step.starts_with("AS ") {
            compiled += 1;
        }
        if last.elapsed() > Duration::from_secs(5) {
            last = Instant::now();
            let t = started.elapsed().as_secs();
            progress(&format!(
                "guest kernel: {}m{:02}s, {compiled} objects compiled; {}",
                t / 60,
                t % 60,
                step.split_whitespace().collect::<Vec<_>>().join(" ")
            ));
        }
    }
    let status = child.wait().map_err(|e| Error::io("make", e))?;
    if !status.success() {
        return Err(Error::Backend(format!(
            "make bzImage failed ({status}); the build log ends with the error"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_project_fragments_parse_and_ask_for_the_seams() {
        let mut all = std::collections::BTreeMap::new();
        for (name, text) in KERNEL_FRAGMENTS {
            all.extend(kconfig::parse(name, text).unwrap());
        }
        for opt in [
            "CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES",
            "CONFIG_VIRTIO_BLK",
            "CONFIG_VIRTIO_VSOCKETS",
            "CONFIG_VIRTIO_NET",
            "CONFIG_IP_PNP",
            "CONFIG_HW_RANDOM_VIRTIO",
            "CONFIG_VMGENID",
            "CONFIG_SERIAL_8250_CONSOLE",
            "CONFIG_EXT4_FS",
            "CONFIG_KVM_GUEST",
            "CONFIG_SMP",
            "CONFIG_VIRTIO_PCI",
        ] {
            assert_eq!(all.get(opt), Some(&kconfig::Want::Value("y".into())), "{opt}");
        }
        assert_eq!(all.get("CONFIG_MODULES"), Some(&kconfig::Want::Unset));
    }

    #[test]
    fn the_recipe_hash_covers_source_fragments_and_builder() {
        let src = KernelSource { tarball: "/x".into(), identity: "linux-source-6.12 1".into() };
        let base = KernelRecipe::new(&src);
        assert_eq!(base.hash(), KernelRecipe::new(&src).hash());
        assert_eq!(base.hash().len(), 16);
        let mut other = base.clone();
        other.source = "linux-source-6.12 2".into();
        assert_ne!(base.hash(), other.hash());
        let mut other = base.clone();
        other.fragments[0].1.push_str("CONFIG_IPV6=y\n");
        assert_ne!(base.hash(), other.hash());
        let mut other = base.clone();
        other.builder += 1;
        assert_ne!(base.hash(), other.hash());
        // The tarball's path is not part of the identity: a moved tarball is the same source.
        let moved = KernelSource { tarball: "/y".into(), ..src };
        assert_eq!(base.hash(), KernelRecipe::new(&moved).hash());
    }

    #[test]
    fn kernel_images_are_told_apart_by_their_headers() {
        assert_eq!(kernel_format(b"\x7fELF\x02\x01"), Some(KernelFormat::Elf));
        let mut bz = vec![0u8; 0x300];
        bz[0x202..0x206].copy_from_slice(b"HdrS");
        assert_eq!(kernel_format(&bz), Some(KernelFormat::BzImage));
        assert_eq!(kernel_format(&bz[..0x204]), None);
        assert_eq!(kernel_format(b"#!/bin/sh\n"), None);
    }

    #[test]
    fn an_external_kernel_is_used_as_is_and_junk_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let elf = d.path().join("vmlinux");
        std::fs::write(&elf, b"\x7fELF\x02\x01\x01").unwrap();
        let k = external_kernel(&elf).unwrap();
        assert_eq!((k.vmlinux.as_deref(), k.bzimage, k.built), (Some(elf.as_path()), None, false));
        let junk = d.path().join("junk");
        std::fs::write(&junk, b"hello").unwrap();
        let e = external_kernel(&junk).unwrap_err().to_string();
        assert!(e.contains("neither an ELF vmlinux nor an x86 bzImage"), "{e}");
        assert!(external_kernel(&d.path().join("absent")).is_err());
    }

    #[test]
    fn a_cache_hit_builds_nothing() {
        let d = tempfile::tempdir().unwrap();
        let src = KernelSource { tarball: d.path().join("absent.tar.xz"), identity: "test 1".into() };
        let dir = d.path().join("kernel").join(KernelRecipe::new(&src).hash());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("vmlinux"), b"\x7fELF").unwrap();
        std::fs::write(dir.join("bzImage"), b"bz").unwrap();
        let k = ensure_kernel(d.path(), &src, &mut |m| panic!("a cache hit reported {m:?}")).unwrap();
        assert!(!k.built);
        assert_eq!(k.vmlinux, Some(dir.join("vmlinux")));
        assert_eq!(cached_kernel(d.path(), &src), Some(k));
        let other = KernelSource { identity: "test 3".into(), ..src };
        assert_eq!(cached_kernel(d.path(), &other), None);
    }

    #[test]
    fn a_failed_build_leaves_no_cache_entry_and_keeps_its_log() {
        let d = tempfile::tempdir().unwrap();
        let src = KernelSource { tarball: d.path().join("absent.tar.xz"), identity: "test 2".into() };
        let e = ensure_kernel(d.path(), &src, &mut |_| {}).unwrap_err().to_string();
        let hash = KernelRecipe::new(&src).hash();
        assert!(e.contains("tar"), "{e}");
        // tar's own complaint, from the log, is in the error.
        assert!(e.contains("absent.tar.xz: Cannot open"), "{e}");
        assert!(!d.path().join("kernel").join(&hash).exists());
        assert!(d.path().join("kernel").join(format!("failed-{hash}.log")).is_file());
        let left: Vec<_> = std::fs::read_dir(d.path().join("kernel"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("tmp-"))
            .collect();
        assert!(left.is_empty(), "temporary directories left: {left:?}");
    }
}
