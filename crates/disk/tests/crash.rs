//! Crash safety of the top layer: a real child process writes and flushes in a loop and is
//! SIGKILLed; the top must reopen, every flushed write must be there, and every cluster must
//! hold a content it had at or after the last flush (old or new, never a mix).

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use branchbox_disk::{BlockBackend, LayeredBackend, Store, CLUSTER_SIZE, SECTOR_SIZE};
use common::{base_disk, random_write, read_all};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Set in the child's environment to the store's directory.
const CHILD_ENV: &str = "BRANCHBOX_LAYERS_CRASH_STORE";
const CLUSTERS: u64 = 256;
/// Writes between flushes.
const PER_FLUSH: u64 = 8;
/// Flushes the parent waits for before the kill.
const FLUSHES_BEFORE_KILL: u64 = 30;

/// Write `i` of the child's sequence: where, and bytes that say which write made them.
fn nth_write(i: u64) -> (u64, Vec<u8>) {
    let mut rng = StdRng::seed_from_u64(0x5eed ^ i);
    let cluster = rng.gen_range(0..CLUSTERS);
    let per_cluster = CLUSTER_SIZE / SECTOR_SIZE;
    let (first, count) = if rng.gen_bool(0.5) {
        (0, per_cluster)
    } else {
        let first = rng.gen_range(0..per_cluster);
        (first, rng.gen_range(1..=per_cluster - first))
    };
    let stamp = (i as u32 + 1).to_le_bytes();
    let data = stamp.iter().copied().cycle().take((count * SECTOR_SIZE) as usize).collect();
    (cluster * per_cluster + first, data)
}

/// The child: opens the chain and writes, flushing every [`PER_FLUSH`] writes and printing
/// `F <last write flushed>`, until it is killed. Run by the test below, not on its own.
#[test]
#[ignore = "the child process of a_top_killed_mid_write_reopens_with_every_flushed_write"]
fn crash_child_writes_until_killed() {
    let Some(root) = std::env::var_os(CHILD_ENV) else {
        panic!("run only by a_top_killed_mid_write_reopens_with_every_flushed_write, which sets {CHILD_ENV}");
    };
    let store = Store::open(Path::new(&root)).expect("child: store");
    let mut disk = LayeredBackend::open(&store, "vm").expect("child: open chain");
    let mut out = std::io::stdout().lock();
    for i in 0.. {
        let (sector, data) = nth_write(i);
        disk.write(sector, &data).expect("child: write");
        if i % PER_FLUSH == PER_FLUSH - 1 {
            disk.flush().expect("child: flush");
            std::io::Write::write_all(&mut out, format!("F {i}\n").as_bytes()).expect("child: report");
            std::io::Write::flush(&mut out).expect("child: report");
        }
    }
}

#[test]
fn a_top_killed_mid_write_reopens_with_every_flushed_write() {
    for round in 0..3u64 {
        let dir = tempfile::tempdir().expect("tempdir");
        let (base, mut model) = base_disk(dir.path(), CLUSTERS, 20 + round);
        let root = dir.path().join("store");
        let store = Store::open(&root).expect("store");
        // Two frozen deltas under the top, so copy-ups read from every depth.
        let mut disk = LayeredBackend::create(&store, "vm", &base).expect("create");
        let mut rng = StdRng::seed_from_u64(30 + round);
        for _ in 0..2 {
            for _ in 0..60 {
                random_write(&mut rng, &mut disk, &mut model);
            }
            disk.freeze().expect("freeze");
        }
        drop(disk);

        let flushed = run_child_and_kill(&root, round);
        check_after_crash(&store, model, flushed, round);
    }
}

/// Runs the child until it reported [`FLUSHES_BEFORE_KILL`] flushes, SIGKILLs it, and returns
/// the last write it reported flushed.
fn run_child_and_kill(root: &Path, round: u64) -> u64 {
    let exe = std::env::current_exe().expect("this test binary");
    let mut child = Command::new(exe)
        .args(["--ignored", "--exact", "crash_child_writes_until_killed", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, root)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the child");
    let mut lines = BufReader::new(child.stdout.take().expect("child stdout")).lines();
    let mut last = None;
    let mut reports = 0;
    while reports < FLUSHES_BEFORE_KILL {
        let line = lines.next().expect("the child ended before it was killed").expect("read the child");
        if let Some(i) = line.strip_prefix("F ").and_then(|n| n.parse::<u64>().ok()) {
            last = Some(i);
            reports += 1;
        }
    }
    // A different instant each round: right away, or after more writes went out.
    std::thread::sleep(std::time::Duration::from_micros(round * 700));
    child.kill().expect("SIGKILL the child");
    // What the child reported before it died is still in the pipe.
    for line in lines.map_while(Result::ok) {
        if let Some(i) = line.strip_prefix("F ").and_then(|n| n.parse::<u64>().ok()) {
            last = Some(i);
        }
    }
    let status = child.wait().expect("reap the child");
    assert!(!status.success(), "the child was not killed: {status}");
    last.expect("the child reported no flush")
}

/// Reopens the chain and checks every cluster against the writes: exactly its content after
/// write `flushed`, or after a later write to it.
fn check_after_crash(store: &Store, mut model: Vec<u8>, flushed: u64, round: u64) {
    let cluster_of =
        |m: &[u8], c: u64| m[(c * CLUSTER_SIZE) as usize..((c + 1) * CLUSTER_SIZE) as usize].to_vec();
    for i in 0..=flushed {
        apply(&mut model, i);
    }
    let mut allowed: HashMap<u64, Vec<Vec<u8>>> =
        (0..CLUSTERS).map(|c| (c, vec![cluster_of(&model, c)])).collect();
    // The child cannot be more than two flush periods past its last report.
    for i in flushed + 1..=flushed + 4 * PER_FLUSH {
        let cluster = apply(&mut model, i);
        allowed.entry(cluster).or_default().push(cluster_of(&model, cluster));
    }
    let mut disk: LayeredBackend = LayeredBackend::open(store, "vm").expect("reopen the killed top");
    let now = read_all(&mut disk);
    let mut newer = 0;
    for c in 0..CLUSTERS {
        let content = cluster_of(&now, c);
        let options = &allowed[&c];
        let which = options.iter().position(|o| *o == content);
        assert!(
            which.is_some(),
            "round {round}: cluster {c} holds neither its flushed content (after write {flushed}) nor a later one"
        );
        newer += usize::from(which != Some(0));
    }
    eprintln!(
        "round {round}: killed after write {flushed} was flushed; {newer} clusters hold unflushed writes, \
         the top holds {} clusters",
        disk.top_clusters()
    );
}

/// Applies write `i` to the flat model; returns the cluster it touched.
fn apply(model: &mut [u8], i: u64) -> u64 {
    let (sector, data) = nth_write(i);
    let at = (sector * SECTOR_SIZE) as usize;
    model[at..at + data.len()].copy_from_slice(&data);
    sector * SECTOR_SIZE / CLUSTER_SIZE
}
