//! Fork: children continue from the source's running processes and memory, and what each
//! writes afterwards stays its own.

use branchbox_conformance::{ask, ask_count, ask_mark, counter_pid, set_mark, Ctx, Shell};
use std::collections::BTreeSet;

pub fn children_continue_the_running_process_and_keep_their_writes_apart(c: &Ctx) {
    let src = c.create(&[]);
    src.start_counter();
    set_mark(&src, "source");
    let before = ask_count(&src);
    let pid = counter_pid(&src);
    let v = c.json(&["fork", &src.id, "-n", "2"]);
    let kids: Vec<_> = v["children"]
        .as_array()
        .unwrap_or_else(|| panic!("no children: {v}"))
        .iter()
        .map(|k| {
            assert_eq!(k["ok"], true, "a child failed: {k}");
            c.adopt(k["id"].as_str().expect("a child's id"))
        })
        .collect();
    assert_eq!(kids.len(), 2);
    for (i, k) in kids.iter().enumerate() {
        assert_eq!(counter_pid(k), pid, "child {i}'s counting process is not the source's");
        let (count, mark) = ask(k);
        assert!(count >= before, "child {i} restarted its counter instead of continuing");
        assert_eq!(mark, "source", "child {i} does not have the source's memory");
        k.sh(&format!("echo child-{i} > /root/mine"));
        set_mark(k, &format!("child-{i}"));
    }
    for (i, k) in kids.iter().enumerate() {
        assert_eq!(k.sh("cat /root/mine").trim(), format!("child-{i}"), "child {i} saw another's file");
        assert_eq!(ask_mark(k), format!("child-{i}"), "child {i} saw another's memory");
    }
    assert!(!src.sh_output("test -e /root/mine").status.success(), "a child's file leaked into the source");
    let (count, mark) = ask(&src);
    assert_eq!(mark, "source", "a child's memory leaked into the source");
    assert!(count > before, "the source stopped counting");
    let ids: BTreeSet<String> = kids.iter().map(|k| k.sh("cat /etc/machine-id")).collect();
    assert_eq!(ids.len(), 2, "children share a machine-id");
    let hosts: BTreeSet<String> = kids.iter().map(|k| k.sh("hostname")).collect();
    assert_eq!(hosts.len(), 2, "children share a hostname");
}
