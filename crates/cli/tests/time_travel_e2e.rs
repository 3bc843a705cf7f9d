//! End-to-end: checkpoints, rollback in place, lineage, deletion rules, TTL/gc and crash safety
//! on real gVisor sandboxes.

mod common;

use common::*;
use std::collections::BTreeMap;

fn json(args: &[&str]) -> serde_json::Value {
    json_in(data_dir(), args)
}

fn json_in(dir: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let mut full = vec!["--json"];
    full.extend_from_slice(args);
    serde_json::from_str(&ok_in(dir, &full)).expect("json output")
}

fn start_counter(s: &Sandbox) {
    put_text(s, "/root/counter.py", COUNTER);
    ok_in(&s.1, &["spawn", &s.0, "--", "python3", "/root/counter.py"]);
}

#[test]
fn rollback_returns_files_memory_and_processes_to_the_checkpoint() {
    let s = Sandbox::new();
    start_counter(&s);
    s.sh("echo before > /root/f");
    let pid = counter_pid(&s);
    let at_checkpoint = ask_count(&s);
    let cp = ok(&["checkpoint", &s.0]).trim().to_string();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    s.sh("echo after > /root/f; touch /root/new");
    let before_rollback = ask_count(&s);
    s.sh(&format!("kill {pid}"));
    ok(&["rollback", &s.0, &cp]);
    assert_eq!(s.sh("cat /root/f").trim(), "before");
    assert!(!s.sh_output("test -e /root/new").status.success(), "a file from after the checkpoint survived");
    assert_eq!(counter_pid(&s), pid, "the killed process did not come back");
    let after = ask_count(&s);
    assert!(after >= at_checkpoint, "counter went below the checkpoint ({after} < {at_checkpoint})");
    assert!(after < before_rollback, "memory was not rolled back ({after} >= {before_rollback})");
    let v = json(&["ls"]);
    assert!(v
        .as_array()
        .unwrap()
        .iter()
        .any(|x| x["id"] == s.0.as_str() && x["parent_snapshot"] == cp.as_str()));
}

#[test]
fn a_failed_rollback_leaves_the_sandbox_as_it_was() {
    let s = Sandbox::new();
    start_counter(&s);
    let cp = ok(&["checkpoint", &s.0]).trim().to_string();
    s.sh("echo current > /root/f");
    let pid = counter_pid(&s);
    let img = data_dir().join("snapshots").join(&cp).join("checkpoint").join("checkpoint.img");
    let len = std::fs::metadata(&img).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&img).unwrap().set_len(len / 3).unwrap();
    let err = fails(&["rollback", &s.0, &cp]);
    assert!(err.contains("unchanged"), "{err}");
    assert_eq!(s.sh("cat /root/f").trim(), "current");
    assert_eq!(counter_pid(&s), pid);
    assert!(ask_count(&s) > 0);
}

#[test]
fn rollback_refuses_another_sandboxs_snapshot_and_unknown_ones() {
    let a = Sandbox::new();
    let b = Sandbox::new();
    let snap = ok(&["checkpoint", &a.0]).trim().to_string();
    assert!(fails(&["rollback", &b.0, &snap]).contains("restore"));
    assert!(fails(&["rollback", &b.0, "snap-0000000000000000"]).contains("not found"));
    assert_eq!(b.sh("echo fine").trim(), "fine");
}

