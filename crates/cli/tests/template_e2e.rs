//! End-to-end: templates on real gVisor sandboxes. The step cache is reused and an edit
//! re-runs only what follows it, a failed step keeps its log and the earlier cache, a
//! Dockerfile subset builds into a sandbox that runs its program, template sandboxes get the
//! template's env, workdir and user, and cached steps are held against `rmsnap` and `gc` until
//! `template rm`.

mod common;

use common::*;
use std::path::Path;

fn json_in(dir: &Path, args: &[&str]) -> serde_json::Value {
    let mut full = vec!["--json"];
    full.extend_from_slice(args);
    serde_json::from_str(&ok_in(dir, &full)).expect("json output")
}

/// Builds; returns (record, stderr).
fn build(dir: &Path, args: &[&str]) -> (serde_json::Value, String) {
    let mut full = vec!["--json", "template", "build"];
    full.extend_from_slice(args);
    let out = run_in(dir, &full);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "template build {args:?} failed: {err}");
    (serde_json::from_slice(&out.stdout).expect("json record"), err)
}

fn snaps(record: &serde_json::Value) -> Vec<String> {
    record["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| s["snapshot"].as_str().unwrap_or("none").to_string())
        .collect()
}

/// A sandbox of template `name`, killed when dropped.
fn from_template(dir: &Path, name: &str) -> Sandbox {
    Sandbox(ok_in(dir, &["create", "--template", name]).trim().to_string(), dir.to_path_buf())
}

fn ctx_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let ctx = tempfile::tempdir().expect("context dir");
    for (p, text) in files {
        let path = ctx.path().join(p);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }
    ctx
}

const THREE_STEPS: &str = r#"
name = "cache"
[[steps]]
run = "echo s1 >> /steps; head -c8 /dev/urandom | od -An -tx1 > /stamp1"
[[steps]]
run = "echo s2 >> /steps; head -c8 /dev/urandom | od -An -tx1 > /stamp2"
[[steps]]
run = "echo s3 >> /steps; head -c8 /dev/urandom | od -An -tx1 > /stamp3"
"#;

#[test]
fn the_cache_is_reused_and_an_edit_reruns_only_what_follows_it() {
    let dir = private_dir("tpl-cache");
    let ctx = ctx_with(&[("t.toml", THREE_STEPS)]);
    let file = ctx.path().join("t.toml");
    let file = file.to_str().expect("utf-8 path");
    let (first, err) = build(&dir, &["-f", file]);
    assert!(!err.contains("(cached)"), "a first build found a cache: {err}");
    let first_ids = snaps(&first);
    let stamps = |s: &Sandbox| s.sh("cat /steps /stamp1 /stamp2 /stamp3");
    let before = stamps(&from_template(&dir, "cache"));

    // Unchanged: no step runs; every step reports the cache and keeps its snapshot.
    let (second, err) = build(&dir, &["-f", file]);
    assert_eq!(snaps(&second), first_ids);
    assert_eq!(err.matches("(cached)").count(), 4, "{err}");
    assert!(second["steps"].as_array().expect("steps").iter().all(|s| s["cached"] == true));
    assert_eq!(stamps(&from_template(&dir, "cache")), before, "a cached build changed the result");

    // Step 2 edited: step 1 keeps its snapshot, 2 and 3 run again (new stamps), once each.
    std::fs::write(ctx.path().join("t.toml"), THREE_STEPS.replace("echo s2", "echo S2")).expect("edit");
    let (third, err) = build(&dir, &["-f", file]);
    let ids = snaps(&third);
    assert_eq!(ids[0], first_ids[0], "step 1 was re-run: {err}");
    assert_ne!(ids[1], first_ids[1]);
    assert_ne!(ids[2], first_ids[2]);
    assert!(err.contains("step 1/3: run echo s1") && err.contains("(cached)"), "{err}");
    let after = stamps(&from_template(&dir, "cache"));
    let (old, new): (Vec<&str>, Vec<&str>) = (before.lines().collect(), after.lines().collect());
    assert_eq!(new[..3], ["s1", "S2", "s3"], "{after}");
    assert_eq!(old[3], new[3], "step 1's stamp changed: it ran again");
    assert_ne!(old[4], new[4], "step 2 did not run again");
    assert_ne!(old[5], new[5], "step 3 did not run again");
    ok_in(&dir, &["template", "rm", "cache"]);
}

