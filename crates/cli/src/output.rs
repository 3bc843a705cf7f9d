//! Printing: text for people, one JSON document for programs, and progress on stderr.

use branchbox_model::Error;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::borrow::Cow;
use std::fmt::Write as _;
use std::io::IsTerminal;
use std::time::Duration;

/// Makes text from a sandbox (file names, messages) safe to print on a terminal: control
/// characters (C0, DEL, C1: the escape sequences that move the cursor, retitle the window or
/// rewrite earlier lines) and the bidirectional overrides that reorder what a reader sees are
/// written as `\x1b` / `\u{202e}`, and a backslash as `\\` so the escapes cannot be faked.
/// Other text, non-ASCII included, is kept.
pub fn clean(s: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| {
        c.is_control() || c == '\\' || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x80 && unsafe_char(c) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if unsafe_char(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Prints `value` as JSON, or `text` for people.
pub fn print<T: Serialize>(json: bool, value: &T, text: impl FnOnce() -> String) {
    if json {
        println!("{}", serde_json::to_string_pretty(value).unwrap_or_default());
    } else {
        let t = text();
        if !t.is_empty() {
            println!("{t}");
        }
    }
}

/// Reports a failure on stderr (and as JSON on stdout with `--json`).
pub fn error(json: bool, e: &anyhow::Error) {
    let code = e.downcast_ref::<Error>().map(Error::code).unwrap_or("error");
    if json {
        let v = serde_json::json!({"error": {"code": code, "message": format!("{e:#}")}});
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    }
    // Messages can carry text from a sandbox (an agent's error, a path); each line is cleaned.
    let text = format!("{e:#}");
    let lines: Vec<Cow<'_, str>> = text.lines().map(clean).collect();
    eprintln!("error: {}", lines.join("\n"));
}

/// A progress reporter: a spinner on a terminal, plain lines otherwise.
pub struct Progress {
    bar: Option<ProgressBar>,
    last_line: Option<std::time::Instant>,
}

impl Progress {
    /// Starts reporting.
    pub fn new() -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::new_spinner();
            b.set_style(
                ProgressStyle::with_template("{spinner} {elapsed} {msg}")
                    .unwrap_or(ProgressStyle::default_spinner()),
            );
            b.enable_steady_tick(Duration::from_millis(120));
            b
        });
        Progress { bar, last_line: None }
    }

    /// Reports one step.
    pub fn step(&mut self, msg: &str) {
        match &self.bar {
            Some(b) => b.set_message(msg.to_string()),
            None => {
                // Without a terminal, per-package steps are printed at most every few seconds
                // (logs show progress without one line per package); other steps always.
                let per_package = ["Retrieving", "Validating", "Extracting", "Unpacking", "Configuring"]
                    .iter()
                    .any(|p| msg.starts_with(p) && msg.contains(' ') && !msg.ends_with("..."));
                let due = self.last_line.is_none_or(|t| t.elapsed() > Duration::from_secs(3));
                if !per_package || due {
                    eprintln!("  {msg}");
                    self.last_line = Some(std::time::Instant::now());
                }
            }
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// Runs `act` on every target, even after one fails: reports each failure on stderr (and in
/// the JSON under "failed"), prints what was done under `done_key`, and exits 1 when any failed.
pub(crate) fn each_target(
    json: bool,
    verb: &str,
    done_key: &str,
    show_done: bool,
    targets: &[String],
    mut act: impl FnMut(&str) -> anyhow::Result<Vec<String>>,
) -> anyhow::Result<i32> {
    let (mut done, mut failed) = (Vec::new(), Vec::new());
    for t in targets {
        match act(t) {
            Ok(d) => done.extend(d),
            Err(e) => {
                eprintln!("error: {verb} {t}: {e:#}");
                let code = e.downcast_ref::<branchbox_model::Error>().map(|e| e.code()).unwrap_or("error");
                failed.push(
                    serde_json::json!({"target": t, "error": {"code": code, "message": format!("{e:#}")}}),
                );
            }
        }
    }
    let v = serde_json::json!({ done_key: done, "failed": failed });
    print(json, &v, || if show_done { done.join("\n") } else { String::new() });
    Ok(if failed.is_empty() { 0 } else { 1 })
}

/// A progress callback: a [`Progress`] that starts with the first message (a spinner on a
/// terminal, plain lines otherwise), so a step that reports nothing prints nothing.
pub(crate) fn progress_fn() -> impl FnMut(&str) {
    let mut p: Option<Progress> = None;
    move |msg: &str| p.get_or_insert_with(Progress::new).step(msg)
}

#[cfg(test)]
mod tests {
    use super::clean;

    #[test]
    fn control_characters_and_bidi_overrides_are_escaped() {
        assert_eq!(clean("plain name.txt"), "plain name.txt");
        assert_eq!(clean("caf\u{e9} \u{1f600}"), "caf\u{e9} \u{1f600}");
        assert_eq!(clean("\u{1b}[31mred\u{1b}]0;title\u{7}"), "\\x1b[31mred\\x1b]0;title\\x07");
        assert_eq!(clean("a\nb\rc\td\u{7f}"), "a\\x0ab\\x0dc\\x09d\\x7f");
        assert_eq!(clean("\u{9b}2J"), "\\u{9b}2J");
        assert_eq!(clean("evil\u{202e}txt.exe"), "evil\\u{202e}txt.exe");
        assert_eq!(clean("back\\x1b"), "back\\\\x1b");
    }
}
