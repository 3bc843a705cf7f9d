//! The crate's modules import one another one way: the graph of `use crate::…`,
//! `super::…`, `self::…` and child-module paths between the files of `src/` has no cycle.
//!
//! A cycle means two parts can only be understood, tested and moved together; the snapshot
//! format, for one, must depend on the devices and never the reverse. Nodes are files (a
//! `mod.rs` is its own node, apart from its children), edges are every path in code that
//! names an item of another file, test modules included. Declaring a child module (`mod x;`)
//! is containment, not an edge.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A token of Rust source: identifiers, `::` and single punctuation characters. Comments,
/// string and character literals are dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    PathSep,
    Punct(char),
}

fn tokenize(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if ch == 'r'
            && (next == Some('"')
                || (next == Some('#') && c.get(i + 2).is_some_and(|&x| x == '"' || x == '#')))
        {
            // Raw string: r"…" or r#"…"#.
            i += 1;
            let mut hashes = 0;
            while c.get(i) == Some(&'#') {
                hashes += 1;
                i += 1;
            }
            i += 1;
            while i < c.len() {
                if c[i] == '"' && (0..hashes).all(|h| c.get(i + 1 + h) == Some(&'#')) {
                    i += 1 + hashes;
                    break;
                }
                i += 1;
            }
        } else if ch == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if ch == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
            }
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(Tok::Ident(c[start..i].iter().collect()));
        } else if ch == ':' && next == Some(':') {
            out.push(Tok::PathSep);
            i += 2;
        } else if ch.is_whitespace() {
            i += 1;
        } else {
            out.push(Tok::Punct(ch));
            i += 1;
        }
    }
    out
}

/// Parses a path (or a `use` tree) starting at `toks[i]`; returns every full path it names.
fn paths_at(toks: &[Tok], mut i: usize) -> Vec<Vec<String>> {
    let mut prefix = Vec::new();
    loop {
        match toks.get(i) {
            Some(Tok::Ident(s)) => prefix.push(s.clone()),
            Some(Tok::Punct('{')) => {
                let mut out = Vec::new();
                let mut depth = 0;
                let mut start = i + 1;
                let mut j = i;
                while j < toks.len() {
                    match toks[j] {
                        Tok::Punct('{') => depth += 1,
                        Tok::Punct('}') => depth -= 1,
                        Tok::Punct(',') if depth == 1 => {
                            out.extend(sub_paths(&prefix, toks, start));
                            start = j + 1;
                        }
                        _ => {}
                    }
                    if depth == 0 {
                        break;
                    }
                    j += 1;
                }
                out.extend(sub_paths(&prefix, toks, start));
                return out;
            }
            _ => return vec![prefix],
        }
        if toks.get(i + 1) != Some(&Tok::PathSep) {
            return vec![prefix];
        }
        i += 2;
    }
}

/// The paths of one subtree of a `use` group, each prefixed with `prefix`.
fn sub_paths(prefix: &[String], toks: &[Tok], at: usize) -> Vec<Vec<String>> {
    if !matches!(toks.get(at), Some(Tok::Ident(_)) | Some(Tok::Punct('{'))) {
        return Vec::new();
    }
    paths_at(toks, at)
        .into_iter()
        .map(|p| {
            let tail = if p.first().map(String::as_str) == Some("self") { &p[1..] } else { &p[..] };
            prefix.iter().chain(tail).cloned().collect()
        })
        .collect()
}

