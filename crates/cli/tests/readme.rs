//! README.md stays true to the code: every `branchbox` command line it shows names
//! subcommands and flags the CLI has, every repository path it names exists, and every
//! relative link of README.md and `docs/*.md` reaches a file. A rename that forgets the docs
//! fails here instead of in a new user's first minutes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn readme() -> String {
    std::fs::read_to_string(repo().join("README.md")).unwrap()
}

/// `branchbox <path> --help`, cached; `None` when the CLI refuses the path.
struct Help(BTreeMap<Vec<String>, Option<String>>);

impl Help {
    fn of(&mut self, path: &[String]) -> Option<String> {
        self.0
            .entry(path.to_vec())
            .or_insert_with(|| {
                let out =
                    Command::new(env!("CARGO_BIN_EXE_branchbox")).args(path).arg("--help").output().unwrap();
                out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
            })
            .clone()
    }
}

/// The subcommands a help text lists under `Commands:`.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// The command lines the README shows: each `$bb ...` in its code blocks (up to a `#`
/// comment, `;`, `)` or `&&`) and each `branchbox ...` between backticks in its prose.
fn command_lines(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in text.lines() {
        let code = line.split(" #").next().unwrap_or("");
        for part in code.split("$bb ").skip(1) {
            let end = part.find([';', ')']).unwrap_or(part.len());
            let end = part[..end].find("&&").unwrap_or(end);
            found.push(part[..end].trim().to_string());
        }
        for quoted in line.split('`').skip(1).step_by(2) {
            if let Some(rest) = quoted.strip_prefix("branchbox ") {
                found.push(rest.trim().to_string());
            }
        }
    }
    found
}

fn is_word(t: &str) -> bool {
    !t.is_empty() && t.chars().all(|c| c.is_ascii_lowercase() || c == '-') && !t.starts_with('-')
}

fn is_flag(t: &str) -> bool {
    let name = t.split('=').next().unwrap_or(t);
    (name.len() == 2 && name.starts_with('-') && name.as_bytes()[1].is_ascii_alphabetic())
        || (name.len() > 2
            && name.starts_with("--")
            && name[2..].chars().all(|c| c.is_ascii_lowercase() || c == '-'))
}

/// Whether `help` lists `flag` (followed by something that cannot continue a flag's name).
fn names_flag(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(i, _)| {
        let next = help[i + flag.len()..].chars().next();
        let before = help[..i].chars().next_back();
        before.is_none_or(|c| c.is_whitespace() || c == '[')
            && next.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '-'))
    })
}

#[test]
fn every_command_and_flag_the_readme_shows_exists() {
    let mut help = Help(BTreeMap::new());
    let mut problems = Vec::new();
    let lines = command_lines(&readme());
    assert!(lines.len() > 20, "the README's command lines were not found: {lines:?}");
    for line in &lines {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        let mut path: Vec<String> = Vec::new();
        let mut rest = &tokens[..];
        while let Some((t, more)) = rest.split_first() {
            let Some(h) = help.of(&path) else { break };
            let subs = subcommands(&h);
            if subs.is_empty() || !is_word(t) {
                break;
            }
            if !subs.iter().any(|s| s == t) {
                problems.push(
                    format!("`branchbox {line}`: `branchbox {}` has no subcommand `{t}`", path.join(" "))
                        .replace("  ", " "),
                );
                break;
            }
            path.push(t.to_string());
            rest = more;
        }
        let Some(h) = help.of(&path) else {
            problems.push(format!("`branchbox {line}`: `branchbox {} --help` fails", path.join(" ")));
            continue;
        };
        for t in rest.iter().take_while(|t| **t != "--").filter(|t| is_flag(t)) {
            let name = t.split('=').next().unwrap_or(t);
            if !names_flag(&h, name) {
                problems
                    .push(format!("`branchbox {line}`: `branchbox {}` has no flag `{name}`", path.join(" ")));
            }
        }
    }
    assert!(problems.is_empty(), "README.md names what the CLI does not have:\n{}", problems.join("\n"));
}

#[test]
fn every_repository_path_the_readme_names_exists() {
    let text = readme();
    let mut missing = Vec::new();
    let roots = ["docs/", "scripts/", "crates/", "sdk/", "tests/", "images/", "fuzz/", ".ci/"];
    for token in text.split(|c: char| c.is_whitespace() || "`()[]<>,;:\"'".contains(c)) {
        let token = token.trim_end_matches(['.', '/']);
        let names_path = roots.iter().any(|r| token.starts_with(r)) && !token.contains(['*', '{', '$', '<']);
        if names_path && !repo().join(token).exists() {
            missing.push(token.to_string());
        }
    }
    missing.dedup();
    assert!(missing.is_empty(), "README.md names paths that do not exist: {missing:?}");
}

/// The relative link targets of Markdown text (`[text](target)`), anchors cut off; web
/// addresses and links within the page left out.
fn relative_links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split('#').next().unwrap_or_default().trim();
        if !target.is_empty() && !target.contains("://") && !target.starts_with("mailto:") {
            out.push(target.to_string());
        }
        rest = &rest[end..];
    }
    out
}

#[test]
fn every_link_between_the_docs_reaches_a_file() {
    let docs = repo().join("docs");
    let mut pages: Vec<PathBuf> = std::fs::read_dir(&docs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.push(repo().join("README.md"));
    assert!(pages.len() > 10, "the docs were not found under {}", docs.display());
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        let base = page.parent().unwrap();
        for target in relative_links(&text) {
            if !base.join(&target).exists() {
                broken.push(format!("{}: {target}", page.strip_prefix(repo()).unwrap_or(page).display()));
            }
        }
    }
    assert!(broken.is_empty(), "links to files that do not exist:\n{}", broken.join("\n"));
}

#[test]
fn the_link_reader_finds_relative_targets_only() {
    let text = "see [a](remote.md#pull), [b](../README.md) and [c](https://e2b.dev) or [d](#here)";
    assert_eq!(relative_links(text), vec!["remote.md", "../README.md"]);
}
