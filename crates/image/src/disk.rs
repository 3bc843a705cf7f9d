//! The guest's root disk: an image's tree as an ext4 file, with the agent as `/sbin/init`,
//! cached by recipe hash under `<images>/disk/<hash>/rootfs.ext4`.
//!
//! `mkfs.ext4 -d` copies a directory into the new file system, so no loop mount and no mount
//! privilege is needed. The tree it copies is a hard-linked copy of the image (the image
//! itself is shared and never changed) with `/sbin/init` and `/init` added. The cached file is
//! a read-only base: every guest copies it (`cp --sparse=always`, or a reflink) or layers a
//! writable file over it, and never writes it.

use crate::build::{clean_stale, run_checked, tmp_dir, Image};
use crate::lock::DirLock;
use branchbox_model::{Error, Result};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Bumped when the build steps change in a way that changes the disk.
pub const DISK_BUILDER_VERSION: u32 = 1;

/// Where the agent lives in the image (the init links point at it).
pub const AGENT_IN_GUEST: &str = "/usr/local/bin/branchbox-agent";

/// The file system options, part of the recipe. A journal, so that a guest killed mid-write
/// leaves a disk that mounts (replayed at the next mount).
const MKFS_OPTIONS: &[&str] = &["-t", "ext4", "-L", "branchbox-root", "-O", "has_journal", "-m", "0"];

/// Free space on top of the tree's own size: at least this much.
const MIN_HEADROOM: u64 = 512 << 20;
/// Disk sizes are rounded up to this.
const SIZE_STEP: u64 = 64 << 20;

/// Everything that decides the disk's contents.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct DiskRecipe {
    /// [`DISK_BUILDER_VERSION`].
    pub builder: u32,
    /// The image id (covers the image recipe and everything installed into it).
    pub image: String,
    /// SHA-256 of the agent binary that becomes `/sbin/init`.
    pub agent_sha256: String,
    /// `mkfs.ext4` options.
    pub mkfs: Vec<String>,
    /// Minimum free space, bytes.
    pub headroom: u64,
}

impl DiskRecipe {
    /// The recipe for `image` with the agent binary `agent`.
    pub fn new(image: &Image, agent: &Path) -> Result<DiskRecipe> {
        let bytes = std::fs::read(agent).map_err(|e| Error::io(agent, e))?;
        Ok(DiskRecipe {
            builder: DISK_BUILDER_VERSION,
            image: image.id.clone(),
            agent_sha256: hex::encode(Sha256::digest(&bytes)),
            mkfs: MKFS_OPTIONS.iter().map(|s| s.to_string()).collect(),
            headroom: MIN_HEADROOM,
        })
    }

    /// The cache key: 16 hex digits of the SHA-256 of the recipe's JSON.
    pub fn hash(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        hex::encode(Sha256::digest(&json))[..16].to_string()
    }
}

/// A root disk ready to copy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Disk {
    /// The recipe hash.
    pub hash: String,
    /// The cached `rootfs.ext4` (read-only by convention: copy it, never write it).
    pub path: PathBuf,
    /// Its size in bytes (the file is sparse; it holds less).
    pub bytes: u64,
    /// False when it came from the cache.
    pub built: bool,
}

/// The disk size for a tree of `used` bytes: the tree, then half of it again or
/// [`MIN_HEADROOM`], whichever is more, rounded up to [`SIZE_STEP`]; `None` past `u64`.
pub fn disk_size(used: u64) -> Option<u64> {
    let want = used.checked_add((used / 2).max(MIN_HEADROOM))?;
    want.div_ceil(SIZE_STEP).checked_mul(SIZE_STEP)
}

/// Bytes the regular files and symlinks under `dir` hold (each hard-linked file once), plus a
/// block per directory and per inode's metadata.
fn tree_bytes(dir: &Path) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).map_err(|e| Error::io(&d, e))? {
            let e = e.map_err(|e| Error::io(&d, e))?;
            let m = std::fs::symlink_metadata(e.path()).map_err(|err| Error::io(e.path(), err))?;
            if m.is_dir() {
                stack.push(e.path());
            }
            if seen.insert((m.dev(), m.ino())) {
                // Rounded to 4 KiB blocks, plus 256 bytes of inode.
                total = total.saturating_add(m.len().div_ceil(4096) * 4096 + 256);
            }
        }
    }
    Ok(total)
}

fn cached(path: &Path, hash: &str) -> Option<Disk> {
    let m = std::fs::metadata(path).ok().filter(|m| m.is_file())?;
    Some(Disk { hash: hash.to_string(), path: path.to_path_buf(), bytes: m.len(), built: false })
}

