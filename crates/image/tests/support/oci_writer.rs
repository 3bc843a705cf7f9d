//! Writes OCI image layouts and `docker save` tarballs for tests, with layers made entry by
//! entry (hostile ones included: names are written into the header as given).

#![allow(dead_code)]

use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::Path;

/// One entry of a layer.
pub enum Entry {
    Dir(&'static str),
    File(String, Vec<u8>, u32),
    Symlink(&'static str, &'static str),
    Hardlink(&'static str, &'static str),
    CharDevice(&'static str),
}

/// Builds an uncompressed layer; names go into the header unchecked.
pub fn layer(entries: &[Entry]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        let (name, data): (&str, &[u8]) = match e {
            Entry::Dir(p) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                (p, &[])
            }
            Entry::File(p, bytes, mode) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                (p.as_str(), bytes.as_slice())
            }
            Entry::Symlink(p, target) | Entry::Hardlink(p, target) => {
                let kind = if matches!(e, Entry::Symlink(..)) {
                    tar::EntryType::Symlink
                } else {
                    tar::EntryType::Link
                };
                h.set_entry_type(kind);
                h.set_mode(0o777);
                raw_name(&mut h.as_old_mut().linkname, target);
                (p, &[])
            }
            Entry::CharDevice(p) => {
                h.set_entry_type(tar::EntryType::Char);
                h.set_mode(0o666);
                (p, &[])
            }
        };
        raw_name(&mut h.as_old_mut().name, name);
        h.set_size(data.len() as u64);
        h.set_cksum();
        b.append(&h, data).expect("append");
    }
    b.into_inner().expect("finish")
}

fn raw_name(field: &mut [u8], name: &str) {
    assert!(name.len() < field.len(), "test names must fit the old header");
    field.fill(0);
    field[..name.len()].copy_from_slice(name.as_bytes());
}

pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).expect("gzip");
    e.finish().expect("gzip")
}

pub fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// An image: its layers (uncompressed tar, and whether to store it gzipped) and config.
pub struct Image {
    pub layers: Vec<(Vec<u8>, bool)>,
    pub env: Vec<String>,
    pub workdir: Option<String>,
}

impl Image {
    fn config(&self) -> Vec<u8> {
        let diff_ids: Vec<String> = self.layers.iter().map(|(t, _)| format!("sha256:{}", sha(t))).collect();
        serde_json::to_vec(&serde_json::json!({
            "architecture": "amd64", "os": "linux",
            "config": {"Env": self.env, "WorkingDir": self.workdir.clone().unwrap_or_default(), "Cmd": ["/bin/sh"]},
            "rootfs": {"type": "layers", "diff_ids": diff_ids}
        }))
        .expect("config")
    }

    /// The files of an OCI image layout: (path, bytes).
    pub fn oci_files(&self) -> Vec<(String, Vec<u8>)> {
        let mut files = vec![("oci-layout".to_string(), br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec())];
        let config = self.config();
        let mut layers = Vec::new();
        for (tar, gz) in &self.layers {
            let (blob, mt) = if *gz {
                (gzip(tar), "application/vnd.oci.image.layer.v1.tar+gzip")
            } else {
                (tar.clone(), "application/vnd.oci.image.layer.v1.tar")
            };
            layers.push(serde_json::json!({"mediaType": mt, "digest": format!("sha256:{}", sha(&blob)), "size": blob.len()}));
            files.push((format!("blobs/sha256/{}", sha(&blob)), blob));
        }
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": format!("sha256:{}", sha(&config)), "size": config.len()},
            "layers": layers
        }))
        .expect("manifest");
        let index = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": format!("sha256:{}", sha(&manifest)), "size": manifest.len(),
                "platform": {"architecture": "amd64", "os": "linux"}}]
        }))
        .expect("index");
        files.push((format!("blobs/sha256/{}", sha(&config)), config));
        files.push((format!("blobs/sha256/{}", sha(&manifest)), manifest));
        files.push(("index.json".to_string(), index));
        files
    }

    /// The files of a `docker save` tarball (the layout before Docker 25).
    pub fn docker_files(&self) -> Vec<(String, Vec<u8>)> {
        let config = self.config();
        let mut files = Vec::new();
        let mut names = Vec::new();
        for (tar, _) in &self.layers {
            let name = format!("{}/layer.tar", sha(tar));
            files.push((name.clone(), tar.clone()));
            names.push(name);
        }
        let config_name = format!("{}.json", sha(&config));
        files.push((config_name.clone(), config));
        let manifest =
            serde_json::json!([{"Config": config_name, "RepoTags": ["test:latest"], "Layers": names}]);
        files.push(("manifest.json".to_string(), serde_json::to_vec(&manifest).expect("manifest")));
        files
    }
}

pub fn write_dir(dir: &Path, files: &[(String, Vec<u8>)]) {
    for (name, bytes) in files {
        let p = dir.join(name);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, bytes).expect("write");
    }
}

pub fn write_tar(path: &Path, files: &[(String, Vec<u8>)]) {
    let mut b = tar::Builder::new(std::fs::File::create(path).expect("create"));
    for (name, bytes) in files {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(bytes.len() as u64);
        b.append_data(&mut h, name, bytes.as_slice()).expect("append");
    }
    b.finish().expect("finish");
}
