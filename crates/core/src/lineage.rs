//! The lineage tree: snapshots linked to their parents, and each sandbox hanging under the
//! snapshot its current state descends from.

use branchbox_model::{now_ms, Sandbox, Snapshot};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// One node of the tree.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Node {
    /// A snapshot and what descends from it.
    Snapshot {
        /// The snapshot.
        #[serde(flatten)]
        snapshot: Snapshot,
        /// Refs pointing at it.
        refs: Vec<String>,
        /// Descendants: snapshots first, then sandboxes, each oldest first.
        children: Vec<Node>,
    },
    /// A sandbox (always a leaf).
    Sandbox {
        /// The sandbox.
        #[serde(flatten)]
        sandbox: Sandbox,
    },
}

/// Builds the forest. Snapshots whose parent is unknown are roots, as are sandboxes that
/// descend from no snapshot.
pub fn build(snapshots: Vec<Snapshot>, sandboxes: Vec<Sandbox>, refs: Vec<(String, String)>) -> Vec<Node> {
    let known: BTreeSet<String> = snapshots.iter().map(|s| s.id.to_string()).collect();
    let mut refs_by: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, snap) in refs {
        refs_by.entry(snap).or_default().push(name);
    }
    let mut snap_kids: BTreeMap<Option<String>, Vec<Snapshot>> = BTreeMap::new();
    for s in snapshots {
        let parent = s.parent.as_ref().map(|p| p.to_string()).filter(|p| known.contains(p));
        snap_kids.entry(parent).or_default().push(s);
    }
    let mut box_kids: BTreeMap<Option<String>, Vec<Sandbox>> = BTreeMap::new();
    for b in sandboxes {
        let parent = b.parent_snapshot.as_ref().map(|p| p.to_string()).filter(|p| known.contains(p));
        box_kids.entry(parent).or_default().push(b);
    }
    fn grow(
        key: Option<String>,
        snap_kids: &mut BTreeMap<Option<String>, Vec<Snapshot>>,
        box_kids: &mut BTreeMap<Option<String>, Vec<Sandbox>>,
        refs_by: &BTreeMap<String, Vec<String>>,
    ) -> Vec<Node> {
        let mut out = Vec::new();
        for s in snap_kids.remove(&key).unwrap_or_default() {
            let id = s.id.to_string();
            let children = grow(Some(id.clone()), snap_kids, box_kids, refs_by);
            out.push(Node::Snapshot {
                refs: refs_by.get(&id).cloned().unwrap_or_default(),
                snapshot: s,
                children,
            });
        }
        for b in box_kids.remove(&key).unwrap_or_default() {
            out.push(Node::Sandbox { sandbox: b });
        }
        out
    }
    grow(None, &mut snap_kids, &mut box_kids, &refs_by)
}

fn age(ms: i64) -> String {
    let s = (now_ms() - ms).max(0) / 1000;
    match s {
        0..=59 => format!("{s}s ago"),
        60..=3599 => format!("{}m ago", s / 60),
        3600..=86_399 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86_400),
    }
}

fn label(n: &Node) -> String {
    match n {
        Node::Snapshot { snapshot: s, refs, .. } => {
            let mut l = format!("{} {}", s.id, s.kind.as_str());
            if let Some(name) = &s.name {
                l.push_str(&format!(" \"{name}\""));
            }
            for r in refs {
                l.push_str(&format!(" ({r})"));
            }
            if s.deleted_ms.is_some() {
                l.push_str(" [deleted]");
            } else {
                l.push_str(&format!(" {:.1} MiB", s.size_bytes as f64 / 1048576.0));
            }
            l.push_str(&format!(" {}", age(s.created_ms)));
            if let Some(src) = &s.source {
                l.push_str(&format!(" of {src}"));
            }
            l
        }
        Node::Sandbox { sandbox: b } => {
            format!("{} sandbox {}{}", b.id, b.state.as_str(), if b.history { " history" } else { "" })
        }
    }
}

/// Draws the forest as a text graph.
pub fn render(nodes: &[Node]) -> String {
    fn walk(nodes: &[Node], prefix: &str, out: &mut Vec<String>, root: bool) {
        for (i, n) in nodes.iter().enumerate() {
            let last = i + 1 == nodes.len();
            let (branch, next) = if root {
                ("", String::new())
            } else if last {
                ("└─ ", format!("{prefix}   "))
            } else {
                ("├─ ", format!("{prefix}│  "))
            };
            out.push(format!("{prefix}{branch}{}", label(n)));
            if let Node::Snapshot { children, .. } = n {
                walk(children, &next, out, false);
            }
        }
    }
    let mut out = Vec::new();
    walk(nodes, "", &mut out, true);
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use branchbox_model::{BackendKind, Limits, SandboxId, SandboxState, SnapshotId, SnapshotKind};

    fn snap(parent: Option<&Snapshot>) -> Snapshot {
        Snapshot {
            id: SnapshotId::generate(),
            parent: parent.map(|p| p.id.clone()),
            source: None,
            backend: BackendKind::Gvisor,
            image: "img".into(),
            kind: SnapshotKind::Checkpoint,
            name: None,
            created_ms: 1,
            size_bytes: 0,
            limits: Limits::default(),
            expires_ms: None,
            deleted_ms: None,
        }
    }

    fn sandbox(parent: Option<&Snapshot>) -> Sandbox {
        Sandbox {
            id: SandboxId::generate(),
            backend: BackendKind::Gvisor,
            image: "img".into(),
            state: SandboxState::Running,
            created_ms: 2,
            parent_snapshot: parent.map(|p| p.id.clone()),
            limits: Limits::default(),
            history: false,
        }
    }

    #[test]
    fn the_tree_hangs_snapshots_under_parents_and_sandboxes_under_their_snapshot() {
        let root = snap(None);
        let mid = snap(Some(&root));
        let kid_a = sandbox(Some(&mid));
        let kid_b = sandbox(Some(&mid));
        let loose = sandbox(None);
        let forest = build(
            vec![root.clone(), mid.clone()],
            vec![kid_a.clone(), kid_b.clone(), loose.clone()],
            vec![("main".into(), mid.id.to_string())],
        );
        assert_eq!(forest.len(), 2);
        let Node::Snapshot { children, .. } = &forest[0] else { panic!("root is not a snapshot") };
        let Node::Snapshot { children: leaves, refs, .. } = &children[0] else { panic!("mid missing") };
        assert_eq!(refs, &vec!["main".to_string()]);
        assert_eq!(leaves.len(), 2);
        let text = render(&forest);
        assert!(text.contains(&format!("└─ {} checkpoint (main)", mid.id)), "{text}");
        assert!(text.contains(&format!("   ├─ {} sandbox running", kid_a.id)), "{text}");
        assert!(text.lines().last().unwrap().starts_with(loose.id.as_str()), "{text}");
    }
}
