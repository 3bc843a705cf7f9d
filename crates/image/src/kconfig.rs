//! Kernel config fragments: parsing them and checking that every option they ask for stuck.
//!
//! kconfig silently drops an option whose dependencies are not met, so a fragment line can be
//! ignored without any error from `make`. The builder compares the final `.config` against the
//! fragments and fails naming each option that did not stick.

use std::collections::BTreeMap;

/// What a fragment asks for one option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Want {
    /// `CONFIG_X=value` (`y`, a number, a quoted string).
    Value(String),
    /// `# CONFIG_X is not set`.
    Unset,
}

/// A fragment line that is neither an option, an unset marker, a comment nor blank.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{name} line {line}: {text:?} is not `CONFIG_NAME=value` or `# CONFIG_NAME is not set`")]
pub struct FragmentError {
    /// The fragment's name.
    pub name: String,
    /// 1-based line number.
    pub line: usize,
    /// The offending text.
    pub text: String,
}

fn is_option_name(s: &str) -> bool {
    s.strip_prefix("CONFIG_").is_some_and(|rest| {
        !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
    })
}

/// Parses `text` (a fragment or a whole `.config`) into its options; a later line for the same
/// option wins, as in kconfig.
pub fn parse(name: &str, text: &str) -> Result<BTreeMap<String, Want>, FragmentError> {
    let mut out = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if let Some(rest) = line.strip_prefix("# ") {
            if let Some(opt) = rest.strip_suffix(" is not set") {
                if is_option_name(opt) {
                    out.insert(opt.to_string(), Want::Unset);
                }
            }
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match line.split_once('=') {
            Some((opt, value)) if is_option_name(opt) && !value.is_empty() => {
                out.insert(opt.to_string(), Want::Value(value.to_string()));
            }
            _ => return Err(FragmentError { name: name.to_string(), line: i + 1, text: raw.to_string() }),
        }
    }
    Ok(out)
}

/// The options of `wanted` that `config` (a final `.config`) does not have as asked, each as
/// `CONFIG_X (asked y, got not set)`.
pub fn not_stuck(wanted: &BTreeMap<String, Want>, config: &BTreeMap<String, Want>) -> Vec<String> {
    let show = |w: Option<&Want>| match w {
        Some(Want::Value(v)) => v.clone(),
        Some(Want::Unset) | None => "not set".to_string(),
    };
    wanted
        .iter()
        .filter(|(opt, want)| {
            let got = config.get(*opt);
            match want {
                // An option absent from .config (its menu hidden) is as good as unset.
                Want::Unset => matches!(got, Some(Want::Value(_))),
                Want::Value(_) => got != Some(*want),
            }
        })
        .map(|(opt, want)| format!("{opt} (asked {}, got {})", show(Some(want)), show(config.get(opt))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragments_parse_values_unset_markers_and_comments() {
        let f =
            parse("f", "# a comment\n\nCONFIG_A=y\n# CONFIG_B is not set\nCONFIG_C=\"x y\"\nCONFIG_A=n\n")
                .unwrap();
        assert_eq!(f.get("CONFIG_A"), Some(&Want::Value("n".into())));
        assert_eq!(f.get("CONFIG_B"), Some(&Want::Unset));
        assert_eq!(f.get("CONFIG_C"), Some(&Want::Value("\"x y\"".into())));
        assert_eq!(f.len(), 3);
    }

    #[test]
    fn a_malformed_line_is_refused_with_its_place() {
        let e = parse("base.config", "CONFIG_A=y\nVIRTIO=y\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.to_string().contains("base.config line 2"), "{e}");
        assert!(parse("f", "CONFIG_A=\n").is_err());
        assert!(parse("f", "CONFIG_a=y\n").is_err());
    }

    #[test]
    fn options_that_did_not_stick_are_named() {
        let wanted =
            parse("f", "CONFIG_A=y\nCONFIG_B=y\n# CONFIG_C is not set\n# CONFIG_D is not set\n").unwrap();
        let config = parse(".config", "CONFIG_A=y\n# CONFIG_B is not set\nCONFIG_C=y\n").unwrap();
        assert_eq!(
            not_stuck(&wanted, &config),
            vec![
                "CONFIG_B (asked y, got not set)".to_string(),
                "CONFIG_C (asked not set, got y)".to_string()
            ]
        );
        let all = parse(".config", "CONFIG_A=y\nCONFIG_B=y\n# CONFIG_C is not set\n").unwrap();
        assert!(not_stuck(&wanted, &all).is_empty());
    }
}
