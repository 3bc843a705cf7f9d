//! Printing: text for people, one JSON document for programs, and progress on stderr.

use branchbox_model::Error;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::io::IsTerminal;
use std::time::Duration;

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
    eprintln!("error: {e:#}");
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
