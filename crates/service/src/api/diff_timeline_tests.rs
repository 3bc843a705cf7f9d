//! The file diff and timeline routes in process: bad input is refused with typed errors
//! before any snapshot is touched, and what the listings and the store already know is
//! answered without starting a sandbox (records and listings are written here directly).

use crate::config::ServiceConfig;
use crate::state::AppState;
use axum::body::Body;
use axum::http::Request;
use axum::Router;
use branchbox_model::{
    BackendKind, Limits, Sandbox, SandboxId, SandboxState, Snapshot, SnapshotId, SnapshotKind,
};
use branchbox_protocol::{FileKind, FileStat};
use branchbox_store::{ExecStep, Store};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

fn app() -> (tempfile::TempDir, Router) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ServiceConfig::new(branchbox_core::Config::from_env(Some(dir.path())));
    let st = AppState::open(cfg, None).unwrap();
    (dir, crate::serve::router(st, Default::default()).0)
}

async fn get(r: &Router, uri: &str) -> (u16, Value) {
    let req = Request::builder().uri(uri).header("host", "127.0.0.1:7420").body(Body::empty()).unwrap();
    let resp = r.clone().oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

fn sandbox(history: bool) -> Sandbox {
    Sandbox {
        id: SandboxId::generate(),
        backend: BackendKind::Gvisor,
        image: "img-0123456789abcdef".into(),
        state: SandboxState::Running,
        created_ms: 1,
        parent_snapshot: None,
        limits: Limits::default(),
        history,
    }
}

fn snapshot(source: &SandboxId, parent: Option<&SnapshotId>, kind: SnapshotKind, at: i64) -> Snapshot {
    Snapshot {
        id: SnapshotId::generate(),
        parent: parent.cloned(),
        source: Some(source.clone()),
        backend: BackendKind::Gvisor,
        image: "img-0123456789abcdef".into(),
        kind,
        name: None,
        created_ms: at,
        size_bytes: 1,
        limits: Limits::default(),
        expires_ms: None,
        deleted_ms: None,
    }
}

fn file(name: &str, kind: FileKind, size: u64) -> FileStat {
    FileStat { name: name.into(), kind, size, mode: 0o644, mtime_ns: 1, owner: None, group: None }
}

/// Writes a snapshot's listing where the engine keeps it, so no sandbox is started for it.
fn listing(dir: &std::path::Path, snap: &SnapshotId, entries: &[FileStat]) {
    let d = dir.join("snapshots").join(snap.as_str());
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("manifest.json"), serde_json::to_vec(entries).unwrap()).unwrap();
}

#[tokio::test]
async fn the_file_diff_refuses_bad_input_with_typed_errors() {
    let (_d, r) = app();
    let base = "/v1/snapshots/snap-0000000000000001/diff/file";
    let long = format!("/{}", "a".repeat(5000));
    for (uri, status, code) in [
        (base.to_string(), 400, "bad_query"),
        (format!("{base}?path="), 422, "invalid_input"),
        (format!("{base}?path=etc/hosts"), 422, "invalid_input"),
        (format!("{base}?path=/etc/ho%00sts"), 422, "invalid_input"),
        (format!("{base}?path={long}"), 422, "invalid_input"),
        (format!("{base}?path=/etc/hosts&against=a%20b"), 400, "invalid_id"),
        ("/v1/snapshots/a%20b/diff/file?path=/etc/hosts".to_string(), 400, "invalid_id"),
        (format!("{base}?path=/etc/hosts"), 404, "not_found"),
        (format!("{base}?path=/etc/hosts&against=snap-0000000000000002"), 404, "not_found"),
    ] {
        let (got, body) = get(&r, &uri).await;
        assert_eq!((got, body["error"]["code"].as_str()), (status, Some(code)), "{uri}: {body}");
    }
}

