//! End-to-end: a real gVisor sandbox's snapshot pushed from one data directory to an S3
//! server (SeaweedFS on loopback), pulled into another data directory and restored there:
//! files and an in-memory counter continue (a peer named for the pull that is not there is
//! not asked, and the store serves every chunk). A snapshot whose fingerprint differs from the
//! host's is refused and nothing is recorded. With a manifest key, a signed snapshot pulls and
//! one whose manifest was changed in the bucket is refused. Skips (one line) when the weed
//! binary is missing.

mod common;
#[path = "../../chunks/tests/common/mod.rs"]
mod weed;

use branchbox_conformance::{ask_mark, set_mark};
use common::*;
use std::path::Path;

const URL: &str = "s3://snaps/e2e";

fn remote_cmd(w: &weed::Weed, dir: &Path, args: &[&str]) -> std::process::Output {
    remote_cmd_env(w, dir, args, &[])
}

fn remote_cmd_env(w: &weed::Weed, dir: &Path, args: &[&str], env: &[(&str, &Path)]) -> std::process::Output {
    bb_in(dir)
        .arg("--json")
        .arg("remote")
        .args(args)
        .env("BRANCHBOX_REMOTE", URL)
        .env("BRANCHBOX_S3_ENDPOINT", &w.endpoint)
        .env("AWS_ACCESS_KEY_ID", weed::KEY)
        .env("AWS_SECRET_ACCESS_KEY", weed::SECRET)
        .env("BRANCHBOX_NO_SERVICE", "1")
        .env("BRANCHBOX_PEER_TOKEN", "peer-token-0123456789")
        .envs(env.iter().copied())
        .output()
        .expect("run branchbox")
}

