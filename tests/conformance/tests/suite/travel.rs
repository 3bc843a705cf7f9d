//! Snapshot and restore, checkpoint and rollback: files, memory and processes travel together.

use branchbox_conformance::{ask, ask_count, ask_mark, counter_pid, set_mark, Ctx, Shell};

pub fn a_snapshot_restores_with_files_and_memory_after_its_source_is_gone(c: &Ctx) {
    let src = c.create(&[]);
    src.start_counter();
    src.sh("echo kept > /root/state");
    set_mark(&src, "snapped");
    let before = ask_count(&src);
    let pid = counter_pid(&src);
    let name = format!("keep-{}-{}", std::process::id(), c.backend().name());
    let snap = c.ok(&["snapshot", &src.id, "--name", &name]).trim().to_string();
    assert!(snap.starts_with("snap-"), "{snap}");
    set_mark(&src, "later");
    src.kill();
    assert!(c.ok(&["snapshots"]).contains(&snap));
    for by in [name.as_str(), snap.as_str()] {
        let r = c.adopt(&c.ok(&["restore", by]));
        assert_eq!(r.sh("cat /root/state").trim(), "kept", "restored by {by}");
        assert_eq!(counter_pid(&r), pid, "restored by {by}: the process is not the snapshot's");
        let (count, mark) = ask(&r);
        assert!(count >= before, "restored by {by}: the counter started over");
        assert_eq!(mark, "snapped", "restored by {by}: memory is not the snapshot's");
    }
}

pub fn rollback_returns_files_memory_and_processes_to_the_checkpoint(c: &Ctx) {
    let s = c.create(&[]);
    s.start_counter();
    s.sh("echo before > /root/f");
    let pid = counter_pid(&s);
    set_mark(&s, "before");
    let cp = c.ok(&["checkpoint", &s.id]).trim().to_string();
    s.sh("echo after > /root/f; touch /root/new");
    set_mark(&s, "after");
    assert_eq!(ask_mark(&s), "after");
    s.sh(&format!("kill {pid}"));
    c.ok(&["rollback", &s.id, &cp]);
    assert_eq!(s.sh("cat /root/f").trim(), "before");
    assert!(!s.sh_output("test -e /root/new").status.success(), "a file from after the checkpoint survived");
    assert_eq!(counter_pid(&s), pid, "the killed process did not come back");
    // The count goes on growing after the rollback, as fast as the host lets it, so the memory
    // is judged by the word the process held at the checkpoint.
    assert_eq!(ask_mark(&s), "before", "memory was not rolled back");
    // The same sandbox, now descending from the checkpoint.
    let listed = c.json(&["ls"]);
    let me = listed.as_array().and_then(|l| l.iter().find(|x| x["id"] == s.id.as_str()));
    assert_eq!(me.map(|x| &x["parent_snapshot"]), Some(&serde_json::json!(cp)), "{listed}");
}
