//! A layer store: a directory of layer files (`layers/<id>.layer`) and chain manifests
//! (`chains/<name>.json`). Chains name layers; layers never name each other, so a layer is
//! shared by every chain over it and removable once no chain names it.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::block::CLUSTER_SIZE;

use crate::chain::FrozenChain;
use crate::format::{encode_entry, slot_offset};
use crate::layer::{io_err, layer_path, lock, sync_dir, LayerFile};
use crate::manifest::{check_name, id_text, DeltaRef, Manifest};
use crate::LayerError;

/// Clusters copied per batch when flattening.
const FLATTEN_BATCH: usize = 256;

/// A directory of layers and chains. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    root: PathBuf,
}

impl Store {
    /// Opens (creating if needed) the store at `root`.
    pub fn open(root: &Path) -> Result<Store, LayerError> {
        for dir in [root.join("layers"), root.join("chains")] {
            std::fs::create_dir_all(&dir).map_err(io_err("cannot create store directory", &dir))?;
        }
        Ok(Store { root: root.to_owned() })
    }

    /// The store's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn layers(&self) -> PathBuf {
        self.root.join("layers")
    }

    fn chains(&self) -> PathBuf {
        self.root.join("chains")
    }

    pub(crate) fn manifest_path(&self, name: &str) -> Result<PathBuf, LayerError> {
        check_name(name)?;
        Ok(self.chains().join(format!("{name}.json")))
    }

    pub(crate) fn load(&self, name: &str) -> Result<(Manifest, PathBuf), LayerError> {
        let path = self.manifest_path(name)?;
        if !path.exists() {
            return Err(LayerError::NoChain { name: name.to_string() });
        }
        Ok((Manifest::load(&path)?, path))
    }

    pub(crate) fn write_manifest(&self, name: &str, manifest: &Manifest) -> Result<(), LayerError> {
        manifest.store(&self.manifest_path(name)?, true)
    }

    fn create_manifest(&self, name: &str, manifest: &Manifest) -> Result<(), LayerError> {
        if self.manifest_path(name)?.exists() {
            return Err(LayerError::ChainExists { name: name.to_string() });
        }
        self.write_manifest(name, manifest)
    }

    /// Whether the store has a chain named `name`.
    pub fn has_chain(&self, name: &str) -> Result<bool, LayerError> {
        Ok(self.manifest_path(name)?.exists())
    }

    /// A new empty top, locked for this process.
    pub(crate) fn new_top(&self, disk_size: u64) -> Result<LayerFile, LayerError> {
        self.new_top_entry(disk_size, true)
    }

    pub(crate) fn new_top_entry(&self, disk_size: u64, entry_durable: bool) -> Result<LayerFile, LayerError> {
        let top = LayerFile::create(&self.layers(), disk_size, entry_durable)?;
        lock(&top.file, &top.path)?;
        Ok(top)
    }

    /// Records `frozen` as chain `name` with no top: a snapshot's disk.
    pub fn save_frozen(&self, name: &str, frozen: &FrozenChain) -> Result<(), LayerError> {
        self.check_own(frozen)?;
        self.create_manifest(
            name,
            &Manifest::new(frozen.base_path().to_owned(), frozen.disk_size(), frozen.refs(), None),
        )
    }

    /// Opens the frozen chain `name` (one [`save_frozen`](Self::save_frozen) recorded).
    pub fn open_frozen(&self, name: &str) -> Result<FrozenChain, LayerError> {
        let (manifest, path) = self.load(name)?;
        if manifest.top.is_some() {
            return Err(LayerError::HasTop { name: name.to_string() });
        }
        FrozenChain::open(&self.root, &self.layers(), &manifest, &path)
    }

    /// The files of a fork: every top, then every manifest, each directory synced once (a
    /// fork of 100 pays 2 directory syncs, not 200).
    pub(crate) fn fork_files(
        &self,
        frozen: &FrozenChain,
        names: &[&str],
        tops: &mut Vec<LayerFile>,
        written: &mut Vec<PathBuf>,
    ) -> Result<(), LayerError> {
        for _ in names {
            tops.push(self.new_top_entry(frozen.disk_size(), false)?);
        }
        sync_dir(&self.layers())?;
        for (name, top) in names.iter().zip(tops.iter()) {
            let manifest = Manifest::new(
                frozen.base_path().to_owned(),
                frozen.disk_size(),
                frozen.refs(),
                Some(top.header.id),
            );
            let path = self.manifest_path(name)?;
            manifest.store(&path, false)?;
            written.push(path);
        }
        sync_dir(&self.chains())
    }

    pub(crate) fn check_own(&self, frozen: &FrozenChain) -> Result<(), LayerError> {
        if frozen.store() == self.root {
            return Ok(());
        }
        Err(LayerError::OtherChain {
            name: String::new(),
            reason: format!(
                "it belongs to the store {}, not {}",
                frozen.store().display(),
                self.root.display()
            ),
        })
    }

    /// Every chain's manifest, by name.
    fn manifests(&self) -> Result<BTreeMap<String, (Manifest, PathBuf)>, LayerError> {
        let dir = self.chains();
        let mut all = BTreeMap::new();
        for entry in std::fs::read_dir(&dir).map_err(io_err("cannot list chains", &dir))? {
            let entry = entry.map_err(io_err("cannot list chains", &dir))?;
            let file = entry.file_name().to_string_lossy().into_owned();
            let Some(name) = file.strip_suffix(".json").filter(|n| check_name(n).is_ok()) else {
                continue;
            };
            let path = entry.path();
            all.insert(name.to_string(), (Manifest::load(&path)?, path));
        }
        Ok(all)
    }

    /// The chains that reference layer `id`.
    fn users(&self, id: u64) -> Result<Vec<String>, LayerError> {
        let mut users = Vec::new();
        for (name, (manifest, path)) in self.manifests()? {
            if manifest.all_ids(&path)?.contains(&id) {
                users.push(name);
            }
        }
        Ok(users)
    }

    /// Removes layer `id`; refused while any chain references it.
    pub fn remove_layer(&self, id: u64) -> Result<(), LayerError> {
        let users = self.users(id)?;
        if !users.is_empty() {
            return Err(LayerError::LayerInUse { id: id_text(id), chains: users });
        }
        let path = layer_path(&self.layers(), id);
        std::fs::remove_file(&path).map_err(io_err("cannot remove layer", &path))?;
        sync_dir(&self.layers())
    }

    /// Removes chain `name`'s manifest and its top (no other chain names a top); its deltas
    /// stay until no chain references them ([`unreferenced_layers`](Self::unreferenced_layers)).
    /// Refused while a process has the chain open.
    pub fn remove_chain(&self, name: &str) -> Result<(), LayerError> {
        let (manifest, path) = self.load(name)?;
        let top = match manifest.top_id(&path)? {
            Some(id) => Some(self.lock_top(id)?),
            None => None,
        };
        std::fs::remove_file(&path).map_err(io_err("cannot remove chain manifest", &path))?;
        sync_dir(&self.chains())?;
        if let Some((_, top)) = top {
            std::fs::remove_file(&top).map_err(io_err("cannot remove top layer", &top))?;
        }
        Ok(())
    }

    /// Opens top `id` and takes its lock: refused while a process has it open.
    fn lock_top(&self, id: u64) -> Result<(std::fs::File, PathBuf), LayerError> {
        let path = layer_path(&self.layers(), id);
        let file = std::fs::File::open(&path).map_err(io_err("cannot open top layer", &path))?;
        lock(&file, &path)?;
        Ok((file, path))
    }

    /// Flattens chain `name`: its deltas are merged into one new delta (the newest content of
    /// every cluster any of them holds) and the manifest names that one instead, so the depth
    /// stays bounded. The old deltas stay while other chains name them. Refused while a
    /// process has the chain open.
    pub fn flatten(&self, name: &str) -> Result<(), LayerError> {
        let (manifest, path) = self.load(name)?;
        if manifest.deltas.len() <= 1 {
            return Ok(());
        }
        let _held_open = match manifest.top_id(&path)? {
            Some(id) => Some(self.lock_top(id)?),
            None => None,
        };
        let frozen = FrozenChain::open(&self.root, &self.layers(), &manifest, &path)?;
        let merged = LayerFile::create(&self.layers(), frozen.disk_size(), true)?;
        let clusters = self.copy_deltas(&frozen, &merged);
        let count = match clusters {
            Ok(n) => n,
            Err(e) => {
                let _ = std::fs::remove_file(&merged.path);
                return Err(e);
            }
        };
        let deltas = vec![DeltaRef { id: id_text(merged.header.id), clusters: count }];
        let flat = Manifest { deltas, ..manifest };
        if let Err(e) = self.write_manifest(name, &flat) {
            let _ = std::fs::remove_file(&merged.path);
            return Err(e);
        }
        Ok(())
    }

    /// Copies every cluster `frozen`'s deltas hold into `to`, in disk order, then its index;
    /// durable before it returns the count.
    fn copy_deltas(&self, frozen: &FrozenChain, to: &LayerFile) -> Result<u64, LayerError> {
        let write = |e| io_err("cannot write flattened layer", &to.path)(e);
        let mut held: Vec<u64> = Vec::new();
        let mut buf = vec![0u8; FLATTEN_BATCH * CLUSTER_SIZE as usize];
        let mut batch = 0usize;
        let clusters = frozen.disk_size() / CLUSTER_SIZE;
        for cluster in (0..clusters).filter(|&c| frozen.in_deltas(c)) {
            let at = batch * CLUSTER_SIZE as usize;
            frozen.read(cluster, 0, &mut buf[at..at + CLUSTER_SIZE as usize]).map_err(write)?;
            held.push(cluster);
            batch += 1;
            if batch == FLATTEN_BATCH {
                let first = (held.len() - batch) as u64;
                to.file.write_all_at(&buf, to.data_at(first)).map_err(write)?;
                batch = 0;
            }
        }
        let first = (held.len() - batch) as u64;
        to.file.write_all_at(&buf[..batch * CLUSTER_SIZE as usize], to.data_at(first)).map_err(write)?;
        let entries: Vec<u8> = held
            .iter()
            .enumerate()
            .flat_map(|(slot, &c)| encode_entry(to.header.id, slot as u64, c))
            .collect();
        to.file.write_all_at(&entries, slot_offset(0)).map_err(write)?;
        to.file.sync_all().map_err(write)?;
        Ok(held.len() as u64)
    }

    /// Layer files no chain's manifest references: what a garbage collection may remove
    /// (with [`remove_layer`](Self::remove_layer), which checks again). Refused if any
    /// manifest cannot be read, as its layers would otherwise look like garbage.
    pub fn unreferenced_layers(&self) -> Result<Vec<PathBuf>, LayerError> {
        let mut referenced = std::collections::HashSet::new();
        for (manifest, path) in self.manifests()?.values() {
            referenced.extend(manifest.all_ids(path)?);
        }
        let dir = self.layers();
        let mut garbage = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(io_err("cannot list layers", &dir))? {
            let entry = entry.map_err(io_err("cannot list layers", &dir))?;
            let file = entry.file_name().to_string_lossy().into_owned();
            let Some(id) = file
                .strip_suffix(".layer")
                .filter(|h| h.len() == 16)
                .and_then(|h| u64::from_str_radix(h, 16).ok())
            else {
                continue;
            };
            if !referenced.contains(&id) {
                garbage.push(entry.path());
            }
        }
        garbage.sort();
        Ok(garbage)
    }
}
