//! Lineage: `log` and `ls --json` record where every sandbox and snapshot came from.

use branchbox_conformance::{Ctx, Shell};

pub fn log_and_ls_record_each_sandboxs_parent(c: &Ctx) {
    let s = c.create(&[]);
    let name = format!("tree-{}-{}", std::process::id(), c.backend().name());
    let cp = c.ok(&["checkpoint", &s.id, "--name", &name]).trim().to_string();
    let fork = c.json(&["fork", &s.id, "-n", "1"]);
    let kids: Vec<_> = fork["children"]
        .as_array()
        .unwrap_or_else(|| panic!("no children: {fork}"))
        .iter()
        .map(|k| c.adopt(k["id"].as_str().expect("a child's id")))
        .collect();
    let fp = fork["snapshot"]["id"].as_str().expect("the fork point").to_string();
    assert_eq!(
        fork["snapshot"]["parent"],
        cp.as_str(),
        "the fork point does not descend from the checkpoint"
    );
    let restored = c.adopt(&c.ok(&["restore", &cp]));
    assert_eq!(restored.sh("echo up").trim(), "up");

    let listed = c.json(&["ls"]);
    let parent = |id: &str| {
        let me = listed.as_array().and_then(|l| l.iter().find(|x| x["id"] == id));
        me.unwrap_or_else(|| panic!("{id} is not listed: {listed}"))["parent_snapshot"].clone()
    };
    for k in kids.iter().chain([&s]) {
        assert_eq!(parent(&k.id), fp.as_str(), "{} does not descend from the fork point", k.id);
    }
    assert_eq!(
        parent(&restored.id),
        cp.as_str(),
        "the restored sandbox does not descend from the checkpoint"
    );

    let forest = c.json(&["log"]);
    let root = forest
        .as_array()
        .and_then(|f| f.iter().find(|n| n["id"] == cp.as_str()))
        .unwrap_or_else(|| panic!("the checkpoint is not a root: {forest}"));
    let under = |node: &serde_json::Value| -> Vec<String> {
        let kids = node["children"].as_array().cloned().unwrap_or_default();
        kids.iter().filter_map(|n| n["id"].as_str().map(str::to_string)).collect()
    };
    let fp_node = root["children"]
        .as_array()
        .and_then(|l| l.iter().find(|n| n["id"] == fp.as_str()))
        .unwrap_or_else(|| panic!("the fork point is not under the checkpoint: {root}"));
    assert!(under(root).contains(&restored.id), "the restored sandbox is not under the checkpoint: {root}");
    for k in kids.iter().chain([&s]) {
        assert!(under(fp_node).contains(&k.id), "{} is not under the fork point: {fp_node}", k.id);
    }
    let text = c.ok(&["log"]);
    assert!(text.contains(&format!("{fp} fork_point")), "{text}");
}
