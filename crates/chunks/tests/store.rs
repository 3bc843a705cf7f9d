//! Push, pull and gc against real S3 servers, each test against each of SeaweedFS and moto's
//! server on loopback (`common::servers`): dedup against a pushed parent, a corrupted chunk
//! refused, an interrupted push completed by the next, gc keeping what manifests name and
//! respecting leases, a pull from a peer first and the store when the peer fails, signed
//! manifests checked against the fleet key; and the S3 requests themselves: a bucket created by
//! the first push (in us-east-1 and elsewhere), multipart uploads, listings and deletes, and
//! the errors of a missing bucket and of wrong credentials.

mod common;

use common::{fingerprint, record};

use branchbox_chunks::manifest::chunk_key;
use branchbox_chunks::peer::{read_held_chunk, ChunkSource, HeldError};
use branchbox_chunks::s3::Remote;
use branchbox_chunks::{
    fetch_manifest, gc, materialize, materialize_from, push, Error, LocalChunks, Progress,
};
use branchbox_model::SnapshotId;
use rand::{Rng, SeedableRng};
use std::cell::Cell;
use std::ops::ControlFlow;
use std::path::Path;

/// A snapshot-like directory: `checkpoint/pages.img` of `mib` MiB of seeded random bytes and a
/// small `checkpoint/checkpoint.img`.
fn make_snapshot(dir: &Path, seed: u64, mib: usize) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut pages = vec![0u8; mib << 20];
    rng.fill(&mut pages[..]);
    write_snapshot(dir, &pages);
    pages
}

fn write_snapshot(dir: &Path, pages: &[u8]) {
    std::fs::create_dir_all(dir.join("checkpoint")).unwrap();
    std::fs::write(dir.join("checkpoint/pages.img"), pages).unwrap();
    std::fs::write(dir.join("checkpoint/checkpoint.img"), b"state").unwrap();
}

fn go(_: Progress) -> ControlFlow<()> {
    ControlFlow::Continue(())
}

fn pull_to(remote: &Remote, id: &SnapshotId, dest: &Path) -> Result<branchbox_chunks::PullReport, Error> {
    let m = fetch_manifest(remote, id)?;
    materialize(remote, &m, dest, &LocalChunks::default(), &mut |_| {})
}

#[test]
fn a_pushed_snapshot_pulls_back_byte_for_byte_and_a_child_sends_only_what_changed() {
    for server in common::servers() {
        let remote = server.remote("s3://snaps/fleet-a");
        let tmp = tempfile::tempdir().unwrap();
        let a = tmp.path().join("a");
        let pages = make_snapshot(&a, 1, 24);
        let parent = record(None);
        let r1 = push(&remote, &a, &parent, fingerprint(), &mut go).unwrap();
        assert_eq!(r1.sent_bytes, pages.len() as u64 + 5, "the first push sends everything");
        assert_eq!(r1.sent_chunks, r1.chunks);

        // The child: the parent's memory with 100 KiB inserted near the start and a page changed
        // later on (content moves, as in a real checkpoint image).
        let mut child_pages = pages[..3 << 20].to_vec();
        child_pages.extend(std::iter::repeat_n(7u8, 100 << 10));
        child_pages.extend_from_slice(&pages[3 << 20..]);
        child_pages[20 << 20] ^= 0xff;
        let b = tmp.path().join("b");
        write_snapshot(&b, &child_pages);
        let child = record(Some(parent.id.clone()));
        let r2 = push(&remote, &b, &child, fingerprint(), &mut go).unwrap();
        let total = child_pages.len() as u64 + 5;
        assert_eq!(r2.sent_bytes + r2.skipped_bytes, total);
        let ratio = total as f64 / r2.sent_bytes as f64;
        eprintln!(
            "dedup: child of {:.1} MiB sent {:.1} MiB ({} of {} chunks), ratio {ratio:.1}",
            total as f64 / 1048576.0,
            r2.sent_bytes as f64 / 1048576.0,
            r2.sent_chunks,
            r2.chunks
        );
        assert!(r2.sent_bytes * 3 < total, "a child sent {} of {total} bytes", r2.sent_bytes);

        // Pulled elsewhere: the same bytes; the second pull reuses the first's chunks.
        let here = tmp.path().join("here");
        std::fs::create_dir(&here).unwrap();
        let p1 = pull_to(&remote, &parent.id, &here.join("p")).unwrap();
        assert_eq!(p1.fetched_bytes, r1.sent_bytes);
        assert_eq!(std::fs::read(here.join("p/checkpoint/pages.img")).unwrap(), pages);
        let m2 = fetch_manifest(&remote, &child.id).unwrap();
        assert_eq!(m2.snapshot, child);
        let p2 = materialize(&remote, &m2, &here.join("c"), &LocalChunks::scan(&here), &mut |_| {}).unwrap();
        assert_eq!(std::fs::read(here.join("c/checkpoint/pages.img")).unwrap(), child_pages);
        assert!(p2.reused_bytes > 0 && p2.fetched_bytes < total / 3, "{p2:?}");

        // Pushing again sends nothing.
        let r3 = push(&remote, &b, &child, fingerprint(), &mut go).unwrap();
        assert_eq!(r3.sent_bytes, 0);
    }
}