#[test]
fn a_failed_step_keeps_its_log_and_the_cache_before_it() {
    let dir = private_dir("tpl-fail");
    let good = "name = \"flaky\"\n[[steps]]\nrun = \"echo one > /one\"\n";
    let ctx = ctx_with(&[("t.toml", &format!("{good}[[steps]]\nrun = \"echo boom-output; exit 7\"\n"))]);
    let file = ctx.path().join("t.toml");
    let file = file.to_str().expect("utf-8 path");
    let out = run_in(&dir, &["template", "build", "-f", file]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("step 2/2") && err.contains("exited with code 7"), "{err}");
    let log = ok_in(&dir, &["template", "log", "flaky"]);
    assert!(log.contains("boom-output") && log.contains("step 2/2"), "{log}");
    let failed = &json_in(&dir, &["template", "ls"])[0];
    assert_eq!(failed["status"]["state"], "failed");
    assert_eq!(failed["status"]["exit_code"], 7);
    let step1 = failed["steps"][0]["snapshot"].as_str().expect("step 1 cached").to_string();
    assert!(run_in(&dir, &["create", "--template", "flaky"]).status.code() != Some(0));

    std::fs::write(ctx.path().join("t.toml"), format!("{good}[[steps]]\nrun = \"echo two > /two\"\n"))
        .expect("fix");
    let (fixed, err) = build(&dir, &["-f", file]);
    assert_eq!(snaps(&fixed)[0], step1, "the failure lost step 1's cache: {err}");
    assert_eq!(fixed["steps"][0]["cached"], true);
    let s = from_template(&dir, "flaky");
    assert_eq!(s.sh("cat /one /two"), "one\ntwo\n");
}

#[test]
fn a_dockerfile_builds_into_a_sandbox_with_its_env_workdir_and_user() {
    let dir = private_dir("tpl-docker");
    let ctx = ctx_with(&[
        (
            "app/prog.py",
            "import os, pwd\nprint('prog', os.environ['MODE'], os.getcwd(), pwd.getpwuid(os.getuid()).pw_name)\n",
        ),
        ("app/data/input.txt", "forty-two\n"),
        (
            "Dockerfile",
            "# a comment\nFROM default\nRUN useradd -m worker\nCOPY app /opt/app\nWORKDIR /opt/app\n\
             ENV MODE=docker OTHER=\"two words\"\nUSER worker\nRUN [\"python3\", \"prog.py\"]\n",
        ),
    ]);
    let file = ctx.path().join("Dockerfile");
    let (_, err) = build(&dir, &["web", "-f", file.to_str().expect("utf-8 path")]);
    assert!(
        err.contains("prog docker /opt/app worker"),
        "the RUN step did not see env, workdir and user: {err}"
    );
    let s = from_template(&dir, "web");
    // A relative program path: the workdir applies to the sandbox's commands too.
    assert_eq!(s.sh("python3 prog.py 2>/dev/null"), "prog docker /opt/app worker\n");
    assert_eq!(
        s.sh("echo \"$OTHER\"; cat data/input.txt; id -un 2>/dev/null"),
        "two words\nforty-two\nworker\n"
    );
    // An exec's own env and cwd win over the template's.
    let own = ok_in(&dir, &["exec", &s.0, "-e", "MODE=mine", "--cwd", "/", "-s", "--", "echo $MODE; pwd"]);
    assert_eq!(own, "mine\n/\n");
    // Snapshots, restores and forks of a template sandbox keep its defaults.
    let snap = ok_in(&dir, &["snapshot", &s.0]).trim().to_string();
    let restored = Sandbox(ok_in(&dir, &["restore", &snap]).trim().to_string(), dir.clone());
    assert_eq!(restored.sh("echo $MODE; pwd"), "docker\n/opt/app\n");
    let forked = Sandbox(ok_in(&dir, &["fork", &s.0]).trim().to_string(), dir.clone());
    assert_eq!(forked.sh("echo $MODE; pwd"), "docker\n/opt/app\n");

    let bad = ctx_with(&[("Dockerfile", "FROM default\nADD x /x\n")]);
    let out = run_in(
        &dir,
        &["template", "build", "nope", "-f", bad.path().join("Dockerfile").to_str().unwrap_or("")],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("line 2: ADD is not supported"), "{err}");
}

#[test]
fn cached_steps_are_held_against_rmsnap_and_gc_until_template_rm() {
    let dir = private_dir("tpl-hold");
    let ctx = ctx_with(&[("t.toml", "name = \"held\"\n[[steps]]\nrun = \"echo x > /x\"\n")]);
    let (record, _) = build(&dir, &["-f", ctx.path().join("t.toml").to_str().expect("utf-8 path")]);
    let step = snaps(&record)[0].clone();
    let err = String::from_utf8_lossy(&run_in(&dir, &["rmsnap", &step]).stderr).into_owned();
    assert!(err.contains("cached step of template(s) held"), "{err}");
    ok_in(&dir, &["gc"]);
    assert!(ok_in(&dir, &["snapshots"]).contains(&step), "gc collected a template's step");
    ok_in(&dir, &["template", "rm", "held"]);
    assert!(!ok_in(&dir, &["snapshots"]).contains(&step), "template rm left its step snapshot");
    assert!(json_in(&dir, &["template", "ls"]).as_array().expect("list").is_empty());
}
