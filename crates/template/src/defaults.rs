//! What env, workdir and user steps leave behind: defaults applied to every later command of
//! the build and of every sandbox made from the template.

use crate::{RunCmd, Step};
use branchbox_protocol::{Command, ExecSpec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Defaults for commands in a template's sandboxes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecDefaults {
    /// Variables added to each command's environment (the command's own win).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory when the command names none.
    #[serde(default)]
    pub workdir: Option<String>,
    /// User the command runs as (through `runuser`) when not root.
    #[serde(default)]
    pub user: Option<String>,
}

impl ExecDefaults {
    /// These defaults after `step`.
    pub fn after(&mut self, step: &Step) {
        match step {
            Step::Env(vars) => self.env.extend(vars.iter().map(|(k, v)| (k.clone(), v.clone()))),
            Step::Workdir(w) => self.workdir = Some(w.clone()),
            Step::User(u) => self.user = Some(u.clone()).filter(|u| u != "root" && u != "0"),
            Step::Run(_) | Step::Upload { .. } | Step::File { .. } => {}
        }
    }

    /// True when nothing is set.
    pub fn is_empty(&self) -> bool {
        self.env.is_empty() && self.workdir.is_none() && self.user.is_none()
    }

    /// Applies the defaults to a command: the command's own env, cwd and user win; the
    /// template's user wraps a command that names none in `runuser -u USER --` (the agent runs
    /// such commands as root).
    pub fn apply(&self, spec: &mut ExecSpec) {
        for (k, v) in &self.env {
            spec.env.entry(k.clone()).or_insert_with(|| v.clone());
        }
        if spec.cwd.is_none() {
            spec.cwd = self.workdir.clone();
        }
        if let (Some(user), None) = (&self.user, &spec.user) {
            let mut argv = vec!["runuser".to_string(), "-u".into(), user.clone(), "--".into()];
            match &spec.cmd {
                Command::Argv(words) => argv.extend(words.iter().cloned()),
                Command::Shell(line) => argv.extend(["/bin/sh".to_string(), "-c".into(), line.clone()]),
            }
            spec.cmd = Command::Argv(argv);
        }
    }
}

/// The agent's command for a `run` step.
pub fn command(cmd: &RunCmd) -> Command {
    match cmd {
        RunCmd::Shell(s) => Command::Shell(s.clone()),
        RunCmd::Argv(w) => Command::Argv(w.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_steps_override_and_commands_keep_their_own() {
        let mut d = ExecDefaults::default();
        d.after(&Step::Env([("A".to_string(), "1".to_string()), ("B".into(), "2".into())].into()));
        d.after(&Step::Env([("A".to_string(), "3".to_string())].into()));
        d.after(&Step::Workdir("/app".into()));
        d.after(&Step::User("nobody".into()));
        let mut spec = ExecSpec::new(Command::Shell("echo $A".into()));
        spec.env.insert("B".into(), "mine".into());
        d.apply(&mut spec);
        assert_eq!(spec.env["A"], "3");
        assert_eq!(spec.env["B"], "mine");
        assert_eq!(spec.cwd.as_deref(), Some("/app"));
        assert_eq!(
            spec.cmd,
            Command::Argv(
                ["runuser", "-u", "nobody", "--", "/bin/sh", "-c", "echo $A"].map(String::from).to_vec()
            )
        );
        d.after(&Step::User("root".into()));
        let mut spec = ExecSpec::new(Command::Argv(vec!["id".into()]));
        spec.cwd = Some("/tmp".into());
        d.apply(&mut spec);
        assert_eq!(spec.cmd, Command::Argv(vec!["id".into()]));
        assert_eq!(spec.cwd.as_deref(), Some("/tmp"));
    }

    #[test]
    fn a_command_that_names_its_user_is_not_wrapped_for_the_templates() {
        let mut d = ExecDefaults::default();
        d.after(&Step::User("worker".into()));
        let mut spec = ExecSpec::new(Command::Argv(vec!["id".into()]));
        spec.user = Some("user".into());
        d.apply(&mut spec);
        assert_eq!(spec.cmd, Command::Argv(vec!["id".into()]));
        assert_eq!(spec.user.as_deref(), Some("user"));
    }
}
