//! A sandbox's timeline: the snapshots taken of it, oldest first, each checkpoint that step-history
//! mode took after a command carrying that command (its step).

use super::Engine;
use branchbox_model::{Result, SandboxId, Snapshot};
use branchbox_protocol::Command;
use branchbox_store::ExecStep;

/// One point on a sandbox's timeline.
#[derive(Debug, Clone)]
pub struct TimelineEntry {
    /// A snapshot taken of the sandbox (checkpoint, snapshot or fork point; tombstones too).
    pub snapshot: Snapshot,
    /// The command it followed, when step-history mode took it.
    pub step: Option<ExecStep>,
}

/// True when a word needs quoting to read back as one shell word.
fn needs_quotes(w: &str) -> bool {
    w.is_empty() || !w.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%^".contains(&b))
}

/// A command as one line: a shell line as given; an argv joined with spaces, each word that
/// needs it in single quotes (so `["sh", "-c", "echo a b"]` reads `sh -c 'echo a b'`). Not
/// bounded here: the store cuts it to `MAX_STEP_COMMAND` bytes.
pub fn command_text(cmd: &Command) -> String {
    match cmd {
        Command::Shell(line) => line.clone(),
        Command::Argv(argv) => argv
            .iter()
            .map(|w| if needs_quotes(w) { format!("'{}'", w.replace('\'', r"'\''")) } else { w.clone() })
            .collect::<Vec<_>>()
            .join(" "),
    }
}

impl Engine {
    /// The snapshots taken of a sandbox, oldest first, each with the step it followed (when
    /// step-history mode took it after a command).
    pub fn timeline(&self, id: &SandboxId) -> Result<Vec<TimelineEntry>> {
        self.store.sandbox(id)?;
        let mut steps: std::collections::HashMap<_, _> =
            self.store.steps_of(id)?.into_iter().map(|s| (s.snapshot.clone(), s)).collect();
        Ok(self
            .store
            .snapshots_of(id)?
            .into_iter()
            .map(|snapshot| TimelineEntry { step: steps.remove(&snapshot.id), snapshot })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_argv_reads_back_as_one_shell_line() {
        let argv = |a: &[&str]| Command::Argv(a.iter().map(|s| s.to_string()).collect());
        assert_eq!(command_text(&argv(&["python3", "-c", "print(6 * 7)"])), "python3 -c 'print(6 * 7)'");
        assert_eq!(command_text(&argv(&["echo", "it's", ""])), r"echo 'it'\''s' ''");
        assert_eq!(command_text(&argv(&["ls", "-l", "/root"])), "ls -l /root");
        assert_eq!(command_text(&Command::Shell("echo a > /root/a".into())), "echo a > /root/a");
    }
}