/// Module path of a file under `src/` (`lib.rs` is the root, `a/mod.rs` is `a`).
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Edges between the files of the crate rooted at `src`: file → files it names.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeMap<Vec<String>, String> = files
        .iter()
        .map(|f| {
            let rel = f.strip_prefix(src).unwrap();
            (module_of(rel), rel.to_string_lossy().into_owned())
        })
        .collect();
    let file_of = |path: &[String]| -> String {
        (0..=path.len()).rev().find_map(|n| modules.get(&path[..n]).cloned()).unwrap_or_default()
    };
    let mut graph = BTreeMap::new();
    for (module, file) in &modules {
        let toks = tokenize(&std::fs::read_to_string(src.join(file)).unwrap());
        let mut edges = BTreeSet::new();
        // Inline modules (`mod tests { … }`) open inside this file, with the brace depth at
        // which each closes.
        let mut inline: Vec<(String, usize)> = Vec::new();
        let mut depth = 0usize;
        for i in 0..toks.len() {
            match &toks[i] {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => {
                    depth = depth.saturating_sub(1);
                    if inline.last().is_some_and(|(_, d)| *d == depth) {
                        inline.pop();
                    }
                }
                Tok::Ident(m) if m == "mod" => {
                    if let (Some(Tok::Ident(name)), Some(Tok::Punct('{'))) =
                        (toks.get(i + 1), toks.get(i + 2))
                    {
                        inline.push((name.clone(), depth));
                    }
                }
                _ => {}
            }
            let Tok::Ident(first) = &toks[i] else { continue };
            let after_sep = i > 0 && matches!(toks[i - 1], Tok::PathSep | Tok::Punct('$'));
            if after_sep || toks.get(i + 1) != Some(&Tok::PathSep) {
                continue;
            }
            let here: Vec<String> =
                module.iter().cloned().chain(inline.iter().map(|(n, _)| n.clone())).collect();
            let is_child = {
                let mut child = module.clone();
                child.push(first.clone());
                inline.is_empty() && modules.contains_key(&child)
            };
            if !matches!(first.as_str(), "crate" | "super" | "self") && !is_child {
                continue;
            }
            for path in paths_at(&toks, i) {
                let mut base = match path[0].as_str() {
                    "crate" => Vec::new(),
                    _ => here.clone(),
                };
                let mut rest = &path[if path[0] == "crate" || path[0] == "self" { 1 } else { 0 }..];
                while rest.first().map(String::as_str) == Some("super") {
                    base.pop();
                    rest = &rest[1..];
                }
                base.extend(rest.iter().cloned());
                let target = file_of(&base);
                if target != *file {
                    edges.insert(target);
                }
            }
        }
        graph.insert(file.clone(), edges);
    }
    graph
}

/// The strongly connected components with more than one file (Tarjan's algorithm).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut scc = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    scc.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if scc.len() > 1 {
                    scc.sort();
                    self.out.push(scc);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.out
}

#[test]
fn the_parser_sees_use_trees_inline_paths_super_and_child_modules() {
    let toks = tokenize(
        "// use crate::commented::Out;\n use crate::{a::{self, B}, c::D as E}; \
         let s = \"crate::in_string::X\"; let c = '\"'; fn f<'a>() { super::g::h(); }",
    );
    let found: Vec<Vec<String>> = (0..toks.len())
        .filter(|&i| matches!(&toks[i], Tok::Ident(s) if s == "crate" || s == "super"))
        .flat_map(|i| paths_at(&toks, i))
        .collect();
    let s = |p: &[&str]| p.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        found,
        vec![s(&["crate", "a"]), s(&["crate", "a", "B"]), s(&["crate", "c", "D"]), s(&["super", "g", "h"])]
    );
}

#[test]
fn a_cycle_is_found_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir(src.join("x")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a; mod x;").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::x::y::Thing;").unwrap();
    std::fs::write(src.join("x/mod.rs"), "mod y; pub use y::Thing;").unwrap();
    std::fs::write(
        src.join("x/y.rs"),
        "pub struct Thing; fn f() { crate::a::g(); } mod tests { use super::*; }",
    )
    .unwrap();
    let graph = module_graph(src);
    assert_eq!(graph["x/mod.rs"], BTreeSet::from(["x/y.rs".to_string()]), "child module path");
    assert_eq!(cycles(&graph), vec![vec!["a.rs".to_string(), "x/y.rs".to_string()]]);
}

#[test]
fn the_vmm_modules_import_one_another_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = module_graph(&src);
    assert!(graph.len() > 10, "the crate's files were not found under {}", src.display());
    let found = cycles(&graph);
    let report: Vec<String> = found
        .iter()
        .map(|scc| {
            let edges: Vec<String> = scc
                .iter()
                .flat_map(|f| graph[f].iter().filter(|t| scc.contains(t)).map(move |t| format!("{f} -> {t}")))
                .collect();
            format!("{} files in a cycle: {}", scc.len(), edges.join(", "))
        })
        .collect();
    assert!(found.is_empty(), "import cycles in crates/vmm/src:\n{}", report.join("\n"));
}