/// The root disk for `image` with `agent` as init if the cache under `images` has it; builds
/// nothing (the image itself need not be built: the disk's hash only names it).
pub fn cached_disk(images: &Path, image: &Image, agent: &Path) -> Result<Option<Disk>> {
    let hash = DiskRecipe::new(image, agent)?.hash();
    Ok(cached(&images.join("disk").join(&hash).join("rootfs.ext4"), &hash))
}

/// Largest `recipe.json` read back from the cache: one is under 1 KiB.
const MAX_RECIPE_BYTES: u64 = 64 * 1024;

/// The image a cached disk was made from, as its `recipe.json` says; `None` when the entry has
/// no readable recipe (it is then left alone: it is not one this builder made).
fn recipe_image(dir: &Path) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(dir.join("recipe.json"))
        .ok()?
        .take(MAX_RECIPE_BYTES)
        .read_to_string(&mut text)
        .ok()?;
    #[derive(serde::Deserialize)]
    struct Named {
        image: String,
    }
    serde_json::from_str::<Named>(&text).ok().map(|r| r.image)
}

/// Removes (or only lists, with `dry_run`) the cached disks under `images` whose image
/// `keep` refuses, returning each entry's hash and bytes. A new agent makes a new image id and
/// so a new disk of about 200 MiB; this is how the old ones go. Holds the cache's build lock,
/// so no build is renamed into place meanwhile.
pub fn collect_disks(
    images: &Path,
    keep: &dyn Fn(&str) -> bool,
    dry_run: bool,
) -> Result<Vec<(String, u64)>> {
    let root = images.join("disk");
    if !root.is_dir() {
        return Ok(Vec::new());
    }
    let _lock = DirLock::take(&root)?;
    let entries = std::fs::read_dir(&root).map_err(|e| Error::io(&root, e))?;
    let mut gone = Vec::new();
    for e in entries.flatten() {
        let dir = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        let is_hash = name.len() == 16 && name.bytes().all(|b| b.is_ascii_hexdigit());
        let Some(image) = recipe_image(&dir).filter(|_| is_hash && dir.is_dir()) else { continue };
        if keep(&image) {
            continue;
        }
        let bytes = std::fs::read_dir(&dir)
            .map(|rd| rd.flatten().filter_map(|f| f.metadata().ok()).map(|m| m.len()).sum())
            .unwrap_or(0);
        if !dry_run {
            std::fs::remove_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        }
        gone.push((name, bytes));
    }
    gone.sort();
    Ok(gone)
}

/// Returns the root disk for `image` with `agent` as init, building it when the cache under
/// `images` lacks it.
pub fn ensure_disk(
    images: &Path,
    image: &Image,
    agent: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<Disk> {
    let recipe = DiskRecipe::new(image, agent)?;
    let hash = recipe.hash();
    let root = images.join("disk");
    let dir = root.join(&hash);
    let file = dir.join("rootfs.ext4");
    if let Some(d) = cached(&file, &hash) {
        return Ok(d);
    }
    std::fs::create_dir_all(&root).map_err(|e| Error::io(&root, e))?;
    let _lock = DirLock::take(&root)?;
    if let Some(d) = cached(&file, &hash) {
        return Ok(d);
    }
    clean_stale(&root);
    let tmp = tmp_dir(&root, &hash);
    let result = build(&tmp, image, &recipe, progress)
        .and_then(|out| std::fs::rename(&out, &dir).map_err(|e| Error::io(&dir, e)));
    let _ = std::fs::remove_dir_all(&tmp);
    result?;
    let mut d = cached(&file, &hash)
        .ok_or_else(|| Error::Backend(format!("{}: the disk build left no file", file.display())))?;
    d.built = true;
    progress(&format!("root disk {} ready", file.display()));
    Ok(d)
}

fn build(tmp: &Path, image: &Image, recipe: &DiskRecipe, progress: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    let (tree, out) = (tmp.join("tree"), tmp.join("out"));
    std::fs::create_dir_all(&out).map_err(|e| Error::io(&out, e))?;
    progress("root disk: staging the image tree");
    // Hard links: the staging copy costs no data, and new entries in it leave the image alone.
    run_checked(Command::new("cp").arg("-a").arg("--link").arg(&image.rootfs).arg(&tree), "cp")?;
    install_init(&tree)?;
    check_agent_libraries(&tree)?;
    let used = tree_bytes(&tree)?;
    let size = disk_size(used)
        .ok_or_else(|| Error::Backend(format!("the image tree claims {used} bytes: too large for a disk")))?;
    let file = out.join("rootfs.ext4");
    progress(&format!("root disk: mkfs.ext4 -d ({} MiB of files, {} MiB disk)", used >> 20, size >> 20));
    let f = std::fs::File::create(&file).map_err(|e| Error::io(&file, e))?;
    f.set_len(size).map_err(|e| Error::io(&file, e))?;
    drop(f);
    run_checked(
        Command::new("mkfs.ext4").arg("-q").arg("-F").args(&recipe.mkfs).arg("-d").arg(&tree).arg(&file),
        "mkfs.ext4 (install e2fsprogs 1.43 or later: ./scripts/setup.sh)",
    )?;
    // A disk that fsck rejects would fail only at boot, far from the cause.
    run_checked(Command::new("e2fsck").arg("-fn").arg(&file), "e2fsck (checking the new disk)")?;
    let meta_path = out.join("recipe.json");
    std::fs::write(&meta_path, serde_json::to_vec_pretty(recipe).unwrap_or_default())
        .map_err(|e| Error::io(&meta_path, e))?;
    Ok(out)
}

/// Makes `/sbin/init` and `/init` symlinks to the agent in the staged tree.
fn install_init(tree: &Path) -> Result<()> {
    let agent = tree.join(AGENT_IN_GUEST.trim_start_matches('/'));
    if !agent.is_file() {
        return Err(Error::Backend(format!(
            "the image has no agent at {AGENT_IN_GUEST}; rebuild it with `branchbox image build`"
        )));
    }
    // `sbin` is a relative symlink to `usr/sbin` in merged-/usr Debian: resolving it here
    // stays inside the tree.
    for link in ["sbin/init", "init"] {
        let p = tree.join(link);
        // Unlink first: an existing entry is a hard link shared with the image.
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&p, e)),
        }
        std::os::unix::fs::symlink(AGENT_IN_GUEST, &p).map_err(|e| Error::io(&p, e))?;
    }
    Ok(())
}

