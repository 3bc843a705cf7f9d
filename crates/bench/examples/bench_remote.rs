//! Push and pull throughput of a real snapshot against a raw S3 copy of the same bytes, and the
//! dedup of a child snapshot against its pushed parent, on a SeaweedFS server on loopback
//! (docs/benchmarks.md, "Portable snapshots").
//!
//! `cargo run --release -p branchbox-bench --example bench_remote -- PARENT_DIR CHILD_DIR [RUNS]`
//! with two snapshot directories (`<data>/snapshots/<id>`), the child taken after the parent
//! of the same sandbox.

// The SeaweedFS harness of branchbox-chunks' tests, shared rather than copied.
#[path = "../../chunks/tests/common/mod.rs"]
mod weed;

use weed::{fingerprint, record};

use branchbox_chunks::s3::Remote;
use branchbox_chunks::{fetch_manifest, materialize, push, LocalChunks};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Instant;

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir.join("checkpoint")).expect("a snapshot directory with checkpoint/") {
        out.push(e.unwrap().path());
    }
    out.sort();
    out
}

fn mib_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / 1048576.0 / secs
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (parent_dir, child_dir) = (PathBuf::from(&args[0]), PathBuf::from(&args[1]));
    let runs: usize = args.get(2).and_then(|r| r.parse().ok()).unwrap_or(3);
    let weed = weed::Weed::start().expect("the weed binary (scripts/setup.sh --test)");
    let bytes: u64 = files(&parent_dir).iter().map(|f| std::fs::metadata(f).unwrap().len()).sum();
    let scratch = tempfile::tempdir().unwrap();
    let (mut raw_put, mut raw_get, mut push_t, mut pull_t) = (vec![], vec![], vec![], vec![]);
    for run in 0..runs {
        // Raw copy: each file as one object, written then read back whole.
        let raw = weed.remote(&format!("s3://bench/raw{run}"));
        raw.ensure_bucket().unwrap();
        let t = Instant::now();
        for f in files(&parent_dir) {
            raw.put(&f.file_name().unwrap().to_string_lossy(), &std::fs::read(&f).unwrap()).unwrap();
        }
        raw_put.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        for f in files(&parent_dir) {
            let got = raw.get(&f.file_name().unwrap().to_string_lossy(), 1 << 32).unwrap().unwrap();
            std::fs::write(scratch.path().join(format!("raw{run}")), got).unwrap();
        }
        raw_get.push(t.elapsed().as_secs_f64());

        // Push to an empty prefix, pull into an empty directory (nothing to reuse).
        let remote: Remote = weed.remote(&format!("s3://bench/chunks{run}"));
        let snap = record(None);
        let t = Instant::now();
        let r = push(&remote, &parent_dir, &snap, fingerprint(), &mut |_| ControlFlow::Continue(())).unwrap();
        push_t.push(t.elapsed().as_secs_f64());
        assert_eq!(r.sent_bytes, bytes);
        let t = Instant::now();
        let m = fetch_manifest(&remote, &snap.id).unwrap();
        materialize(
            &remote,
            &m,
            &scratch.path().join(format!("pull{run}")),
            &LocalChunks::default(),
            &mut |_| {},
        )
        .unwrap();
        pull_t.push(t.elapsed().as_secs_f64());
        // The local manifest a push leaves is not part of the next run's input.
        let _ = std::fs::remove_file(parent_dir.join(branchbox_chunks::LOCAL_MANIFEST));
    }
    let (rp, rg, p, l) = (median(raw_put), median(raw_get), median(push_t), median(pull_t));
    println!(
        "snapshot: {:.1} MiB in {} files, {runs} runs, medians",
        bytes as f64 / 1048576.0,
        files(&parent_dir).len()
    );
    println!(
        "raw S3 PUT of the files: {:.0} MiB/s   push: {:.0} MiB/s   push/raw {:.2}",
        mib_s(bytes, rp),
        mib_s(bytes, p),
        rp / p
    );
    println!(
        "raw S3 GET of the files: {:.0} MiB/s   pull: {:.0} MiB/s   pull/raw {:.2}",
        mib_s(bytes, rg),
        mib_s(bytes, l),
        rg / l
    );

    // Dedup: the child pushed after its parent.
    let remote = weed.remote("s3://bench/dedup");
    let parent = record(None);
    push(&remote, &parent_dir, &parent, fingerprint(), &mut |_| ControlFlow::Continue(())).unwrap();
    let child = record(Some(parent.id.clone()));
    let r = push(&remote, &child_dir, &child, fingerprint(), &mut |_| ControlFlow::Continue(())).unwrap();
    let total = r.sent_bytes + r.skipped_bytes;
    println!(
        "child of {:.1} MiB after its parent: sent {:.1} MiB ({} of {} chunks), {:.0} % deduplicated, ratio {:.1}x",
        total as f64 / 1048576.0,
        r.sent_bytes as f64 / 1048576.0,
        r.sent_chunks,
        r.chunks,
        100.0 * r.skipped_bytes as f64 / total as f64,
        total as f64 / r.sent_bytes.max(1) as f64
    );
    for d in [&parent_dir, &child_dir] {
        let _ = std::fs::remove_file(d.join(branchbox_chunks::LOCAL_MANIFEST));
    }
}
