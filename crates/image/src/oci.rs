//! Reading an OCI image layout (a directory or a tarball of one) or a `docker save` tarball:
//! typed manifests, sha256-verified blobs, layers in order.

use crate::tar_members::{shown, Members};
use crate::unpack::{apply_layer, Budget, Counted};
use branchbox_model::{Error, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Most bytes of one JSON document (index, manifest, config).
const MAX_JSON: u64 = 4 << 20;
/// Most entries in the outer tarball of an image.
const MAX_OUTER_ENTRIES: usize = 100_000;
/// Most nested indexes followed to reach a manifest.
const MAX_INDEX_DEPTH: usize = 4;

fn bad(msg: String) -> Error {
    Error::InvalidInput(msg)
}

/// A verified sha256 digest (`sha256:` and 64 lowercase hex digits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sha256Digest(String);

impl Sha256Digest {
    pub(crate) fn parse(s: &str) -> Result<Sha256Digest> {
        let hex = s.strip_prefix("sha256:").ok_or_else(|| {
            bad(format!("the digest {s:?} is not sha256 (the only algorithm supported); re-export the image"))
        })?;
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(bad(format!("the digest {s:?} is not 64 lowercase hex digits")));
        }
        Ok(Sha256Digest(hex.to_string()))
    }

    pub(crate) fn hex(&self) -> &str {
        &self.0
    }
}

/// An OCI content descriptor.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    #[serde(default)]
    media_type: String,
    digest: String,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Debug, Deserialize)]
struct Platform {
    architecture: String,
    os: String,
}

/// `index.json` or a nested image index.
#[derive(Debug, Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

/// An image manifest.
#[derive(Debug, Deserialize)]
struct Manifest {
    config: Descriptor,
    layers: Vec<Descriptor>,
}

/// One image of `docker save`'s `manifest.json`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerManifest {
    config: String,
    layers: Vec<String>,
}

/// The image configuration: what runs where, and the layers' uncompressed digests.
#[derive(Debug, Deserialize)]
struct ConfigFile {
    #[serde(default)]
    config: Option<RunConfig>,
    rootfs: RootFs,
}

#[derive(Debug, Deserialize)]
struct RootFs {
    diff_ids: Vec<String>,
}

/// What of an image's configuration branchbox keeps. Read from the image's config (`Env`,
/// `WorkingDir`) and from branchbox's own record (`env`, `working_dir`).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct RunConfig {
    /// `KEY=VALUE` pairs.
    #[serde(rename(deserialize = "Env"), alias = "env", default)]
    pub env: Option<Vec<String>>,
    /// The working directory.
    #[serde(rename(deserialize = "WorkingDir"), alias = "working_dir", default)]
    pub working_dir: Option<String>,
}

/// Where an image's files are read from.
enum Source {
    Dir(PathBuf),
    /// A tarball and where each of its regular files starts and how long it is.
    Tar {
        file: std::fs::File,
        index: HashMap<String, (u64, u64)>,
    },
}