#[test]
fn a_corrupted_chunk_is_refused_and_nothing_is_left() {
    for server in common::servers() {
        let remote = server.remote("s3://snaps");
        let tmp = tempfile::tempdir().unwrap();
        make_snapshot(&tmp.path().join("a"), 2, 6);
        let snap = record(None);
        push(&remote, &tmp.path().join("a"), &snap, fingerprint(), &mut go).unwrap();
        let m = fetch_manifest(&remote, &snap.id).unwrap();
        let victim = m.files.iter().find(|f| f.path == "checkpoint/pages.img").unwrap().chunks[1].clone();
        let mut bytes = remote.get(&chunk_key(&victim.hash), 8 << 20).unwrap().unwrap();
        bytes[1000] ^= 1;
        remote.put(&chunk_key(&victim.hash), &bytes).unwrap();

        let dest = tmp.path().join("pulled");
        let err = pull_to(&remote, &snap.id, &dest).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::Corrupt { .. }), "{msg}");
        assert!(msg.contains(&victim.hash) && msg.contains(snap.id.as_str()), "{msg}");
        assert!(!dest.exists(), "a refused pull left {}", dest.display());

        // A missing chunk is refused by name too.
        remote.delete(&chunk_key(&victim.hash)).unwrap();
        let err = pull_to(&remote, &snap.id, &dest).unwrap_err();
        assert!(matches!(err, Error::Missing { ref hash, .. } if *hash == victim.hash), "{err}");
    }
}

