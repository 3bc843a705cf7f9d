//! End to end on gVisor: what a crash in the middle of a fork leaves is adopted or reaped on
//! the next command, gc reclaims fork points nothing reaches, names follow one rule, and
//! commands over several targets act on each.

mod common;

use common::*;
use std::collections::BTreeSet;
use std::path::Path;

fn ls_json(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&ok_in(dir, &["--json", "ls"])).expect("ls --json")
}

/// Pids of runsc or shim processes whose command line names `id`.
fn runtime_procs(id: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else { continue };
        let text = String::from_utf8_lossy(&cmd);
        let prog =
            text.split('\0').next().unwrap_or_default().rsplit('/').next().unwrap_or_default().to_string();
        if (prog.starts_with("runsc") || prog.starts_with("branchbox-shim")) && text.contains(id) {
            out.push(pid);
        }
    }
    out
}

#[test]
fn a_fork_killed_midway_leaves_each_child_adopted_or_gone() {
    let dir = private_dir("crashfork");
    // A template sandbox: an adopted child must keep the template's env as a recorded one does.
    let file = dir.join("t.toml");
    std::fs::write(&file, "name = \"crashfork\"\n[[steps]]\nenv = { GREETING = \"from-the-template\" }\n")
        .expect("template file");
    ok_in(&dir, &["template", "build", "-f", file.to_str().expect("utf-8 path")]);
    let src = Sandbox(ok_in(&dir, &["create", "--template", "crashfork"]).trim().to_string(), dir.clone());
    let boxes = dir.join("sandboxes");
    let mut cli = bb_in(&dir)
        .args(["fork", &src.0, "-n", "5"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn fork");
    // Children start four at a time, so a fifth shim means the first four were restored and
    // thawed but not yet recorded: the CLI records them all at the end.
    let started = |min: usize| {
        std::fs::read_dir(&boxes)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| {
                        e.file_name().to_string_lossy() != src.0 && e.path().join("shim.pid").is_file()
                    })
                    .count()
                    >= min
            })
            .unwrap_or(false)
    };
    // Polled tightly, so the kill most often lands while the fifth child is still restoring
    // (it must then be reaped); either way each child must end up listed or gone.
    let mut polls = 0;
    while !started(5) && polls < 30_000 {
        std::thread::sleep(std::time::Duration::from_millis(2));
        polls += 1;
    }
    cli.kill().expect("SIGKILL the fork");
    cli.wait().expect("reap the fork");
    let children: BTreeSet<String> = std::fs::read_dir(&boxes)
        .expect("sandboxes dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| *n != src.0)
        .collect();
    assert!(started(1), "no child was started before the kill: {children:?}");

    let listed = ls_json(&dir);
    let listed: Vec<&serde_json::Value> = listed.as_array().expect("list").iter().collect();
    let mut adopted = 0;
    for id in &children {
        match listed.iter().find(|v| v["id"] == id.as_str()) {
            Some(v) => {
                assert_eq!(v["alive"], true, "adopted child {id} is not alive: {v}");
                assert!(v["parent_snapshot"].is_string(), "adopted child {id} has no fork point: {v}");
                let host = ok_in(&dir, &["exec", id, "hostname"]);
                assert_eq!(host.trim(), format!("bb-{}", &id[4..12]), "child {id} does not run as itself");
                let greeting = ok_in(&dir, &["exec", id, "--", "sh", "-c", "echo $GREETING"]);
                assert_eq!(
                    greeting.trim(),
                    "from-the-template",
                    "adopted child {id} lost the template's env"
                );
                adopted += 1;
            }
            None => {
                assert!(!boxes.join(id).exists(), "unlisted child {id} still has its directory");
                assert!(
                    runtime_procs(id).is_empty(),
                    "unlisted child {id} still runs: {:?}",
                    runtime_procs(id)
                );
            }
        }
    }
    assert!(adopted >= 1, "no thawed child was adopted (children: {children:?})");
    eprintln!("{adopted} of {} children adopted, the rest reaped", children.len());
    let audit = std::fs::read_to_string(dir.join("audit.log")).expect("audit.log");
    assert!(audit.contains("\"reconcile\""), "{audit}");
    let snaps = ok_in(&dir, &["snapshots"]);
    assert!(snaps.contains("fork_point"), "the fork point was not recorded: {snaps}");

    for v in listed {
        let id = v["id"].as_str().expect("id");
        if id != src.0 {
            ok_in(&dir, &["kill", id]);
            assert!(runtime_procs(id).is_empty(), "{id} still runs after kill");
        }
    }
}