fn remote_ok(w: &weed::Weed, dir: &Path, args: &[&str]) -> serde_json::Value {
    let out = remote_cmd(w, dir, args);
    assert!(out.status.success(), "remote {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("json output")
}

#[test]
fn a_snapshot_pushed_from_one_data_directory_restores_in_another_with_files_and_memory() {
    let Some(w) = weed::Weed::start() else { return };
    let a = private_dir("remote-a");
    let b = private_dir("remote-b");
    let s = Sandbox::new_in(&a);
    put_text(&s, "/root/counter.py", COUNTER);
    ok_in(&a, &["spawn", &s.0, "--", "python3", "/root/counter.py"]);
    s.sh("head -c 3000000 /dev/urandom > /root/blob && sha256sum /root/blob > /root/blob.sum");
    set_mark(&s, "pushed");
    let before = ask_count(&s);
    let snap = ok_in(&a, &["snapshot", &s.0]).trim().to_string();

    let push = remote_ok(&w, &a, &["push", &snap]);
    assert_eq!(push["snapshot"], snap.as_str());
    let chunks = push["chunks"].as_u64().unwrap();
    assert!(chunks >= 1 && push["sent_chunks"].as_u64().unwrap() == chunks, "{push}");
    let sent = push["sent_bytes"].as_u64().unwrap();
    // A second push sends nothing.
    let again = remote_ok(&w, &a, &["push", &snap]);
    assert_eq!(again["sent_bytes"], 0, "{again}");
    assert_eq!(again["skipped_bytes"], sent, "{again}");

    // Named as the peer, a branchboxd that is not there: it is not asked (the token is sent
    // only to a peer that proves it holds it), and every chunk comes from the store.
    let pull = remote_ok(&w, &b, &["pull", &snap, "--peer", "http://127.0.0.1:1"]);
    assert_eq!(pull["snapshot"], snap.as_str());
    assert_eq!(pull["chunks"].as_u64().unwrap(), chunks);
    assert_eq!(pull["fetched_bytes"].as_u64().unwrap() + pull["reused_bytes"].as_u64().unwrap(), sent);
    assert_eq!(pull["s3_bytes"], pull["fetched_bytes"], "{pull}");
    assert_eq!(pull["peer_bytes"], 0, "{pull}");
    assert!(pull["peer_error"].as_str().unwrap_or("").contains("was not asked"), "{pull}");
    // Recorded under the same id, without the source sandbox (which lives elsewhere).
    let listed: serde_json::Value = serde_json::from_str(&ok_in(&b, &["--json", "snapshots"])).unwrap();
    let rec =
        listed.as_array().unwrap().iter().find(|r| r["id"] == snap.as_str()).expect("pulled snapshot listed");
    assert_eq!(rec["source"], serde_json::Value::Null);

    // Restored in B: the files, the same process, its memory (the mark), the count going on.
    let restored = Sandbox(ok_in(&b, &["restore", &snap]).trim().to_string(), b.clone());
    assert_eq!(restored.sh("sha256sum -c /root/blob.sum").trim(), "/root/blob: OK");
    assert_eq!(ask_mark(&restored), "pushed");
    assert!(ask_count(&restored) >= before);
    // And it forks there.
    let forked = ok_in(&b, &["fork", &restored.0]);
    let child = Sandbox(forked.lines().next().unwrap().trim().to_string(), b.clone());
    assert_eq!(ask_mark(&child), "pushed");

    // Pulling again reuses what is here.
    let twice = remote_ok(&w, &b, &["pull", &snap]);
    assert_eq!(twice["fetched_bytes"], 0, "{twice}");

    // Two pulls of it at once into a third data directory: both succeed, one record.
    let c = private_dir("remote-c");
    let outs: Vec<std::process::Output> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2).map(|_| scope.spawn(|| remote_cmd(&w, &c, &["pull", &snap]))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for o in &outs {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let listed: serde_json::Value = serde_json::from_str(&ok_in(&c, &["--json", "snapshots"])).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    let dirs: Vec<_> =
        std::fs::read_dir(c.join("snapshots")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(dirs, vec![std::ffi::OsString::from(&snap)]);
}

#[test]
fn a_snapshot_from_another_runsc_is_refused_and_nothing_is_recorded() {
    let Some(w) = weed::Weed::start() else { return };
    let a = private_dir("remote-fp-a");
    let b = private_dir("remote-fp-b");
    let s = Sandbox::new_in(&a);
    let snap = ok_in(&a, &["snapshot", &s.0]).trim().to_string();
    remote_ok(&w, &a, &["push", &snap]);
    // The same snapshot as if pushed from a host with another runsc, under a new id.
    let remote = w.remote(URL);
    let key = format!("manifests/{snap}.json");
    let mut m: serde_json::Value =
        serde_json::from_slice(&remote.get(&key, 1 << 20).unwrap().unwrap()).unwrap();
    let other = "snap-00000000000000ff";
    m["snapshot"]["id"] = other.into();
    m["fingerprint"]["runsc"] = "runsc version release-19990101.0".into();
    remote.put(&format!("manifests/{other}.json"), &serde_json::to_vec(&m).unwrap()).unwrap();

    let out = remote_cmd(&w, &b, &["pull", other]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot be restored on this host") && err.contains("release-19990101.0"), "{err}");
    assert!(!b.join("snapshots").join(other).exists());
    let listed = ok_in(&b, &["snapshots"]);
    assert!(!listed.contains(other), "{listed}");
    let tmp_left: Vec<_> = std::fs::read_dir(b.join("snapshots")).unwrap().flatten().collect();
    assert!(tmp_left.is_empty(), "left behind: {tmp_left:?}");

    // Removed from the store and swept: the chunks only it named are gone.
    let rm = remote_ok(&w, &a, &["rm", other]);
    assert_eq!(rm["removed"], other);
    let gc = remote_ok(&w, &a, &["gc"]);
    assert_eq!(gc["swept"], true, "{gc}");
    assert_eq!(gc["deleted_chunks"].as_array().unwrap().len(), 0, "{gc}");
    remote_ok(&w, &a, &["rm", &snap]);
    let gc = remote_ok(&w, &a, &["gc", "--dry-run"]);
    assert!(!gc["deleted_chunks"].as_array().unwrap().is_empty(), "{gc}");
    let gc = remote_ok(&w, &a, &["gc"]);
    assert_eq!(gc["manifests"], 0, "{gc}");
    assert!(remote.list("chunks/").unwrap().is_empty());

    // A snapshot that was never pushed is named as such.
    let out = remote_cmd(&w, &b, &["pull", "snap-00000000000000fe"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("never pushed"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn with_a_manifest_key_a_signed_snapshot_pulls_and_one_whose_manifest_was_changed_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let Some(w) = weed::Weed::start() else { return };
    let a = private_dir("remote-key-a");
    let b = private_dir("remote-key-b");
    let key = private_dir("remote-key").join("manifest.key");
    std::fs::write(&key, rand::random::<[u8; 32]>()).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let s = Sandbox::new_in(&a);
    s.sh("echo signed > /root/file");
    let snap = ok_in(&a, &["snapshot", &s.0]).trim().to_string();
    // Pushed with the key named by the flag.
    let key_arg = key.to_str().unwrap();
    remote_ok(&w, &a, &["push", &snap, "--manifest-key-file", key_arg]);

    // Someone who can write the bucket changes the manifest (the name the snapshot gets).
    let remote = w.remote(URL);
    let mkey = format!("manifests/{snap}.json");
    let genuine = remote.get(&mkey, 1 << 20).unwrap().unwrap();
    let mut m: serde_json::Value = serde_json::from_slice(&genuine).unwrap();
    m["snapshot"]["name"] = "planted".into();
    remote.put(&mkey, &serde_json::to_vec(&m).unwrap()).unwrap();
    // The puller has the key from its environment: refused before any chunk is read.
    let with_key = [("BRANCHBOX_MANIFEST_KEY_FILE", key.as_path())];
    let out = remote_cmd_env(&w, &b, &["pull", &snap], &with_key);
    assert!(!out.status.success(), "a changed manifest was pulled");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is refused") && err.contains("changed after it was signed"), "{err}");
    assert!(!b.join("snapshots").join(&snap).exists());
    assert!(!ok_in(&b, &["snapshots"]).contains(&snap));

    // The genuine manifest back: it pulls and restores.
    remote.put(&mkey, &genuine).unwrap();
    let out = remote_cmd_env(&w, &b, &["pull", &snap], &with_key);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let restored = Sandbox(ok_in(&b, &["restore", &snap]).trim().to_string(), b.clone());
    assert_eq!(restored.sh("cat /root/file").trim(), "signed");
}
