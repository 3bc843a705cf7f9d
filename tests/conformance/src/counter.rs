//! A background process that holds a word in memory, so a test can tell whether a sandbox's
//! memory continued (fork, restore) or went back (rollback) without depending on how fast the
//! process runs; and a fork loop that meets the process limit. Shared with the gVisor-only
//! tests of `crates/cli/tests`.

use std::process::Output;
use std::time::{Duration, Instant};

/// Something that runs shell lines inside a sandbox.
pub trait Shell {
    /// Runs `line` with `/bin/sh -c` inside and returns the whole output.
    fn sh_output(&self, line: &str) -> Output;

    /// Runs `line` inside, asserts success and returns stdout as text.
    fn sh(&self, line: &str) -> String {
        let out = self.sh_output(line);
        assert!(
            out.status.success(),
            "`{line}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// A Python process that counts, and keeps in its memory only a word it was told
/// ([`set_mark`]). It writes `COUNT WORD` to /tmp/count whenever /tmp/ask appears. A child that
/// reports a count at or above the source's at the fork instant continued from its memory; the
/// word says which memory it has.
pub const COUNTER: &str = r#"
import os, time
n = 0
mark = ''
while True:
    n += 1
    if os.path.exists('/tmp/mark'):
        mark = open('/tmp/mark').read()
        os.remove('/tmp/mark')
    if os.path.exists('/tmp/ask'):
        os.remove('/tmp/ask')
        open('/tmp/count.tmp', 'w').write(str(n) + ' ' + mark)
        os.rename('/tmp/count.tmp', '/tmp/count')
    time.sleep(0.01)
"#;

/// Polls `f` until it returns true or 20 s pass.
pub fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("timed out waiting for {what}");
}

/// Asks the counter how far it has counted and which word it holds.
pub fn ask(s: &impl Shell) -> (u64, String) {
    s.sh("rm -f /tmp/count; touch /tmp/ask");
    let mut value = (0, String::new());
    eventually("the counter to answer", || match s.sh_output("cat /tmp/count 2>/dev/null") {
        out if out.status.success() && !out.stdout.is_empty() => {
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let (n, mark) = text.split_once(' ').unwrap_or((&text, ""));
            value = (n.trim().parse().unwrap_or(0), mark.to_string());
            value.0 > 0
        }
        _ => false,
    });
    value
}

/// How far the counter has counted.
pub fn ask_count(s: &impl Shell) -> u64 {
    ask(s).0
}

/// The word the counter holds in memory (set by [`set_mark`]).
pub fn ask_mark(s: &impl Shell) -> String {
    ask(s).1
}

/// Tells the counter a word to keep in memory, and waits until it has taken it.
pub fn set_mark(s: &impl Shell, word: &str) {
    s.sh(&format!("printf %s {word} > /tmp/mark.tmp && mv /tmp/mark.tmp /tmp/mark"));
    eventually("the counter to take its mark", || !s.sh_output("test -e /tmp/mark").status.success());
}

/// The counter's pid.
pub fn counter_pid(s: &impl Shell) -> String {
    s.sh("pgrep -x python3").trim().to_string()
}

/// A Python program that forks children (each sleeps) until `max` or the first error, and prints
/// `all N` or the error's name and how many forks succeeded (`EAGAIN 31`).
pub fn fork_loop(max: u32) -> String {
    format!(
        r#"
import errno, os, time
n = 0
try:
    while n < {max}:
        if os.fork() == 0:
            time.sleep(600)
            os._exit(0)
        n += 1
    print("all", n)
except OSError as e:
    print(errno.errorcode[e.errno], n)
"#
    )
}