impl Source {
    fn open(path: &Path) -> Result<Source> {
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
        if meta.is_dir() {
            return Ok(Source::Dir(path.to_path_buf()));
        }
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let mut index = HashMap::new();
        let mut links = Vec::new();
        let mut archive = tar::Archive::new(&file);
        let members = Members::new(&mut archive)
            .map_err(|e| bad(format!("{} is not a tarball: {e}", path.display())))?;
        for member in members {
            let member =
                member.map_err(|e| bad(format!("{} is not a readable tarball: {e}", path.display())))?;
            if index.len() + links.len() >= MAX_OUTER_ENTRIES {
                return Err(bad(format!("{} holds more than {MAX_OUTER_ENTRIES} files", path.display())));
            }
            let name = normal(&member.path().to_string_lossy());
            match member.entry.header().entry_type() {
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    index.insert(name, (member.entry.raw_file_position(), member.entry.size()));
                }
                // docker save links a layer shared by several images to its first copy.
                tar::EntryType::Symlink | tar::EntryType::Link => {
                    if let Some(target) = member.link_name() {
                        links.push((name, target.to_string_lossy().into_owned()));
                    }
                }
                _ => {}
            }
        }
        for (name, target) in links {
            let resolved = match name.rsplit_once('/') {
                Some((dir, _)) if !target.starts_with('/') => normal(&format!("{dir}/{target}")),
                _ => normal(&target),
            };
            if let Some(&at) = index.get(&resolved) {
                index.insert(name, at);
            }
        }
        Ok(Source::Tar { file, index })
    }

    fn has(&self, name: &str) -> bool {
        match self {
            Source::Dir(d) => d.join(name).is_file(),
            Source::Tar { index, .. } => index.contains_key(name),
        }
    }

    /// A reader over the file `name` (already normalized: no `..`, not absolute).
    fn read(&self, name: &str) -> Result<Box<dyn Read + '_>> {
        let missing = || {
            bad(format!(
                "the image has no file {}; is it a complete OCI layout or docker save?",
                shown(Path::new(name))
            ))
        };
        match self {
            Source::Dir(d) => {
                let p = d.join(name);
                // Names come from the image (docker save's manifest.json): none may reach a host
                // file outside the directory, by '..', an absolute path or a symlink.
                let inside = Path::new(name)
                    .components()
                    .all(|c| matches!(c, std::path::Component::Normal(_)))
                    && matches!((p.canonicalize(), d.canonicalize()), (Ok(real), Ok(base)) if real.starts_with(&base));
                let m = std::fs::symlink_metadata(&p).map_err(|_| missing())?;
                if !inside || !m.is_file() {
                    return Err(bad(format!(
                        "the image names {}, which is not a plain file inside {}",
                        shown(Path::new(name)),
                        d.display()
                    )));
                }
                Ok(Box::new(std::fs::File::open(&p).map_err(|e| Error::io(&p, e))?))
            }
            Source::Tar { file, index } => {
                let &(at, len) = index.get(name).ok_or_else(missing)?;
                let mut f = file.try_clone().map_err(|e| Error::io(name, e))?;
                f.seek(SeekFrom::Start(at)).map_err(|e| Error::io(name, e))?;
                Ok(Box::new(f.take(len)))
            }
        }
    }

    /// A JSON document, size-limited and, when `digest` is given, verified.
    fn json<T: serde::de::DeserializeOwned>(&self, name: &str, digest: Option<&Sha256Digest>) -> Result<T> {
        let mut bytes = Vec::new();
        self.read(name)?.take(MAX_JSON + 1).read_to_end(&mut bytes).map_err(|e| Error::io(name, e))?;
        if bytes.len() as u64 > MAX_JSON {
            return Err(bad(format!("{name} is over the limit of {MAX_JSON} bytes for image metadata")));
        }
        if let Some(d) = digest {
            check(name, d, &hex::encode(Sha256::digest(&bytes)))?;
        }
        serde_json::from_slice(&bytes).map_err(|e| bad(format!("{name} is not valid image metadata: {e}")))
    }
}

/// Collapses `./` and empty components of a name in the outer tarball; `..` stays and so never
/// matches a file we ask for.
fn normal(name: &str) -> String {
    name.split('/').filter(|c| !c.is_empty() && *c != ".").collect::<Vec<_>>().join("/")
}

fn check(what: &str, want: &Sha256Digest, got: &str) -> Result<()> {
    if want.hex() != got {
        return Err(bad(format!(
            "{what} does not match its digest: expected sha256:{}, found sha256:{got}; the image is corrupt or was altered",
            want.hex()
        )));
    }
    Ok(())
}

fn blob(d: &Sha256Digest) -> String {
    format!("blobs/sha256/{}", d.hex())
}

