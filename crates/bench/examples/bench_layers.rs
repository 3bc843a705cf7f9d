//! Host-side costs of layered disks, printed, never asserted (docs/disk-layers.md has the
//! figures): a 4 KiB read of clusters the oldest delta holds at depth 1 and 8, opening a chain of depth 8, freeze with 1 and
//! 10 MiB dirty, and a fork of 100 tops.
//!
//! `cargo run --release -p branchbox-bench --example bench_layers [DIR]` (DIR: where the
//! store goes; default a temporary directory; put it on the filesystem you care about).

use std::time::{Duration, Instant};

use branchbox_disk::{BlockBackend, LayeredBackend, Store, CLUSTER_SIZE, SECTOR_SIZE};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The disk's size: the project's root disk (`branchbox guest disk`) is 768 MiB.
const DISK: u64 = 768 << 20;
const READS: usize = 200_000;
/// Clusters of the hot set (16 MiB).
const HOT: u64 = 4096;

fn main() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = std::env::args().nth(1).map(std::path::PathBuf::from).unwrap_or_else(|| tmp.path().to_owned());
    let work = tempfile::tempdir_in(&dir).expect("work dir");
    let base = work.path().join("base.img");
    std::fs::File::create(&base).and_then(|f| f.set_len(DISK)).expect("base");
    let store = Store::open(&work.path().join("store")).expect("store");
    let clusters = DISK / CLUSTER_SIZE;
    println!("disk {} MiB ({clusters} clusters), store in {}", DISK >> 20, dir.display());

    for depth in [1usize, 8] {
        let name = format!("d{depth}");
        let mut disk = LayeredBackend::create(&store, &name, &base).expect("create");
        // The oldest delta holds the hot set (clusters 0..HOT, read below); each newer one
        // holds other clusters. A lookup that walked the chain newest first would probe every
        // layer; the merged index is one array read at any depth. Same data, same page cache.
        let mut rng = StdRng::seed_from_u64(depth as u64);
        for layer in 0..depth as u64 {
            fill(&mut disk, layer * HOT..(layer + 1) * HOT);
            disk.freeze().expect("freeze");
        }
        drop(disk);
        let started = Instant::now();
        let mut disk = LayeredBackend::open(&store, &name).expect("open");
        let open = started.elapsed();
        let per_read = random_reads(&mut disk, &mut rng);
        println!(
            "depth {depth}: open (merged index) {:.2} ms; 4 KiB random read from the oldest delta {:.0} ns each (p50 of 5 runs of {READS})",
            ms(open),
            per_read.as_nanos()
        );
    }

    for mib in [1u64, 10] {
        let mut disk = LayeredBackend::create(&store, &format!("freeze{mib}"), &base).expect("create");
        let mut rng = StdRng::seed_from_u64(mib);
        dirty(&mut disk, &mut rng, (mib << 20) / CLUSTER_SIZE);
        let started = Instant::now();
        disk.freeze().expect("freeze");
        println!("freeze with {mib} MiB dirty (unflushed): {:.2} ms", ms(started.elapsed()));
        let started = Instant::now();
        disk.freeze().expect("freeze");
        println!("freeze of an empty top over it: {:.2} ms", ms(started.elapsed()));
    }

    let mut parent = LayeredBackend::create(&store, "parent", &base).expect("create");
    let mut rng = StdRng::seed_from_u64(100);
    dirty(&mut parent, &mut rng, 256);
    let frozen = parent.freeze().expect("freeze");
    let names: Vec<String> = (0..100).map(|i| format!("child{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let started = Instant::now();
    let children = LayeredBackend::fork(&store, &frozen, &names).expect("fork");
    println!(
        "fork of {} tops over a frozen chain of depth {}: {:.2} ms ({:.3} ms per child)",
        children.len(),
        frozen.depth(),
        ms(started.elapsed()),
        ms(started.elapsed()) / children.len() as f64
    );
}

/// Writes `n` random whole clusters.
fn dirty(disk: &mut LayeredBackend, rng: &mut StdRng, n: u64) {
    let clusters = disk.sectors() * SECTOR_SIZE / CLUSTER_SIZE;
    let data = vec![0x5au8; CLUSTER_SIZE as usize];
    for _ in 0..n {
        let c = rng.gen_range(0..clusters);
        disk.write(c * CLUSTER_SIZE / SECTOR_SIZE, &data).expect("write");
    }
}

/// Writes whole clusters `range`.
fn fill(disk: &mut LayeredBackend, range: std::ops::Range<u64>) {
    let data = vec![0x5au8; CLUSTER_SIZE as usize];
    for c in range {
        disk.write(c * CLUSTER_SIZE / SECTOR_SIZE, &data).expect("write");
    }
}

/// Median per-read time of 5 runs of [`READS`] random 4 KiB reads of the hot set (from the
/// page cache).
fn random_reads(disk: &mut LayeredBackend, rng: &mut StdRng) -> Duration {
    let clusters = HOT;
    let mut buf = vec![0u8; CLUSTER_SIZE as usize];
    let mut runs: Vec<Duration> = (0..5)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..READS {
                let c = rng.gen_range(0..clusters);
                disk.read(c * CLUSTER_SIZE / SECTOR_SIZE, &mut buf).expect("read");
            }
            started.elapsed() / READS as u32
        })
        .collect();
    runs.sort();
    runs[2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