/// Whether the ELF file `bytes` names a program interpreter (`PT_INTERP`): a dynamically
/// linked executable. `None` when it is not a 64-bit little-endian ELF file.
pub fn elf_is_dynamic(bytes: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    if bytes.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let u16_at = |o: usize| bytes.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at =
        |o: usize| bytes.get(o..o.checked_add(4)?).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let phoff = usize::try_from(u64::from_le_bytes(bytes.get(0x20..0x28)?.try_into().ok()?)).ok()?;
    let (entsize, count) = (usize::from(u16_at(0x36)?), usize::from(u16_at(0x38)?));
    for i in 0..count {
        let at = phoff.checked_add(i.checked_mul(entsize)?)?;
        if u32_at(at)? == PT_INTERP {
            return Some(true);
        }
    }
    Some(false)
}

/// A dynamically linked agent needs the image's glibc: check, inside the tree, that the loader
/// finds every library it needs (a missing one would only show as a kernel panic at boot:
/// "init failed"). A static agent needs nothing.
fn check_agent_libraries(tree: &Path) -> Result<()> {
    let agent = tree.join(AGENT_IN_GUEST.trim_start_matches('/'));
    let bytes = std::fs::read(&agent).map_err(|e| Error::io(&agent, e))?;
    match elf_is_dynamic(&bytes) {
        Some(false) => return Ok(()),
        Some(true) => {}
        None => {
            return Err(Error::Backend(format!(
                "the agent {AGENT_IN_GUEST} in the image is not an x86-64 ELF executable; rebuild it"
            )))
        }
    }
    let out = Command::new("chroot")
        .arg(tree)
        .args(["/usr/bin/ldd", AGENT_IN_GUEST])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::Unavailable(format!("cannot run chroot ({e}); building the disk needs root")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let missing: Vec<&str> = text.lines().filter(|l| l.contains("not found")).map(str::trim).collect();
    if !missing.is_empty() || !out.status.success() {
        return Err(Error::Backend(format!(
            "the agent cannot start in the image: {}{}; build the agent on a system with the \
             image's glibc (Debian 12) or link it statically",
            missing.join(", "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(dir: &Path) -> Image {
        Image { id: "img-0123456789abcdef".into(), rootfs: dir.to_path_buf(), built: false }
    }

    #[test]
    fn gc_takes_the_disks_of_unused_images_and_nothing_else() {
        let images = tempfile::tempdir().unwrap();
        let root = images.path().join("disk");
        let entry = |hash: &str, recipe: Option<&str>| {
            let d = root.join(hash);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("rootfs.ext4"), vec![0u8; 4096]).unwrap();
            if let Some(r) = recipe {
                std::fs::write(d.join("recipe.json"), r).unwrap();
            }
        };
        entry("00000000000000aa", Some(r#"{"builder":1,"image":"img-kept","agent_sha256":"x"}"#));
        entry("00000000000000bb", Some(r#"{"builder":1,"image":"img-old","agent_sha256":"x"}"#));
        entry("00000000000000cc", None);
        entry("00000000000000dd", Some("not json"));
        entry("not-a-hash", Some(r#"{"image":"img-old"}"#));
        let keep = |image: &str| image == "img-kept";
        let listed = collect_disks(images.path(), &keep, true).unwrap();
        assert_eq!(listed.iter().map(|(h, _)| h.as_str()).collect::<Vec<_>>(), ["00000000000000bb"]);
        assert!(listed[0].1 >= 4096, "the disk's bytes are counted: {listed:?}");
        assert!(root.join("00000000000000bb").exists(), "a dry run removed a disk");
        assert_eq!(collect_disks(images.path(), &keep, false).unwrap(), listed);
        assert!(!root.join("00000000000000bb").exists());
        for left in ["00000000000000aa", "00000000000000cc", "00000000000000dd", "not-a-hash"] {
            assert!(root.join(left).exists(), "{left} was collected");
        }
        assert!(collect_disks(&images.path().join("none"), &keep, false).unwrap().is_empty());
    }

    #[test]
    fn disks_have_headroom_and_whole_steps() {
        assert_eq!(disk_size(0), Some(MIN_HEADROOM));
        assert_eq!(disk_size(1), Some(MIN_HEADROOM + SIZE_STEP));
        let used = 3u64 << 30;
        let s = disk_size(used).unwrap();
        assert!(
            s >= used + used / 2 && s.is_multiple_of(SIZE_STEP) && s < used + used / 2 + SIZE_STEP,
            "{s}"
        );
        assert_eq!(disk_size(u64::MAX), None);
        assert_eq!(disk_size(u64::MAX - (1 << 20)), None);
    }

    #[test]
    fn the_recipe_hash_covers_image_agent_and_options() {
        let d = tempfile::tempdir().unwrap();
        let agent = d.path().join("agent");
        std::fs::write(&agent, b"one").unwrap();
        let base = DiskRecipe::new(&image(d.path()), &agent).unwrap();
        assert_eq!(base.hash(), DiskRecipe::new(&image(d.path()), &agent).unwrap().hash());
        std::fs::write(&agent, b"two").unwrap();
        assert_ne!(base.hash(), DiskRecipe::new(&image(d.path()), &agent).unwrap().hash());
        let mut other = base.clone();
        other.image = "img-fedcba9876543210".into();
        assert_ne!(base.hash(), other.hash());
        let mut other = base.clone();
        other.mkfs.push("-N".into());
        assert_ne!(base.hash(), other.hash());
    }

    #[test]
    fn init_links_replace_entries_without_touching_the_linked_image() {
        let d = tempfile::tempdir().unwrap();
        let image_tree = d.path().join("image");
        std::fs::create_dir_all(image_tree.join("usr/sbin")).unwrap();
        std::fs::create_dir_all(image_tree.join("usr/local/bin")).unwrap();
        std::os::unix::fs::symlink("usr/sbin", image_tree.join("sbin")).unwrap();
        std::fs::write(image_tree.join("usr/local/bin/branchbox-agent"), b"agent").unwrap();
        std::fs::write(image_tree.join("usr/sbin/init"), b"systemd").unwrap();
        let staged = d.path().join("tree");
        run_checked(Command::new("cp").arg("-a").arg("--link").arg(&image_tree).arg(&staged), "cp").unwrap();
        install_init(&staged).unwrap();
        for link in ["sbin/init", "usr/sbin/init", "init"] {
            assert_eq!(std::fs::read_link(staged.join(link)).unwrap(), Path::new(AGENT_IN_GUEST), "{link}");
        }
        assert_eq!(std::fs::read(image_tree.join("usr/sbin/init")).unwrap(), b"systemd");
        assert!(!image_tree.join("init").exists());
    }

    #[test]
    fn a_tree_without_the_agent_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let e = install_init(d.path()).unwrap_err().to_string();
        assert!(e.contains("no agent") && e.contains("branchbox image build"), "{e}");
    }

    #[test]
    fn dynamic_and_static_executables_are_told_apart() {
        let host_sh = std::fs::read("/bin/sh").unwrap();
        assert_eq!(elf_is_dynamic(&host_sh), Some(true));
        // A 64-bit ELF header whose one program header is PT_LOAD.
        let mut elf = vec![0u8; 0x40 + 0x38];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x20..0x28].copy_from_slice(&0x40u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&0x38u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        elf[0x40..0x44].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(elf_is_dynamic(&elf), Some(false));
        elf[0x40..0x44].copy_from_slice(&3u32.to_le_bytes());
        assert_eq!(elf_is_dynamic(&elf), Some(true));
        // Headers pointing past the end, or absurd counts, are not read out of bounds.
        elf[0x20..0x28].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(elf_is_dynamic(&elf), None);
        assert_eq!(elf_is_dynamic(b"#!/bin/sh"), None);
    }

    #[test]
    fn hard_linked_files_count_once() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a"), vec![0u8; 10_000]).unwrap();
        std::fs::hard_link(d.path().join("a"), d.path().join("b")).unwrap();
        assert_eq!(tree_bytes(d.path()).unwrap(), 12288 + 256);
    }
}