/// A reader that hashes what passes through it.
struct Hashing<R> {
    inner: R,
    hash: Sha256,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// One layer to apply: its file, the digest of the file (OCI only) and of its tar stream.
struct Layer {
    file: String,
    digest: Option<Sha256Digest>,
    diff_id: Sha256Digest,
}

/// What an imported image is made of.
pub(crate) struct Plan {
    layers: Vec<Layer>,
    pub(crate) config: RunConfig,
    /// The digests of the layers' tar streams, in order: the tree's identity.
    pub(crate) diff_ids: Vec<String>,
}

fn pick_manifest(src: &Source, mut index: Index, depth: usize) -> Result<Manifest> {
    // Attestation manifests (buildx) have platform unknown/unknown, so this skips them too.
    let amd64 =
        |d: &Descriptor| d.platform.as_ref().is_none_or(|p| p.os == "linux" && p.architecture == "amd64");
    let mut usable: Vec<Descriptor> = index.manifests.drain(..).filter(|d| amd64(d)).collect();
    if usable.len() != 1 {
        return Err(bad(format!(
            "the image index lists {} linux/amd64 images; import a layout that holds exactly one",
            usable.len()
        )));
    }
    let d = usable.remove(0);
    let digest = Sha256Digest::parse(&d.digest)?;
    if d.media_type.contains("index") || d.media_type.contains("manifest.list") {
        if depth >= MAX_INDEX_DEPTH {
            return Err(bad(format!("the image indexes nest deeper than {MAX_INDEX_DEPTH}")));
        }
        let nested: Index = src.json(&blob(&digest), Some(&digest))?;
        return pick_manifest(src, nested, depth + 1);
    }
    src.json(&blob(&digest), Some(&digest))
}

fn plan(src: &Source) -> Result<Plan> {
    let (config, layers): (ConfigFile, Vec<(String, Option<Sha256Digest>)>) = if src.has("index.json") {
        let index: Index = src.json("index.json", None)?;
        let manifest = pick_manifest(src, index, 0)?;
        let cd = Sha256Digest::parse(&manifest.config.digest)?;
        let config = src.json(&blob(&cd), Some(&cd))?;
        let mut layers = Vec::new();
        for l in manifest.layers {
            if l.media_type.contains("zstd") {
                return Err(bad(format!(
                    "layer {} is zstd-compressed; re-export the image with gzip or uncompressed layers",
                    l.digest
                )));
            }
            let d = Sha256Digest::parse(&l.digest)?;
            layers.push((blob(&d), Some(d)));
        }
        (config, layers)
    } else if src.has("manifest.json") {
        let mut images: Vec<DockerManifest> = src.json("manifest.json", None)?;
        if images.len() != 1 {
            return Err(bad(format!(
                "the docker save tarball holds {} images; save exactly one (`docker save IMAGE`)",
                images.len()
            )));
        }
        let image = images.remove(0);
        let config_file = normal(&image.config);
        // The config's name is its digest (`<hex>.json` or `blobs/sha256/<hex>`): verify it.
        let stem = config_file.rsplit('/').next().unwrap_or("").trim_end_matches(".json");
        let digest = Sha256Digest::parse(&format!("sha256:{stem}"))
            .map_err(|_| bad(format!("the config name {:?} is not a sha256 digest", image.config)))?;
        let config = src.json(&config_file, Some(&digest))?;
        (config, image.layers.iter().map(|l| (normal(l), None)).collect())
    } else {
        return Err(bad("neither index.json (OCI image layout) nor manifest.json (docker save) was found; \
             pass an OCI layout directory, its tarball, or a `docker save` tarball"
            .into()));
    };
    if config.rootfs.diff_ids.len() != layers.len() {
        return Err(bad(format!(
            "the manifest lists {} layers but the config {}",
            layers.len(),
            config.rootfs.diff_ids.len()
        )));
    }
    let mut out = Vec::new();
    for ((file, digest), diff) in layers.into_iter().zip(&config.rootfs.diff_ids) {
        out.push(Layer { file, digest, diff_id: Sha256Digest::parse(diff)? });
    }
    Ok(Plan {
        diff_ids: out.iter().map(|l| l.diff_id.hex().to_string()).collect(),
        layers: out,
        config: config.config.unwrap_or_default(),
    })
}

/// Reads the image at `path` and applies its layers to `root`, verifying every digest.
pub(crate) fn unpack(
    path: &Path,
    root: &Path,
    budget: &mut Budget,
    progress: &mut dyn FnMut(&str),
) -> Result<Plan> {
    let src = Source::open(path)?;
    let plan = plan(&src)?;
    if plan.layers.len() > budget.limits.max_layers {
        return Err(bad(format!(
            "the image has {} layers, over the limit of {}",
            plan.layers.len(),
            budget.limits.max_layers
        )));
    }
    let mut used = 0;
    for (i, layer) in plan.layers.iter().enumerate() {
        progress(&format!("layer {}/{}: {}", i + 1, plan.layers.len(), layer.diff_id.hex()));
        let mut file = Hashing { inner: src.read(&layer.file)?, hash: Sha256::new() };
        let mut magic = [0u8; 2];
        let n = read_full(&mut file, &mut magic).map_err(|e| Error::io(&layer.file, e))?;
        let head = std::io::Cursor::new(magic[..n].to_vec());
        let diff = {
            let stream: Box<dyn Read + '_> = if magic[..n] == [0x1f, 0x8b] {
                Box::new(flate2::read::MultiGzDecoder::new(head.chain(&mut file)))
            } else {
                Box::new(head.chain(&mut file))
            };
            let limit = budget.limits.max_bytes;
            let mut tar = Hashing { inner: Counted { inner: stream, used, limit }, hash: Sha256::new() };
            apply_layer(root, &mut tar, budget)?;
            // The tar reader stops at the end-of-archive blocks: the digests cover what follows too.
            std::io::copy(&mut tar, &mut std::io::sink())
                .map_err(|e| bad(format!("layer {} cannot be read: {e}", layer.file)))?;
            used = tar.inner.used;
            hex::encode(tar.hash.finalize())
        };
        std::io::copy(&mut file, &mut std::io::sink()).map_err(|e| Error::io(&layer.file, e))?;
        if let Some(d) = &layer.digest {
            check(&format!("layer {}", layer.file), d, &hex::encode(file.hash.finalize()))?;
        }
        check(&format!("the unpacked layer {}", layer.file), &layer.diff_id, &diff)?;
    }
    Ok(plan)
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}
