//! Shared by the layer tests: a base disk of random bytes and a flat model of the disk.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use branchbox_disk::{BlockBackend, LayeredBackend, CLUSTER_SIZE, SECTOR_SIZE};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

/// Writes a base disk of `clusters` clusters of seeded random bytes; returns its path and bytes.
pub fn base_disk(dir: &Path, clusters: u64, seed: u64) -> (PathBuf, Vec<u8>) {
    let mut bytes = vec![0u8; (clusters * CLUSTER_SIZE) as usize];
    StdRng::seed_from_u64(seed).fill_bytes(&mut bytes);
    let path = dir.join(format!("base-{seed}.img"));
    std::fs::write(&path, &bytes).expect("write base");
    (path, bytes)
}

/// A random sector-aligned write of up to three clusters, applied to `disk` and `model`.
pub fn random_write(rng: &mut StdRng, disk: &mut LayeredBackend, model: &mut [u8]) {
    let sectors = model.len() as u64 / SECTOR_SIZE;
    let len = rng.gen_range(1..=3 * CLUSTER_SIZE / SECTOR_SIZE).min(sectors);
    let start = rng.gen_range(0..=sectors - len);
    let mut data = vec![0u8; (len * SECTOR_SIZE) as usize];
    rng.fill_bytes(&mut data);
    disk.write(start, &data).expect("write");
    let at = (start * SECTOR_SIZE) as usize;
    model[at..at + data.len()].copy_from_slice(&data);
}

/// Reads the whole disk.
pub fn read_all(disk: &mut LayeredBackend) -> Vec<u8> {
    let mut all = vec![0u8; (disk.sectors() * SECTOR_SIZE) as usize];
    disk.read(0, &mut all).expect("read the disk");
    all
}

/// Reads `len` bytes at byte `at` (sector-aligned).
pub fn read_at(disk: &mut LayeredBackend, at: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    disk.read(at / SECTOR_SIZE, &mut buf).expect("read");
    buf
}

/// Fills the cluster `cluster` with `byte`.
pub fn fill_cluster(disk: &mut LayeredBackend, cluster: u64, byte: u8) {
    disk.write(cluster * CLUSTER_SIZE / SECTOR_SIZE, &vec![byte; CLUSTER_SIZE as usize]).expect("write");
}