#[tokio::test]
async fn the_file_diff_answers_from_the_listings_without_starting_a_snapshot() {
    let (d, r) = app();
    let store = Store::open(&d.path().join("meta.db")).unwrap();
    let sb = sandbox(false);
    store.insert_sandbox(&sb).unwrap();
    let a = snapshot(&sb.id, None, SnapshotKind::Checkpoint, 10);
    let b = snapshot(&sb.id, Some(&a.id), SnapshotKind::Checkpoint, 20);
    for s in [&a, &b] {
        store.insert_snapshot(s).unwrap();
    }
    let big = branchbox_core::diff::MAX_TEXT_BYTES + 1;
    listing(d.path(), &a.id, &[file("/root/big", FileKind::File, big), file("/root/d", FileKind::Dir, 0)]);
    listing(
        d.path(),
        &b.id,
        &[file("/root/big", FileKind::File, big + 5), file("/root/d", FileKind::Symlink, 4)],
    );
    let uri = |path: &str| format!("/v1/snapshots/{}/diff/file?path={path}", b.id);
    let (status, big_diff) = get(&r, &uri("/root/big")).await;
    assert_eq!(status, 200, "{big_diff}");
    assert_eq!(
        (big_diff["from"].as_str(), big_diff["to"].as_str()),
        (Some(a.id.as_str()), Some(b.id.as_str()))
    );
    assert_eq!(big_diff["old"], serde_json::json!({"state": "too_large", "size": big}));
    assert_eq!(big_diff["new"], serde_json::json!({"state": "too_large", "size": big + 5}));
    assert_eq!(
        (big_diff["unified"].clone(), big_diff["identical"].clone()),
        (Value::Null, Value::Bool(false))
    );
    let (_, link) = get(&r, &uri("/root/d")).await;
    assert_eq!(
        (link["old"]["state"].as_str(), link["new"]["state"].as_str()),
        (Some("not_regular"), Some("not_regular"))
    );
    let (_, gone) = get(&r, &uri("/root/none")).await;
    assert_eq!(
        (gone["old"]["state"].as_str(), gone["new"]["state"].as_str()),
        (Some("absent"), Some("absent"))
    );
    assert_eq!(gone["unified"], Value::Null);

    // Without a parent there is nothing to compare with unless `against` names one.
    let (status, body) = get(&r, &format!("/v1/snapshots/{}/diff/file?path=/root/big", a.id)).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("no_parent")));
    let (status, _) =
        get(&r, &format!("/v1/snapshots/{}/diff/file?path=/root/big&against={}", a.id, b.id)).await;
    assert_eq!(status, 200);
    // A deleted side has no files.
    store.tombstone_snapshot(&a.id, 30).unwrap();
    let (status, body) = get(&r, &uri("/root/big")).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("conflict")), "{body}");
}

#[tokio::test]
async fn the_timeline_lists_a_sandboxs_snapshots_in_order_with_their_steps() {
    let (d, r) = app();
    for (uri, status, code) in [
        ("/v1/sandboxes/nope/timeline", 400, "invalid_id"),
        ("/v1/sandboxes/sbx-0000000000000000/timeline", 404, "not_found"),
    ] {
        let (got, body) = get(&r, uri).await;
        assert_eq!((got, body["error"]["code"].as_str()), (status, Some(code)), "{uri}: {body}");
    }
    let store = Store::open(&d.path().join("meta.db")).unwrap();
    let (sb, other) = (sandbox(true), sandbox(false));
    store.insert_sandbox(&sb).unwrap();
    store.insert_sandbox(&other).unwrap();
    let first = snapshot(&sb.id, None, SnapshotKind::Checkpoint, 10);
    let named = Snapshot {
        name: Some("by-hand".into()),
        ..snapshot(&sb.id, Some(&first.id), SnapshotKind::Snapshot, 20)
    };
    let second = snapshot(&sb.id, Some(&named.id), SnapshotKind::Checkpoint, 30);
    let elsewhere = snapshot(&other.id, None, SnapshotKind::Checkpoint, 15);
    // Inserted out of order: the timeline orders by time.
    for s in [&second, &elsewhere, &first, &named] {
        store.insert_snapshot(s).unwrap();
    }
    store.set_parent(&sb.id, &first.id).unwrap();
    let step = |snap: &Snapshot, command: &str, code: i32| ExecStep {
        snapshot: snap.id.clone(),
        sandbox: sb.id.clone(),
        command: command.into(),
        exit_code: Some(code),
        signal: None,
        duration_ms: 5,
        ended_ms: snap.created_ms,
    };
    store.insert_step(&step(&second, "false", 1)).unwrap();
    store.insert_step(&step(&first, "echo one > /root/one", 0)).unwrap();

    let (status, t) = get(&r, &format!("/v1/sandboxes/{}/timeline", sb.id)).await;
    assert_eq!(status, 200, "{t}");
    assert_eq!((t["sandbox"].as_str(), t["history"].as_bool()), (Some(sb.id.as_str()), Some(true)));
    assert_eq!(t["current"].as_str(), Some(first.id.as_str()), "the sandbox's place after a rollback");
    let entries = t["entries"].as_array().unwrap();
    let ids: Vec<&str> = entries.iter().map(|e| e["snapshot"]["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [first.id.as_str(), named.id.as_str(), second.id.as_str()]);
    assert_eq!(entries[0]["step"]["command"], "echo one > /root/one");
    assert_eq!(entries[0]["step"]["exit_code"], 0);
    assert_eq!(entries[1]["step"], Value::Null, "a snapshot taken by hand has no step");
    assert_eq!(entries[1]["snapshot"]["name"], "by-hand");
    assert_eq!(
        (entries[2]["step"]["command"].as_str(), entries[2]["step"]["exit_code"].as_i64()),
        (Some("false"), Some(1))
    );
    let (_, t) = get(&r, &format!("/v1/sandboxes/{}/timeline", other.id)).await;
    assert_eq!((t["history"].as_bool(), t["entries"].as_array().unwrap().len()), (Some(false), 1));
}