#[test]
fn gc_frees_fork_points_nothing_reaches_but_never_named_ones() {
    let dir = private_dir("forkgc");
    let src = Sandbox::new_in(&dir);
    let keep = ok_in(&dir, &["snapshot", &src.0, "--name", "keep"]).trim().to_string();
    let fork = |dir: &Path| -> (String, String) {
        let v: serde_json::Value =
            serde_json::from_str(&ok_in(dir, &["--json", "fork", &src.0, "-n", "1"])).expect("fork json");
        (
            v["snapshot"]["id"].as_str().expect("fork point").to_string(),
            v["children"][0]["id"].as_str().expect("child").to_string(),
        )
    };
    let (pinned, first) = fork(&dir);
    ok_in(&dir, &["ref", "set", "pin", &pinned]);
    let (loose, second) = fork(&dir);
    ok_in(&dir, &["kill", &first, &second]);
    let before = ok_in(&dir, &["gc", "--dry-run", "--json"]);
    assert!(!before.contains(&loose), "the source still reaches {loose}: {before}");
    ok_in(&dir, &["kill", &src.0]);

    let r: serde_json::Value = serde_json::from_str(&ok_in(&dir, &["--json", "gc"])).expect("gc json");
    let freed: Vec<&str> =
        r["unreachable_fork_points"].as_array().expect("list").iter().filter_map(|v| v.as_str()).collect();
    assert_eq!(freed, vec![loose.as_str()], "{r}");
    assert!(r["freed_bytes"].as_u64().unwrap_or(0) > 0, "{r}");
    assert!(!dir.join("snapshots").join(&loose).exists());
    let left = ok_in(&dir, &["snapshots"]);
    assert!(left.contains(&keep) && left.contains(&pinned) && !left.contains(&loose), "{left}");

    // rmsnap over several targets deletes each one it can and reports the rest.
    let out = run_in(&dir, &["rmsnap", "no-such-snapshot", "pin"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-snapshot"));
    assert!(!ok_in(&dir, &["snapshots"]).contains(&pinned), "the snapshot behind pin was not deleted");
}

#[test]
fn path_like_and_id_shaped_names_are_refused_everywhere() {
    let cases: [&[&str]; 5] = [
        &["ref", "set", "../../etc/passwd", "snap-0123456789abcdef"],
        &["ref", "set", "a/b", "snap-0123456789abcdef"],
        &["ref", "set", "sbx-0123456789abcdef", "snap-0123456789abcdef"],
        &["snapshot", "sbx-0123456789abcdef", "--name", ".."],
        &["checkpoint", "sbx-0123456789abcdef", "--name", "with space"],
    ];
    for args in cases {
        let out = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?} was not refused as usage");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("invalid") && err.contains("128 bytes"), "{args:?}: {err}");
    }
    for args in [["restore", "../../etc/passwd"], ["rmsnap", ".."]] {
        let out = run(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("neither a snapshot id") && err.contains(args[1]), "{args:?}: {err}");
    }
}

#[test]
fn kill_acts_on_every_valid_target_and_caps_are_one_limit() {
    let b = Sandbox::new();
    let out = b.sh_output("true");
    assert!(out.status.success());
    let over = run(&["exec", &b.0, "--output-cap", "16777217", "--", "true"]);
    assert_eq!(over.status.code(), Some(1));
    let err = String::from_utf8_lossy(&over.stderr);
    assert!(err.contains("16777217") && err.contains("16777216"), "{err}");

    let out = run(&["kill", "sbx-0000000000000000", "not-an-id", &b.0]);
    assert_eq!(out.status.code(), Some(1), "a failed target must fail the command");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("sbx-0000000000000000") && err.contains("not-an-id"), "{err}");
    let ls = ok(&["ls"]);
    assert!(!ls.contains(&b.0), "B was left running: {ls}");
}
