//! A template build's progress as E2B's SDK reads it: the engine's build events
//! ([`branchbox_core::BuildEvent`]) turned into log lines, each labelled with E2B's name for
//! the step (`base`, its number, `finalize`), and the running step's output tail kept for the
//! error a failed step reports.

use branchbox_core::BuildEvent;

/// Longest log line kept, bytes; the rest of a longer line starts the next entry.
const MAX_LINE: usize = 4096;
/// How much of a failed step's output its error repeats, bytes.
const ERROR_TAIL: usize = 4096;

/// Follows one build's events; `sink` takes each line as (level, step label, message).
pub struct Follow<F> {
    labels: Vec<String>,
    sink: F,
    current: usize,
    partial: String,
    tail: String,
}

impl<F: FnMut(&'static str, &str, String)> Follow<F> {
    /// A follower for a build whose steps (index 0 the base) E2B names `labels`.
    pub fn new(labels: Vec<String>, sink: F) -> Follow<F> {
        Follow { labels, sink, current: 0, partial: String::new(), tail: String::new() }
    }

    /// E2B's name for the step running now (the one that failed, after a failure).
    pub fn label(&self) -> String {
        self.labels.get(self.current).cloned().unwrap_or_else(|| "finalize".into())
    }

    /// The last [`ERROR_TAIL`] bytes of the running step's output.
    pub fn tail(&self) -> &str {
        &self.tail
    }

    fn line(&mut self, level: &'static str, message: String) {
        let label = self.label();
        (self.sink)(level, &label, message);
    }

    /// Writes out a line the output has not ended yet.
    pub fn flush(&mut self) {
        if !self.partial.is_empty() {
            let p = std::mem::take(&mut self.partial);
            self.line("info", p);
        }
    }

    /// Takes one event.
    pub fn on(&mut self, ev: &BuildEvent) {
        match ev {
            BuildEvent::Step { index, total, step, cached } => {
                self.flush();
                self.current = *index;
                self.tail.clear();
                let cached = if *cached { " (cached)" } else { "" };
                self.line("info", format!("step {index}/{total}: {step}{cached}"));
            }
            BuildEvent::Output { data, .. } => {
                self.tail.push_str(data);
                if self.tail.len() > ERROR_TAIL {
                    let mut cut = self.tail.len() - ERROR_TAIL;
                    while !self.tail.is_char_boundary(cut) {
                        cut += 1;
                    }
                    self.tail.drain(..cut);
                }
                self.partial.push_str(data);
                while let Some(i) = self.partial.find('\n') {
                    let rest = self.partial.split_off(i + 1);
                    let mut line = std::mem::replace(&mut self.partial, rest);
                    line.pop();
                    self.line("info", line);
                }
                if self.partial.len() > MAX_LINE {
                    self.flush();
                }
            }
            BuildEvent::StepDone { index, ms, cached: false, .. } => {
                self.flush();
                self.line("info", format!("step {index} done in {ms} ms"));
            }
            BuildEvent::StepDone { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(data: &str) -> BuildEvent {
        BuildEvent::Output { stream: "stdout", data: data.into() }
    }

    #[test]
    fn output_becomes_one_entry_per_line_labelled_with_e2bs_step() {
        let mut lines = Vec::new();
        let labels = vec!["base".to_string(), "1".into(), "finalize".into()];
        let mut f = Follow::new(labels, |_, step: &str, m| lines.push((step.to_string(), m)));
        f.on(&BuildEvent::Step { index: 1, total: 2, step: "run x".into(), cached: false });
        f.on(&out("one\ntw"));
        f.on(&out("o\nthree"));
        f.on(&BuildEvent::Step { index: 2, total: 2, step: "run y".into(), cached: true });
        assert_eq!(f.tail(), "");
        assert_eq!(f.label(), "finalize");
        drop(f);
        let got: Vec<(&str, &str)> = lines.iter().map(|(s, m)| (s.as_str(), m.as_str())).collect();
        assert_eq!(
            got,
            [
                ("1", "step 1/2: run x"),
                ("1", "one"),
                ("1", "two"),
                ("1", "three"),
                ("finalize", "step 2/2: run y (cached)")
            ]
        );
    }

    #[test]
    fn the_tail_and_lines_stay_bounded() {
        let mut longest = 0;
        let mut f = Follow::new(vec!["base".into()], |_, _: &str, m: String| longest = longest.max(m.len()));
        for _ in 0..100 {
            f.on(&out(&"é".repeat(1000)));
        }
        assert!(f.tail().len() <= ERROR_TAIL && f.tail().ends_with('é'));
        f.flush();
        drop(f);
        assert!(longest <= MAX_LINE + 2000, "{longest}");
    }
}