#[test]
fn the_log_shows_checkpoints_forks_and_children_as_a_tree() {
    let s = Sandbox::new();
    let c1 = ok(&["checkpoint", &s.0, "--name", &format!("tree-{}", std::process::id())]).trim().to_string();
    let fork = json(&["fork", &s.0, "-n", "2"]);
    let kids: Vec<Sandbox> = fork["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Sandbox::adopt(c["id"].as_str().unwrap()))
        .collect();
    let fp = fork["snapshot"]["id"].as_str().unwrap().to_string();
    assert_eq!(
        fork["snapshot"]["parent"],
        c1.as_str(),
        "the fork point does not descend from the checkpoint"
    );
    let forest = json(&["log"]);
    let root =
        forest.as_array().unwrap().iter().find(|n| n["id"] == c1.as_str()).expect("checkpoint is a root");
    let fp_node = &root["children"][0];
    assert_eq!(fp_node["id"], fp.as_str());
    let leaves: Vec<&str> =
        fp_node["children"].as_array().unwrap().iter().filter_map(|n| n["id"].as_str()).collect();
    for k in kids.iter().map(|k| k.0.as_str()).chain([s.0.as_str()]) {
        assert!(leaves.contains(&k), "{k} is not under the fork point: {leaves:?}");
    }
    let text = ok(&["log"]);
    assert!(text.contains(&format!("└─ {fp} fork_point")), "{text}");
}

#[test]
fn deleting_a_snapshot_with_descendants_needs_cascade_and_keeps_the_lineage() {
    let s = Sandbox::new();
    let a = ok(&["checkpoint", &s.0]).trim().to_string();
    let b = ok(&["checkpoint", &s.0]).trim().to_string();
    let err = fails(&["rmsnap", &a]);
    assert!(err.contains("descendant") && err.contains(&b), "{err}");
    drop(Sandbox::adopt(&ok(&["restore", &a])));
    let deleted = json(&["rmsnap", &a, "--cascade"]);
    let ids: Vec<&str> = deleted["deleted"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
    assert!(ids.contains(&a.as_str()) && ids.contains(&b.as_str()), "{deleted}");
    assert!(!data_dir().join("snapshots").join(&a).exists());
    assert!(fails(&["restore", &b]).contains("deleted"));
    let snaps = json(&["snapshots"]);
    let tomb = snaps.as_array().unwrap().iter().find(|x| x["id"] == b.as_str()).expect("tombstone kept");
    assert!(tomb["deleted_ms"].is_i64());
    assert_eq!(s.sh("echo alive").trim(), "alive");
}

#[test]
fn expired_snapshots_are_collected_and_others_kept() {
    let dir = private_dir("ttl");
    let (a, b) = (Sandbox::new_in(&dir), Sandbox::new_in(&dir));
    let lone = ok_in(&dir, &["snapshot", &a.0, "--ttl", "1"]).trim().to_string();
    let chained = ok_in(&dir, &["snapshot", &b.0, "--ttl", "1"]).trim().to_string();
    let keep = ok_in(&dir, &["snapshot", &b.0]).trim().to_string();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let dry = json_in(&dir, &["gc", "--dry-run"]);
    let expired: Vec<&str> =
        dry["expired_snapshots"].as_array().unwrap().iter().filter_map(|x| x.as_str()).collect();
    assert!(expired.contains(&lone.as_str()) && expired.contains(&chained.as_str()), "{dry}");
    assert!(dir.join("snapshots").join(&lone).exists(), "a dry run deleted data");
    let r = json_in(&dir, &["gc"]);
    assert_eq!(r["expired_snapshots"], serde_json::json!([lone]), "{r}");
    assert_eq!(r["kept_with_descendants"], serde_json::json!([chained]), "{r}");
    assert!(!dir.join("snapshots").join(&lone).exists(), "expired data kept");
    let err = String::from_utf8_lossy(&run_in(&dir, &["restore", &lone]).stderr).into_owned();
    assert!(err.contains("deleted"), "{err}");
    let restored = Sandbox(ok_in(&dir, &["restore", &keep]).trim().to_string(), dir.clone());
    assert_eq!(restored.sh("echo ok").trim(), "ok");
}

#[test]
fn kill_9_mid_checkpoint_never_lists_a_half_written_snapshot() {
    let dir = private_dir("kill9");
    let s = Sandbox::new_in(&dir);
    start_counter(&s);
    let shim_pid = std::fs::read_to_string(dir.join("sandboxes").join(&s.0).join("shim.pid")).unwrap();
    let mut cli = bb_in(&dir).args(["checkpoint", &s.0]).spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(120));
    let _ = cli.kill();
    let _ = cli.wait();
    // Kill the shim too: the sandbox dies mid-checkpoint, the hardest case for the store.
    let _ = std::process::Command::new("kill").args(["-9", shim_pid.trim()]).status();
    let snaps = json_in(&dir, &["snapshots"]);
    for snap in snaps.as_array().unwrap() {
        let id = snap["id"].as_str().unwrap();
        assert!(
            dir.join("snapshots").join(id).join("checkpoint").join("checkpoint.img").is_file(),
            "listed snapshot {id} has no data"
        );
        assert_eq!(ok_in(&dir, &["restore", id]).trim().len(), 20, "listed snapshot {id} does not restore");
    }
    let gc = json_in(&dir, &["gc"]);
    assert!(gc["lost_sandboxes"].as_array().unwrap().iter().any(|x| x == s.0.as_str()), "{gc}");
    let listed = json_in(&dir, &["snapshots"]);
    let leftovers: Vec<String> = std::fs::read_dir(dir.join("snapshots"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !listed.as_array().unwrap().iter().any(|x| x["id"] == n.as_str()))
        .collect();
    assert!(leftovers.is_empty(), "gc left interrupted snapshot dirs: {leftovers:?}");
    for v in json_in(&dir, &["ls"]).as_array().unwrap() {
        ok_in(&dir, &["kill", v["id"].as_str().unwrap()]);
    }
    std::mem::forget(s);
}

#[test]
fn step_history_mode_makes_every_command_a_branch_point() {
    let s = Sandbox::new();
    ok(&["history", &s.0, "on"]);
    let mut steps = Vec::new();
    for i in 1..=3 {
        let out = run(&["--json", "exec", &s.0, "-s", "--", &format!("echo {i} >> /root/steps")]);
        assert!(out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        steps.push(v["checkpoint"].as_str().expect("a step checkpoint").to_string());
    }
    ok(&["history", &s.0, "off"]);
    let out: serde_json::Value =
        serde_json::from_slice(&run(&["--json", "exec", &s.0, "--", "true"]).stdout).unwrap();
    assert!(out["checkpoint"].is_null());
    ok(&["rollback", &s.0, &steps[0]]);
    assert_eq!(s.sh("cat /root/steps").trim(), "1");
    ok(&["rollback", &s.0, &steps[2]]);
    assert_eq!(s.sh("cat /root/steps").split_whitespace().collect::<Vec<_>>(), vec!["1", "2", "3"]);
}

#[test]
fn ten_branches_in_a_row_from_one_live_source_all_work() {
    let s = Sandbox::new();
    start_counter(&s);
    for i in 0..10 {
        s.sh(&format!("echo {i} > /root/round"));
        let v = json(&["fork", &s.0]);
        let kid = Sandbox::adopt(v["children"][0]["id"].as_str().expect("child"));
        assert_eq!(kid.sh("cat /root/round").trim(), i.to_string());
    }
    assert!(ask_count(&s) > 0, "the source stopped");
}

/// A seeded random walk of writes, checkpoints, rollbacks and forks over several sandboxes,
/// checked against a model after every step.
#[test]
fn random_walk_of_writes_checkpoints_rollbacks_and_forks_matches_a_model() {
    let mut seed: u64 = 0x005e_ed0f_b0c5;
    let mut next = move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let first = Sandbox::new();
    first.sh(": > /root/state");
    let mut boxes: Vec<(Sandbox, String)> = vec![(first, String::new())];
    let mut checkpoints: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for step in 0..24 {
        let i = next(boxes.len());
        let id = boxes[i].0 .0.clone();
        match next(4) {
            0 | 1 => {
                let token = format!("{step}.");
                boxes[i].0.sh(&format!("printf '{token}' >> /root/state"));
                boxes[i].1.push_str(&token);
            }
            2 => {
                let cp = ok(&["checkpoint", &id]).trim().to_string();
                checkpoints.entry(id).or_default().push((cp, boxes[i].1.clone()));
            }
            _ => match checkpoints.get(&id).filter(|c| !c.is_empty()) {
                Some(cps) if next(2) == 0 => {
                    let (cp, state) = cps[next(cps.len())].clone();
                    ok(&["rollback", &id, &cp]);
                    boxes[i].1 = state;
                }
                _ if boxes.len() < 4 => {
                    let v = json(&["fork", &id]);
                    let kid = Sandbox::adopt(v["children"][0]["id"].as_str().expect("child"));
                    let state = boxes[i].1.clone();
                    boxes.push((kid, state));
                }
                _ => {}
            },
        }
        for (b, expected) in &boxes {
            assert_eq!(
                &b.sh("cat /root/state"),
                expected,
                "sandbox {} diverged from the model at step {step}",
                b.0
            );
        }
    }
}

#[test]
fn diff_lists_files_added_changed_and_removed_between_snapshots() {
    let s = Sandbox::new();
    s.sh("echo keep > /root/same; echo old > /root/edit; echo bye > /root/gone");
    let a = ok(&["snapshot", &s.0]).trim().to_string();
    s.sh("echo new >> /root/edit; rm /root/gone; mkdir -p /srv/x; echo hi > /srv/x/new");
    let b = ok(&["snapshot", &s.0]).trim().to_string();
    let d = json(&["diff", &a, &b]);
    let list = |k: &str| -> Vec<String> {
        d[k].as_array().unwrap().iter().filter_map(|v| v.as_str()).map(str::to_string).collect()
    };
    assert_eq!(list("added"), vec!["/srv/x".to_string(), "/srv/x/new".to_string()]);
    assert_eq!(list("changed"), vec!["/root/edit".to_string()]);
    assert_eq!(list("removed"), vec!["/root/gone".to_string()]);
    let again = json(&["diff", &b, &a]);
    assert_eq!(again["added"], d["removed"], "the reverse diff is not the mirror image");
    assert!(fails(&["diff", &a, "snap-0000000000000000"]).contains("not found"));
}

#[test]
fn gc_running_beside_forks_and_snapshots_never_takes_their_work_in_progress() {
    let dir = private_dir("gcrace");
    let s = Sandbox::new_in(&dir);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (flag, gc_dir) = (std::sync::Arc::clone(&stop), dir.clone());
    let collector = std::thread::spawn(move || {
        while !flag.load(std::sync::atomic::Ordering::SeqCst) {
            ok_in(&gc_dir, &["gc"]);
        }
    });
    for _ in 0..3 {
        let v = json_in(&dir, &["fork", &s.0]);
        let kid = Sandbox(v["children"][0]["id"].as_str().expect("child").to_string(), dir.clone());
        assert_eq!(kid.sh("echo up").trim(), "up");
        let snap = ok_in(&dir, &["snapshot", &s.0]).trim().to_string();
        assert!(dir.join("snapshots").join(&snap).join("checkpoint").is_dir());
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    collector.join().expect("gc thread");
}