#[test]
fn an_interrupted_push_leaves_no_manifest_and_the_next_sends_only_the_rest() {
    for server in common::servers() {
        let remote = server.remote("s3://snaps/p");
        let tmp = tempfile::tempdir().unwrap();
        let a = tmp.path().join("a");
        make_snapshot(&a, 3, 20);
        let snap = record(None);
        let k = 3;
        let err = push(&remote, &a, &snap, fingerprint(), &mut |p| {
            if p.chunks >= k {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap_err();
        assert!(matches!(err, Error::Stopped(n) if n == k), "{err}");
        assert!(matches!(fetch_manifest(&remote, &snap.id), Err(Error::NotFound(_))));
        assert!(!a.join(branchbox_chunks::LOCAL_MANIFEST).exists());
        let sent_before: u64 = remote.list("chunks/").unwrap().iter().map(|c| c.size).sum();
        assert_eq!(remote.list("chunks/").unwrap().len(), k);

        let r = push(&remote, &a, &snap, fingerprint(), &mut go).unwrap();
        assert_eq!(r.sent_chunks, r.chunks - k, "{r:?}");
        assert_eq!(r.skipped_bytes, sent_before);
        fetch_manifest(&remote, &snap.id).unwrap();
    }
}

#[test]
fn gc_sweeps_unreferenced_chunks_keeps_referenced_ones_and_waits_for_leases() {
    for server in common::servers() {
        let remote = server.remote("s3://snaps");
        let tmp = tempfile::tempdir().unwrap();
        make_snapshot(&tmp.path().join("kept"), 4, 8);
        let kept = record(None);
        push(&remote, &tmp.path().join("kept"), &kept, fingerprint(), &mut go).unwrap();
        // An interrupted push of another snapshot: its new chunks are named by no manifest (its
        // first, checkpoint.img, is the kept snapshot's too; then two of its own).
        make_snapshot(&tmp.path().join("gone"), 5, 8);
        let _ = push(&remote, &tmp.path().join("gone"), &record(None), fingerprint(), &mut |p| {
            if p.chunks >= 3 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        let before = remote.list("chunks/").unwrap().len();
        let referenced = fetch_manifest(&remote, &kept.id)
            .unwrap()
            .files
            .iter()
            .flat_map(|f| f.chunks.iter().map(|c| c.hash.clone()))
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        assert_eq!(before, referenced + 2);

        // A live lease (a push or pull elsewhere): nothing is swept.
        let lease = branchbox_chunks::lease::LeaseRecord {
            kind: branchbox_chunks::lease::LeaseKind::Pull,
            snapshot: None,
            expires_ms: i64::MAX,
        };
        remote.put("leases/other.json", &serde_json::to_vec(&lease).unwrap()).unwrap();
        let r = gc(&remote, false).unwrap();
        assert!(!r.swept && r.live_leases == 1 && r.deleted_chunks.is_empty(), "{r:?}");
        assert_eq!(remote.list("chunks/").unwrap().len(), before);

        // An expired one does not hold it back, and gc removes it.
        let expired = branchbox_chunks::lease::LeaseRecord { expires_ms: 1, ..lease };
        remote.put("leases/other.json", &serde_json::to_vec(&expired).unwrap()).unwrap();
        let dry = gc(&remote, true).unwrap();
        assert!(dry.swept && dry.deleted_chunks.len() == 2, "{dry:?}");
        assert_eq!(remote.list("chunks/").unwrap().len(), before, "a dry run deleted");
        let r = gc(&remote, false).unwrap();
        assert!(r.swept && r.deleted_chunks.len() == 2 && r.expired_leases == 1, "{r:?}");
        assert_eq!(r.manifests, 1);
        assert_eq!(remote.list("chunks/").unwrap().len(), referenced);
        assert!(remote.list("leases/").unwrap().is_empty());
        // What remains still pulls.
        pull_to(&remote, &kept.id, &tmp.path().join("pulled")).unwrap();

        // Its manifest removed, the next gc sweeps its chunks too.
        branchbox_chunks::remove(&remote, &kept.id).unwrap();
        assert!(matches!(branchbox_chunks::remove(&remote, &kept.id), Err(Error::NotFound(_))));
        let r = gc(&remote, false).unwrap();
        assert!(r.swept && r.manifests == 0 && r.deleted_chunks.len() == referenced, "{r:?}");
        assert!(remote.list("chunks/").unwrap().is_empty());
    }
}

/// A peer that serves chunks of the snapshot held in `dir` as branchboxd does
/// ([`read_held_chunk`]), the first `good` of them as they are, then fails; `flip` damages what
/// it sends.
struct TestPeer {
    dir: std::path::PathBuf,
    good: usize,
    flip: bool,
    asked: Cell<usize>,
}

impl ChunkSource for TestPeer {
    fn fetch(&self, snapshot: &SnapshotId, hash: &str, _size: u64) -> Result<Vec<u8>, Error> {
        self.asked.set(self.asked.get() + 1);
        if self.asked.get() > self.good {
            return Err(Error::Remote("peer went away".into()));
        }
        let mut d = read_held_chunk(&self.dir, snapshot, hash).map_err(|e| Error::Remote(e.to_string()))?;
        if self.flip {
            d[0] ^= 1;
        }
        Ok(d)
    }
}

#[test]
fn a_pull_takes_chunks_from_a_peer_first_and_from_the_store_once_the_peer_fails() {
    for server in common::servers() {
        let remote = server.remote("s3://snaps/peer");
        let tmp = tempfile::tempdir().unwrap();
        let a = tmp.path().join("a");
        let pages = make_snapshot(&a, 5, 12);
        let snap = record(None);
        let pushed = push(&remote, &a, &snap, fingerprint(), &mut go).unwrap();
        let total = pages.len() as u64 + 5;
        let m = fetch_manifest(&remote, &snap.id).unwrap();
        let peer = |good, flip| TestPeer { dir: a.clone(), good, flip, asked: Cell::new(0) };
        let pull = |p: &TestPeer, name: &str| {
            let dest = tmp.path().join(name);
            let r = materialize_from(
                &remote,
                Some(p as &dyn ChunkSource),
                &m,
                &dest,
                &LocalChunks::default(),
                &mut |_| {},
            )
            .unwrap();
            assert_eq!(std::fs::read(dest.join("checkpoint/pages.img")).unwrap(), pages, "{name}");
            assert_eq!(r.fetched_bytes, total, "{name}: {r:?}");
            assert_eq!(r.peer_bytes + r.s3_bytes, r.fetched_bytes, "{name}: {r:?}");
            r
        };

        // A peer that answers everything: nothing from the store.
        let all = pull(&peer(usize::MAX, false), "all");
        assert_eq!((all.peer_bytes, all.s3_bytes, all.peer_error.as_deref()), (total, 0, None));

        // One that answers three chunks and then fails: the rest from the store, and it is not
        // asked again after its failure.
        let p = peer(3, false);
        let some = pull(&p, "some");
        let first3: u64 = m.files.iter().flat_map(|f| &f.chunks).take(3).map(|c| c.size).sum();
        assert_eq!((some.peer_bytes, some.s3_bytes), (first3, total - first3), "{some:?}");
        assert!(some.peer_error.as_deref().unwrap().contains("peer went away"), "{some:?}");
        assert_eq!(p.asked.get(), 4);
        assert!(pushed.chunks > 4, "the test needs more chunks than the peer answers: {pushed:?}");

        // One that sends damaged chunks: none of its bytes are used.
        let bad = pull(&peer(usize::MAX, true), "bad");
        assert_eq!((bad.peer_bytes, bad.s3_bytes), (0, total));
        assert!(bad.peer_error.as_deref().unwrap().contains("hashes to"), "{bad:?}");
    }
}

#[test]
fn a_held_snapshot_serves_only_the_chunks_its_manifest_names_and_only_intact() {
    for server in common::servers() {
        let remote = server.remote("s3://snaps/held");
        let tmp = tempfile::tempdir().unwrap();
        let a = tmp.path().join("a");
        make_snapshot(&a, 6, 6);
        let snap = record(None);
        push(&remote, &a, &snap, fingerprint(), &mut go).unwrap();
        let m = fetch_manifest(&remote, &snap.id).unwrap();
        let pages = m.files.iter().find(|f| f.path == "checkpoint/pages.img").unwrap();
        let second = &pages.chunks[1];
        let got = read_held_chunk(&a, &snap.id, &second.hash).unwrap();
        assert_eq!(got.len() as u64, second.size);

        let other = record(None);
        assert!(matches!(read_held_chunk(&a, &other.id, &second.hash), Err(HeldError::Local(_))));
        assert!(matches!(
            read_held_chunk(&tmp.path().join("none"), &snap.id, &second.hash),
            Err(HeldError::NoSnapshot(_))
        ));
        for hash in ["0".repeat(64), "../../service/token".into(), second.hash.to_uppercase()] {
            assert!(
                matches!(read_held_chunk(&a, &snap.id, &hash), Err(HeldError::NotNamed { .. })),
                "{hash}"
            );
        }
        // A local copy that no longer hashes to its name is not served.
        let path = a.join("checkpoint/pages.img");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[pages.chunks[0].size as usize + 10] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let err = read_held_chunk(&a, &snap.id, &second.hash).unwrap_err();
        assert!(matches!(err, HeldError::Local(_)) && err.to_string().contains("damaged"), "{err}");
    }
}

#[test]
fn signed_manifests_pull_with_the_key_and_unsigned_tampered_or_foreign_ones_are_refused() {
    use branchbox_chunks::manifest::manifest_key;
    use branchbox_chunks::signing::{signature_key, ManifestKey};
    for server in common::servers() {
        let keyed = |secret: u8| {
            let mut cfg = server.config("s3://signed");
            cfg.manifest_key = Some(ManifestKey::new([secret; 32]));
            Remote::new(&cfg).unwrap()
        };
        let (fleet, other_fleet, keyless) = (keyed(1), keyed(2), server.remote("s3://signed"));
        let tmp = tempfile::tempdir().unwrap();
        make_snapshot(&tmp.path().join("a"), 7, 3);
        let snap = record(None);
        push(&fleet, &tmp.path().join("a"), &snap, fingerprint(), &mut go).unwrap();
        assert!(fleet.head(&signature_key(&snap.id)).unwrap().is_some(), "no signature was written");
        pull_to(&fleet, &snap.id, &tmp.path().join("with-key")).unwrap();
        // Without a key nothing is checked, as before.
        pull_to(&keyless, &snap.id, &tmp.path().join("without-key")).unwrap();
        // Pushed again with the key: the manifest there verifies, nothing is sent.
        assert_eq!(push(&fleet, &tmp.path().join("a"), &snap, fingerprint(), &mut go).unwrap().sent_bytes, 0);

        let refused = |remote: &Remote, id: &SnapshotId, why: &str| {
            let dest = tmp.path().join(format!("refused-{id}"));
            let err = pull_to(remote, id, &dest).unwrap_err();
            let msg = err.to_string();
            assert!(matches!(err, Error::Unauthentic { .. }) && msg.contains(why), "{msg}");
            assert!(!dest.exists(), "a refused pull left {}", dest.display());
        };
        // Another fleet's key.
        refused(&other_fleet, &snap.id, "another key");
        // One byte of the manifest changed in the bucket (the name it records), signature kept.
        let bytes = fleet.get(&manifest_key(&snap.id), 1 << 20).unwrap().unwrap();
        let mut m: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        m["snapshot"]["name"] = "planted".into();
        fleet.put(&manifest_key(&snap.id), &serde_json::to_vec(&m).unwrap()).unwrap();
        refused(&fleet, &snap.id, "changed after it was signed");
        // A manifest planted by someone who can write the bucket but has no key.
        make_snapshot(&tmp.path().join("b"), 8, 1);
        let planted = record(None);
        push(&keyless, &tmp.path().join("b"), &planted, fingerprint(), &mut go).unwrap();
        refused(&fleet, &planted.id, "not signed");
        // A push with the key does not bless it either.
        let err = push(&fleet, &tmp.path().join("b"), &planted, fingerprint(), &mut go).unwrap_err();
        assert!(matches!(err, Error::Unauthentic { .. }), "{err}");

        // Removing a snapshot removes its signature; gc sweeps a signature left without manifest.
        branchbox_chunks::remove(&fleet, &snap.id).unwrap();
        assert!(fleet.head(&signature_key(&snap.id)).unwrap().is_none());
        let orphan = SnapshotId::generate();
        fleet.put(&signature_key(&orphan), b"{}").unwrap();
        assert_eq!(gc(&fleet, true).unwrap().deleted_signatures, 1);
        let r = gc(&fleet, false).unwrap();
        assert_eq!((r.deleted_signatures, r.manifests), (1, 1), "{r:?}");
        assert!(fleet.head(&signature_key(&orphan)).unwrap().is_none());
    }
}

#[test]
fn the_first_push_creates_its_bucket_in_us_east_1_and_elsewhere() {
    for server in common::servers() {
        for (region, bucket) in [("us-east-1", "fresh"), ("eu-west-1", "fresh-eu")] {
            let mut cfg = server.config(&format!("s3://{bucket}/p"));
            cfg.region = region.into();
            let remote = Remote::new(&cfg).unwrap();
            let err = remote.list("chunks/").unwrap_err().to_string();
            assert!(err.contains(&format!("bucket {bucket:?} does not exist")), "{region}: {err}");
            let tmp = tempfile::tempdir().unwrap();
            let pages = make_snapshot(&tmp.path().join("a"), 9, 2);
            let snap = record(None);
            push(&remote, &tmp.path().join("a"), &snap, fingerprint(), &mut go).unwrap();
            pull_to(&remote, &snap.id, &tmp.path().join("pulled")).unwrap();
            assert_eq!(
                std::fs::read(tmp.path().join("pulled/checkpoint/pages.img")).unwrap(),
                pages,
                "{region}"
            );
            // Again, with the bucket there: nothing to create.
            remote.ensure_bucket().unwrap();
        }
    }
}

/// The ETag of an object, read with a HEAD of our own: a multipart upload's ends in `-PARTS`.
fn etag(server: &common::Server, bucket: &str, key: &str) -> String {
    use rusty_s3::S3Action;
    let endpoint = url::Url::parse(server.endpoint()).unwrap();
    let bucket =
        rusty_s3::Bucket::new(endpoint, rusty_s3::UrlStyle::Path, bucket.to_string(), "us-east-1").unwrap();
    let creds = rusty_s3::Credentials::new(common::KEY, common::SECRET);
    let url = bucket.head_object(Some(&creds), key).sign(std::time::Duration::from_secs(60));
    let resp = ureq::request_url("HEAD", &url).call().unwrap();
    resp.header("ETag").unwrap().trim_matches('"').to_string()
}

#[test]
fn a_body_over_the_part_size_goes_as_a_multipart_upload_and_reads_back_whole() {
    use branchbox_chunks::s3::MIN_PART_SIZE;
    for server in common::servers() {
        let remote = server.remote("s3://multi/p").with_part_size(MIN_PART_SIZE).unwrap();
        remote.ensure_bucket().unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(10);
        let mut big = vec![0u8; 2 * MIN_PART_SIZE + 12345];
        rng.fill(&mut big[..]);
        remote.put("big", &big).unwrap();
        assert_eq!(remote.head("big").unwrap(), Some(big.len() as u64));
        assert_eq!(remote.get("big", big.len() as u64).unwrap().unwrap(), big);
        let tag = etag(&server, "multi", "p/big");
        assert!(tag.ends_with("-3"), "{}: not a 3-part upload: ETag {tag}", server.name());
        // At the part size exactly: one PUT, an ETag without parts.
        remote.put("one", &big[..MIN_PART_SIZE]).unwrap();
        assert!(!etag(&server, "multi", "p/one").contains('-'), "{}", server.name());
        // A push through it: chunks stay under the part size and go whole.
        let tmp = tempfile::tempdir().unwrap();
        let pages = make_snapshot(&tmp.path().join("a"), 11, 6);
        let snap = record(None);
        push(&remote, &tmp.path().join("a"), &snap, fingerprint(), &mut go).unwrap();
        pull_to(&remote, &snap.id, &tmp.path().join("pulled")).unwrap();
        assert_eq!(std::fs::read(tmp.path().join("pulled/checkpoint/pages.img")).unwrap(), pages);
    }
}

#[test]
fn listings_give_keys_and_sizes_under_a_prefix_and_deletes_remove_them() {
    for server in common::servers() {
        let remote = server.remote("s3://listing/fleet");
        let other = server.remote("s3://listing/other");
        remote.ensure_bucket().unwrap();
        remote.put("chunks/aa", b"12345").unwrap();
        remote.put("chunks/bb", b"").unwrap();
        remote.put("manifests/m.json", b"{}").unwrap();
        other.put("chunks/cc", b"1").unwrap();
        let listed = |r: &Remote, prefix: &str| {
            let mut l: Vec<(String, u64)> =
                r.list(prefix).unwrap().into_iter().map(|o| (o.key, o.size)).collect();
            l.sort();
            l
        };
        assert_eq!(listed(&remote, "chunks/"), [("chunks/aa".to_string(), 5), ("chunks/bb".to_string(), 0)]);
        assert_eq!(listed(&remote, "").len(), 3);
        assert_eq!(listed(&other, ""), [("chunks/cc".to_string(), 1)]);
        assert_eq!(remote.head("chunks/bb").unwrap(), Some(0));
        assert_eq!(remote.get("chunks/bb", 10).unwrap().as_deref(), Some(&b""[..]));
        remote.delete("chunks/aa").unwrap();
        // Deleting what is not there is fine.
        remote.delete("chunks/aa").unwrap();
        assert_eq!(remote.head("chunks/aa").unwrap(), None);
        assert_eq!(remote.get("chunks/aa", 10).unwrap(), None);
        assert_eq!(listed(&remote, "chunks/"), [("chunks/bb".to_string(), 0)]);
        // A body over the caller's limit is refused.
        let err = remote.get("manifests/m.json", 1).unwrap_err();
        assert!(matches!(err, Error::Invalid(ref m) if m.contains("larger than the 1 bytes")), "{err}");
    }
}

#[test]
fn a_missing_bucket_is_named_and_no_request_says_its_signed_url() {
    for server in common::servers() {
        let remote = server.remote("s3://no-such-bucket/p");
        let id = record(None).id;
        let mut errors = vec![
            fetch_manifest(&remote, &id).unwrap_err(),
            remote.list("manifests/").unwrap_err(),
            remote.delete("chunks/x").unwrap_err(),
        ];
        // S3 refuses a PUT into a missing bucket, and so a gc, whose lease is the first thing it
        // writes (moto refuses them as AWS does; SeaweedFS makes the bucket instead).
        match (remote.put("chunks/x", b"x"), &server) {
            (Err(e), _) => errors.extend([e, gc(&remote, false).unwrap_err()]),
            (Ok(()), common::Server::Weed(_)) => {}
            (Ok(()), _) => panic!("{} took a PUT into a missing bucket", server.name()),
        }
        for err in errors {
            let msg = err.to_string();
            assert!(matches!(err, Error::Remote(_)), "{}: {msg}", server.name());
            assert!(
                msg.contains(
                    "in s3://no-such-bucket/p: bucket \"no-such-bucket\" does not exist at http://127.0.0.1:"
                ) && msg.contains("NoSuchBucket"),
                "{}: {msg}",
                server.name()
            );
            assert!(!msg.contains("X-Amz") && !msg.contains(common::KEY), "{msg}");
        }
    }
}

#[test]
fn wrong_credentials_are_told_apart_by_seaweedfs_which_checks_them() {
    // moto's server takes any credentials; SeaweedFS checks them against its identities.
    if let Some(weed) = common::Weed::start() {
        let server = common::Server::Weed(weed);
        server.remote("s3://creds").ensure_bucket().unwrap();
        let mut wrong_secret = server.config("s3://creds");
        wrong_secret.secret_key = "not-the-secret".into();
        let err = Remote::new(&wrong_secret).unwrap().put("x", b"x").unwrap_err().to_string();
        assert!(err.contains("SignatureDoesNotMatch") && err.contains("AWS_SECRET_ACCESS_KEY"), "{err}");
        let mut unknown = server.config("s3://creds");
        unknown.access_key = "nobody".into();
        let err = Remote::new(&unknown).unwrap().get("x", 10).unwrap_err().to_string();
        assert!(err.contains("InvalidAccessKeyId") && err.contains("AWS_ACCESS_KEY_ID"), "{err}");
        assert!(!err.contains("X-Amz") && !err.contains("nobody"), "{err}");
    }
}
