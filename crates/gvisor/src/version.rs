//! Which gVisor release a `runsc` is, read from its `--version` output, and the oldest release
//! the backend accepts: 20240729, the first one here whose `checkpoint --leave-running` works
//! (in 20221219 it hangs, so every fork had to stop and restore the source).

use std::fmt;

/// A gVisor release: the date it was cut (`YYYYMMDD`) and its patch number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Release {
    /// `YYYYMMDD`.
    pub date: u32,
    /// The number after the date (`.0` in `20240729.0`).
    pub patch: u32,
}

/// The oldest release the gvisor backend runs on.
pub const OLDEST: Release = Release { date: 20240729, patch: 0 };

/// What installs a release that is new enough, for error messages.
pub const FIX: &str =
    "run ./scripts/setup.sh as root (it enables bookworm-backports and installs runsc from it), \
     or `apt-get install -t bookworm-backports runsc`";

/// Longest part of a version line quoted back in a message.
const QUOTE_MAX: usize = 120;

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.date, self.patch)
    }
}

impl Release {
    /// Reads the release from `runsc --version` output, whose first line is
    /// `runsc version <v>` with `<v>` like `release-20240729.0` (gVisor's own builds) or
    /// `0.0~20240729.0` (Debian's). `None` for anything else: a build without a release
    /// (`VERSION_MISSING`), a date that is not one, other text.
    pub fn parse(output: &str) -> Option<Release> {
        let line = output.lines().next()?.trim();
        let version = line.strip_prefix("runsc version ")?.split_whitespace().next()?;
        let version = match version.rsplit_once('~') {
            // Debian's upstream-less version: `<epoch-ish>~<date>.<patch>`.
            Some((before, after)) if before.bytes().all(|b| b.is_ascii_digit() || b == b'.') => after,
            Some(_) => return None,
            None => version.strip_prefix("release-")?,
        };
        let (date, patch) = version.split_once('.').unwrap_or((version, "0"));
        if date.len() != 8 || !date.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let date: u32 = date.parse().ok()?;
        let (month, day) = (date / 100 % 100, date % 100);
        if date / 10000 < 2018 || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
            return None;
        }
        // Patch digits end at the first non-digit (`.0-rc1` is patch 0).
        let digits: &str = &patch[..patch.bytes().take_while(u8::is_ascii_digit).count()];
        let patch = if digits.is_empty() { 0 } else { digits.parse().ok()? };
        Some(Release { date, patch })
    }
}

/// The first line of `runsc --version` output, printable and short, for messages.
pub fn quote_line(output: &str) -> String {
    let line = output.lines().next().unwrap_or("").trim();
    let cut: String = line.chars().take(QUOTE_MAX).collect();
    let shown = format!("{cut:?}");
    if line.chars().count() > QUOTE_MAX {
        format!("{shown}...")
    } else {
        shown
    }
}

/// Accepts `output` of `runsc --version` when it names [`OLDEST`] or later; otherwise says,
/// as the end of a sentence about that runsc, what was found and how to install one that works.
pub fn require(output: &str) -> Result<Release, String> {
    match Release::parse(output) {
        Some(r) if r >= OLDEST => Ok(r),
        Some(r) => Err(format!(
            "is release {r}, older than {OLDEST}, the oldest branchbox runs on (it needs \
             `checkpoint --leave-running`, which hangs in older releases); {FIX}"
        )),
        None => Err(format!(
            "does not say which gVisor release it is (`runsc --version` said {}); branchbox needs \
             release {OLDEST} or later: {FIX}",
            quote_line(output)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(date: u32, patch: u32) -> Option<Release> {
        Some(Release { date, patch })
    }

    #[test]
    fn debian_and_upstream_version_lines_are_read() {
        assert_eq!(Release::parse("runsc version 0.0~20240729.0\nspec: 1.0.2-dev\n"), rel(20240729, 0));
        assert_eq!(Release::parse("runsc version 0.0~20221219.0\nspec: 1.0.2-dev"), rel(20221219, 0));
        assert_eq!(Release::parse("runsc version release-20250106.3\nspec: 1.1.0"), rel(20250106, 3));
        assert_eq!(Release::parse("  runsc version release-20240729.0-rc1  "), rel(20240729, 0));
        assert_eq!(Release::parse("runsc version release-20240729"), rel(20240729, 0));
    }

    #[test]
    fn odd_and_hostile_lines_are_not_a_release() {
        for bad in [
            "",
            "\n",
            "runsc version",
            "runsc version ",
            "runsc version VERSION_MISSING",
            "runsc version 4e8b2a8a",
            "runsc version release-2024072.0",
            "runsc version release-202407290.0",
            "runsc version release-20241329.0",
            "runsc version release-20240700.0",
            "runsc version release-19991231.0",
            "runsc version release-+2024072.0",
            "runsc version release-２０２４０７２９.0",
            "runsc version 1.0~beta~20240729.0",
            "runsc version x~20240729.0",
            "runsc version release-20240729.99999999999999999999",
            "spec: 1.0.2-dev\nrunsc version release-20240729.0",
            "gvisor version release-20240729.0",
            "runsc version\u{0}release-20240729.0",
        ] {
            assert_eq!(Release::parse(bad), None, "{bad:?} parsed");
        }
    }

    #[test]
    fn releases_before_20240729_are_refused_with_the_command_that_fixes_it() {
        assert_eq!(require("runsc version 0.0~20240729.0"), Ok(OLDEST));
        assert!(require("runsc version release-20250106.0").is_ok());
        let old = require("runsc version 0.0~20221219.0").unwrap_err();
        assert!(old.contains("20221219.0") && old.contains("20240729.0"), "{old}");
        assert!(old.contains("./scripts/setup.sh") && old.contains("-t bookworm-backports runsc"), "{old}");
        assert!(require("runsc version release-20240728.9").is_err());
        let odd = require("runsc version VERSION_MISSING").unwrap_err();
        assert!(odd.contains("VERSION_MISSING") && odd.contains("./scripts/setup.sh"), "{odd}");
    }

    #[test]
    fn quoted_lines_are_short_and_printable() {
        let long = format!("runsc version {}\u{1b}[2J", "x".repeat(10_000));
        let q = quote_line(&long);
        assert!(q.len() < QUOTE_MAX + 20, "{q}");
        assert!(!q.contains('\u{1b}'));
        assert!(quote_line("a\u{1b}[2J\nb").contains("\\u{1b}"));
    }
}
