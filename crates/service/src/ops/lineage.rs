//! The lineage: every snapshot and sandbox with its parent edges (the native API's
//! `/v1/lineage` and the console's event stream), or only the part connected to one sandbox.

use super::types::{Lineage, LineageSandbox, LineageSnapshot};
use crate::error::ApiResult;
use crate::state::AppState;
use branchbox_model::{SandboxId, SandboxState};
use std::collections::{BTreeMap, BTreeSet};

/// The lineage, or (with `only`) the part connected to that sandbox: 404 when it is not one.
pub async fn lineage(st: &AppState, only: Option<SandboxId>) -> ApiResult<Lineage> {
    st.blocking(move |engine, _| {
        let snaps = engine.snapshots()?;
        let boxes = engine.list()?;
        let mut refs: std::collections::HashMap<String, Vec<String>> = std::collections::HashMap::new();
        for (name, snap) in engine.refs()? {
            refs.entry(snap).or_default().push(name);
        }
        if let Some(id) = &only {
            if !boxes.iter().any(|b| &b.sandbox.id == id) {
                return Err(branchbox_model::Error::not_found(
                    "sandbox",
                    id.as_str(),
                    "GET /v1/sandboxes lists them",
                )
                .into());
            }
        }
        let mut l = Lineage {
            snapshots: snaps
                .iter()
                .map(|s| LineageSnapshot {
                    id: s.id.to_string(),
                    parent: s.parent.as_ref().map(ToString::to_string),
                    source: s.source.as_ref().map(ToString::to_string),
                    kind: s.kind.as_str().into(),
                    name: s.name.clone(),
                    created_ms: s.created_ms,
                    deleted: s.deleted_ms.is_some(),
                    refs: refs.remove(s.id.as_str()).unwrap_or_default(),
                })
                .collect(),
            sandboxes: boxes
                .iter()
                .map(|b| LineageSandbox {
                    id: b.sandbox.id.to_string(),
                    parent_snapshot: b.sandbox.parent_snapshot.as_ref().map(ToString::to_string),
                    state: if b.alive { b.sandbox.state.into() } else { SandboxState::Lost.into() },
                })
                .collect(),
        };
        if let Some(id) = only {
            let keep = component(&l, id.as_str());
            l.snapshots.retain(|s| keep.contains(&s.id));
            l.sandboxes.retain(|s| keep.contains(&s.id));
        }
        Ok(l)
    })
    .await
}

/// Every node connected to `start` through parent, source or parent-snapshot edges.
fn component(l: &Lineage, start: &str) -> BTreeSet<String> {
    let mut edges: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    for s in &l.snapshots {
        if let Some(p) = &s.parent {
            pairs.push((s.id.as_str(), p.as_str()));
        }
        if let Some(src) = &s.source {
            pairs.push((s.id.as_str(), src.as_str()));
        }
    }
    for b in &l.sandboxes {
        if let Some(p) = &b.parent_snapshot {
            pairs.push((b.id.as_str(), p.as_str()));
        }
    }
    for (a, b) in pairs {
        edges.entry(a).or_default().push(b);
        edges.entry(b).or_default().push(a);
    }
    let mut seen = BTreeSet::from([start.to_string()]);
    let mut todo = vec![start];
    while let Some(n) = todo.pop() {
        for next in edges.get(n).into_iter().flatten() {
            if seen.insert(next.to_string()) {
                todo.push(next);
            }
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::types::StateName;

    fn snap(id: &str, parent: Option<&str>, source: &str) -> LineageSnapshot {
        LineageSnapshot {
            id: id.into(),
            parent: parent.map(Into::into),
            source: Some(source.into()),
            kind: "snapshot".into(),
            name: None,
            created_ms: 0,
            deleted: false,
            refs: Vec::new(),
        }
    }

    fn sbx(id: &str, parent: Option<&str>) -> LineageSandbox {
        LineageSandbox { id: id.into(), parent_snapshot: parent.map(Into::into), state: StateName::Running }
    }

    #[test]
    fn lineage_component_holds_ancestors_and_descendants_only() {
        // a -> s1 -> b -> s2 -> c ; unrelated: d -> s3 -> e
        let l = Lineage {
            snapshots: vec![snap("s1", None, "a"), snap("s2", Some("s1"), "b"), snap("s3", None, "d")],
            sandboxes: vec![
                sbx("a", None),
                sbx("b", Some("s1")),
                sbx("c", Some("s2")),
                sbx("d", None),
                sbx("e", Some("s3")),
            ],
        };
        let got = component(&l, "b");
        let want: BTreeSet<String> = ["a", "s1", "b", "s2", "c"].iter().map(|s| s.to_string()).collect();
        assert_eq!(got, want);
    }
}
