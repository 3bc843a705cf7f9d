//! Structure checks of the workspace that run as tests (see `tests/module_graph.rs`).
//!
//! The one check today: the modules of every crate import one another one way. The graph of
//! `use crate::…`, `super::…`, `self::…` and child-module paths between the files of a crate
//! has no cycle. A cycle means two parts can only be understood, tested and moved together;
//! the snapshot format, for one, must depend on the devices and never the reverse.
//!
//! Nodes are files (a `mod.rs` is its own node, apart from its children); edges are every path
//! in code that names an item of another file, test modules included. Declaring a child
//! module (`mod x;`) is containment, not an edge. A crate's files are found from its roots
//! (`src/lib.rs`, `src/main.rs`, `src/bin/*.rs`) by following `mod x;` declarations, so each
//! root's `crate::` means its own tree.
//!
//! A `pub use` (of any visibility) of an item from one's own submodules is a facade: like
//! `mod x;`, it is containment, not an edge. Code that names a submodule's items is one.
//!
//! A crate root is the crate's table of contents: it declares and re-exports the modules,
//! wires them together (`main`) and holds the few crate-wide items every module names
//! (`Error`, `Result`). It is a node without edges: what it names and what names it are not
//! counted, so the graph is the one between the crate's modules. A `mod.rs` below the root
//! is an ordinary node.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// File → the files it names, every name relative to the directory the graph was built for.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

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
        } else if (ch == 'r' || ch == 'b')
            && raw_string_at(&c, if ch == 'b' && next == Some('r') { i + 1 } else { i })
        {
            // Raw string: r"…", r#"…"#, br"…".
            i += if ch == 'b' { 2 } else { 1 };
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

/// Whether `c[i]` is the `r` that opens a raw string (`r"`, `r#"`, `r##"`), not an identifier.
fn raw_string_at(c: &[char], i: usize) -> bool {
    if c.get(i) != Some(&'r') {
        return false;
    }
    let mut j = i + 1;
    while c.get(j) == Some(&'#') {
        j += 1;
    }
    c.get(j) == Some(&'"')
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

/// Tracks the inline modules (`mod tests { … }`) open at each token of a file, with the
/// brace depth at which each closes.
#[derive(Default)]
struct Inline {
    open: Vec<(String, usize)>,
    depth: usize,
}

impl Inline {
    fn step(&mut self, toks: &[Tok], i: usize) {
        match &toks[i] {
            Tok::Punct('{') => self.depth += 1,
            Tok::Punct('}') => {
                self.depth = self.depth.saturating_sub(1);
                if self.open.last().is_some_and(|(_, d)| *d == self.depth) {
                    self.open.pop();
                }
            }
            Tok::Ident(m) if m == "mod" => {
                if let (Some(Tok::Ident(name)), Some(Tok::Punct('{'))) = (toks.get(i + 1), toks.get(i + 2)) {
                    self.open.push((name.clone(), self.depth));
                }
            }
            _ => {}
        }
    }

    fn names(&self) -> impl Iterator<Item = &String> {
        self.open.iter().map(|(n, _)| n)
    }
}

/// Whether the `use` at `toks[at]` is a public one: `pub use`, `pub(crate) use`, `pub(super) use`,
/// `pub(in path) use`.
fn is_pub(toks: &[Tok], at: usize) -> bool {
    let mut k = at;
    if k > 0 && toks[k - 1] == Tok::Punct(')') {
        let Some(open) = (0..k - 1).rev().find(|&j| toks[j] == Tok::Punct('(')) else { return false };
        k = open;
    }
    k > 0 && toks[k - 1] == Tok::Ident("pub".into())
}

/// The modules of the crate root `root` (a file under `src`): module path → file, relative to
/// `src`, found by following `mod x;` declarations (`x.rs` or `x/mod.rs`).
fn module_tree(src: &Path, root: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut modules = BTreeMap::new();
    // (module path, file, directory its `mod x;` children live in)
    let mut todo =
        vec![(Vec::new(), root.to_path_buf(), root.parent().unwrap_or(Path::new("")).to_path_buf())];
    while let Some((module, file, dir)) = todo.pop() {
        let Ok(text) = std::fs::read_to_string(src.join(&file)) else { continue };
        let toks = tokenize(&text);
        let mut inline = Inline::default();
        for i in 0..toks.len() {
            inline.step(&toks, i);
            let (Tok::Ident(m), Some(Tok::Ident(name)), Some(Tok::Punct(';'))) =
                (&toks[i], toks.get(i + 1), toks.get(i + 2))
            else {
                continue;
            };
            if m != "mod" {
                continue;
            }
            let mut child_dir = dir.clone();
            child_dir.extend(inline.names());
            let mut child: Vec<String> = module.clone();
            child.extend(inline.names().cloned());
            child.push(name.clone());
            let flat = child_dir.join(format!("{name}.rs"));
            let nested = child_dir.join(name).join("mod.rs");
            let found = [flat, nested].into_iter().find(|f| src.join(f).is_file());
            if let Some(f) = found {
                todo.push((child, f, child_dir.join(name)));
            }
        }
        modules.insert(module, file);
    }
    modules
}

/// The crate roots under `src`: `lib.rs`, `main.rs`, `bin/*.rs` and `bin/*/main.rs`.
fn roots(src: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> =
        ["lib.rs", "main.rs"].iter().map(PathBuf::from).filter(|f| src.join(f).is_file()).collect();
    if let Ok(entries) = std::fs::read_dir(src.join("bin")) {
        let mut bins: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter_map(|p| {
                let name = p.file_name()?.to_owned();
                if p.is_dir() && p.join("main.rs").is_file() {
                    Some(Path::new("bin").join(name).join("main.rs"))
                } else if p.extension().is_some_and(|e| e == "rs") {
                    Some(Path::new("bin").join(name))
                } else {
                    None
                }
            })
            .collect();
        bins.sort();
        out.extend(bins);
    }
    out
}

/// Every `.rs` file under `dir`, relative to it.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.filter_map(|e| e.ok()) {
            let path = entry.path();
            if path.is_dir() {
                walk(base, &path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path.strip_prefix(base).unwrap_or(&path).to_path_buf());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// The import graph between the files of the crate whose sources are in `src`, over all its
/// roots. Names are paths relative to `src`.
pub fn module_graph(src: &Path) -> Graph {
    let mut graph = Graph::new();
    for root in roots(src) {
        let modules = module_tree(src, &root);
        let name = |f: &PathBuf| f.to_string_lossy().into_owned();
        // The module a path lands in (the longest prefix that is one) and its file.
        let file_of = |path: &[String]| -> Option<(Vec<String>, &PathBuf)> {
            (0..=path.len()).rev().find_map(|n| modules.get(&path[..n]).map(|f| (path[..n].to_vec(), f)))
        };
        for (module, file) in &modules {
            let Ok(text) = std::fs::read_to_string(src.join(file)) else { continue };
            let toks = tokenize(&text);
            let mut edges = BTreeSet::new();
            let mut inline = Inline::default();
            // The end (its `;`) of the `pub use` item being read, if any.
            let mut pub_use_end = 0;
            for i in 0..toks.len() {
                inline.step(&toks, i);
                if toks[i] == Tok::Ident("use".into()) && is_pub(&toks, i) {
                    pub_use_end = (i..toks.len()).find(|&j| toks[j] == Tok::Punct(';')).unwrap_or(toks.len());
                }
                let Tok::Ident(first) = &toks[i] else { continue };
                let after_sep = i > 0 && matches!(toks[i - 1], Tok::PathSep | Tok::Punct('$'));
                if after_sep || toks.get(i + 1) != Some(&Tok::PathSep) {
                    continue;
                }
                let here: Vec<String> = module.iter().chain(inline.names()).cloned().collect();
                let is_child = {
                    let mut child = module.clone();
                    child.push(first.clone());
                    inline.open.is_empty() && modules.contains_key(&child)
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
                    let Some((target_module, target)) = file_of(&base).filter(|(_, t)| *t != file) else {
                        continue;
                    };
                    // A facade: re-exporting an item of one's own submodule, like declaring it,
                    // is containment.
                    let facade = i < pub_use_end && target_module.starts_with(module);
                    if !facade {
                        edges.insert(name(target));
                    }
                }
            }
            edges.remove(&name(&root));
            if module.is_empty() {
                edges.clear();
            }
            graph.entry(name(file)).or_default().extend(edges);
        }
    }
    graph
}

/// The strongly connected components with more than one file (Tarjan's algorithm), each
/// sorted, in the order found.
pub fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a Graph,
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

/// One line naming a circle's files and the edges between them.
pub fn describe(graph: &Graph, scc: &[String]) -> String {
    let edges: Vec<String> = scc
        .iter()
        .flat_map(|f| {
            graph.get(f).into_iter().flatten().filter(|t| scc.contains(t)).map(move |t| format!("{f} -> {t}"))
        })
        .collect();
    format!("{} files in a circle: [{}]; edges: {}", scc.len(), scc.join(", "), edges.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parser_sees_use_trees_inline_paths_super_and_child_modules() {
        let toks = tokenize(
            "// use crate::commented::Out;\n use crate::{a::{self, B}, c::D as E}; \
             let s = \"crate::in_string::X\"; let r = r#\"crate::raw::Y\"#; let c = '\"'; \
             fn f<'a>() { super::g::h(); }",
        );
        let found: Vec<Vec<String>> = (0..toks.len())
            .filter(|&i| matches!(&toks[i], Tok::Ident(s) if s == "crate" || s == "super"))
            .flat_map(|i| paths_at(&toks, i))
            .collect();
        let s = |p: &[&str]| p.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            found,
            vec![
                s(&["crate", "a"]),
                s(&["crate", "a", "B"]),
                s(&["crate", "c", "D"]),
                s(&["super", "g", "h"])
            ]
        );
    }

    #[test]
    fn a_cycle_is_found_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path();
        std::fs::create_dir(src.join("x")).unwrap();
        std::fs::write(src.join("lib.rs"), "mod a; pub mod x;").unwrap();
        std::fs::write(src.join("a.rs"), "use crate::x::y::Thing;").unwrap();
        std::fs::write(
            src.join("x/mod.rs"),
            "mod y; mod z; pub use y::Thing; pub(crate) use self::z::Other;",
        )
        .unwrap();
        std::fs::write(src.join("x/z.rs"), "pub struct Other; fn f() { super::Thing::new(); }").unwrap();
        std::fs::write(
            src.join("x/y.rs"),
            "pub struct Thing; fn f() { crate::a::g(); } mod tests { use super::*; }",
        )
        .unwrap();
        // Not declared by any `mod`: not part of the crate.
        std::fs::write(src.join("stray.rs"), "use crate::a::g;").unwrap();
        let graph = module_graph(src);
        assert_eq!(graph["x/mod.rs"], BTreeSet::new(), "re-exporting a submodule's items is containment");
        assert_eq!(graph["x/z.rs"], BTreeSet::from(["x/mod.rs".to_string()]));
        std::fs::write(src.join("x/mod.rs"), "mod y; mod z; pub use y::Thing; fn f() { z::g(); }").unwrap();
        let graph = module_graph(src);
        assert_eq!(graph["x/mod.rs"], BTreeSet::from(["x/z.rs".to_string()]), "code naming a child module");
        std::fs::write(src.join("x/mod.rs"), "mod y; mod z; pub use y::Thing; pub use crate::a::g;").unwrap();
        let graph = module_graph(src);
        assert_eq!(graph["x/mod.rs"], BTreeSet::from(["a.rs".to_string()]), "re-exporting from elsewhere");
        assert!(!graph.contains_key("stray.rs"));
        let found = cycles(&graph);
        assert_eq!(found, vec![vec!["a.rs".to_string(), "x/y.rs".to_string()]]);
        assert_eq!(
            describe(&graph, &found[0]),
            "2 files in a circle: [a.rs, x/y.rs]; edges: a.rs -> x/y.rs, x/y.rs -> a.rs"
        );
    }

    #[test]
    fn each_root_is_its_own_crate_and_roots_carry_no_edges() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path();
        std::fs::create_dir_all(src.join("bin")).unwrap();
        std::fs::create_dir_all(src.join("outer")).unwrap();
        std::fs::write(src.join("lib.rs"), "pub mod shared; mod outer { pub mod inner; } pub use shared::f;")
            .unwrap();
        std::fs::write(src.join("shared.rs"), "pub fn f() -> crate::Result { crate::outer::inner::g(); }")
            .unwrap();
        std::fs::write(src.join("outer/inner.rs"), "pub fn g() {}").unwrap();
        // The binary's `crate::` is the binary, not the library.
        std::fs::write(src.join("main.rs"), "mod cli; mod run; fn main() { cli::go(); }").unwrap();
        std::fs::write(src.join("cli.rs"), "pub fn go() { crate::run::now(); crate::main(); }").unwrap();
        std::fs::write(src.join("run.rs"), "pub fn now() { super::cli::go(); }").unwrap();
        std::fs::write(src.join("bin/tool.rs"), "mod helper; fn main() { helper::h() }").unwrap();
        std::fs::write(src.join("bin/helper.rs"), "pub fn h() { crate::main(); }").unwrap();
        let graph = module_graph(src);
        let set = |f: &[&str]| f.iter().map(|x| x.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(graph["lib.rs"], set(&[]), "a root names its modules without an edge");
        assert_eq!(graph["shared.rs"], set(&["outer/inner.rs"]), "no edge back to the root's Result");
        assert_eq!(graph["cli.rs"], set(&["run.rs"]));
        assert_eq!(graph["bin/helper.rs"], set(&[]));
        assert_eq!(graph.len(), 8, "every file of the three roots: {graph:?}");
        assert_eq!(cycles(&graph), vec![vec!["cli.rs".to_string(), "run.rs".to_string()]]);
    }
}
