//! A Dockerfile subset: `FROM` one of this host's images or templates, `RUN` (shell and JSON
//! forms), `COPY` (from the build context only), `ENV`, `WORKDIR`, `USER`. Anything else is
//! refused naming its line; nothing is pulled from a registry. Variables are not expanded in
//! `COPY`, `WORKDIR` or `USER` (a `RUN` line's shell expands its own).

use crate::{Error, Result, RunCmd, Step, TemplateSpec, MAX_FILE_BYTES};
use std::collections::BTreeMap;

const SUPPORTED: &str = "FROM, RUN, COPY, ENV, WORKDIR, USER";

/// One instruction with the line it starts on.
struct Line {
    no: usize,
    word: String,
    args: String,
}

fn bad(no: usize, msg: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("Dockerfile line {no}: {msg}"))
}

/// Joins continuation lines (a trailing `\`) and drops comments and blank lines.
fn logical_lines(text: &str) -> Vec<Line> {
    let mut out = Vec::new();
    let mut cur: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let no = i + 1;
        let trimmed = raw.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && cur.is_none()) {
            continue;
        }
        let (body, more) = match trimmed.strip_suffix('\\') {
            Some(b) => (b, true),
            None => (trimmed, false),
        };
        let (start, mut acc) = cur.take().unwrap_or((no, String::new()));
        if !acc.is_empty() && !body.is_empty() {
            acc.push(' ');
        }
        acc.push_str(body.trim());
        if more {
            cur = Some((start, acc));
        } else if !acc.is_empty() {
            out.push(split(start, acc));
        }
    }
    if let Some((start, acc)) = cur {
        if !acc.is_empty() {
            out.push(split(start, acc));
        }
    }
    out
}

fn split(no: usize, s: String) -> Line {
    let (word, args) = s.split_once(char::is_whitespace).unwrap_or((&s, ""));
    Line { no, word: word.to_ascii_uppercase(), args: args.trim().to_string() }
}

/// Words of a JSON array form (`["a", "b"]`), or `None` when `args` is not one.
fn json_form(no: usize, args: &str) -> Result<Option<Vec<String>>> {
    if !args.starts_with('[') {
        return Ok(None);
    }
    serde_json::from_str::<Vec<String>>(args)
        .map(Some)
        .map_err(|e| bad(no, format!("the JSON form is not an array of strings ({e})")))
}

/// Splits on whitespace, honouring double and single quotes and backslash escapes.
fn words(no: usize, s: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some('"'), '\\') | (None, '\\') => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            (Some(_), c) => cur.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (None, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        return Err(bad(no, "a quote is not closed"));
    }
    if in_word {
        out.push(cur);
    }
    Ok(out)
}

fn env_step(no: usize, args: &str) -> Result<Step> {
    let ws = words(no, args)?;
    let mut vars = BTreeMap::new();
    if ws.first().is_some_and(|w| !w.contains('=')) {
        // The old form: `ENV KEY the value`.
        let (key, rest) = args.split_once(char::is_whitespace).unwrap_or((args, ""));
        vars.insert(key.to_string(), rest.trim().to_string());
    } else {
        for w in ws {
            let (k, v) = w.split_once('=').ok_or_else(|| bad(no, format!("ENV {w:?} is not KEY=VALUE")))?;
            vars.insert(k.to_string(), v.to_string());
        }
    }
    Ok(Step::Env(vars))
}

fn join_dir(workdir: &str, p: &str) -> String {
    if p.starts_with('/') {
        p.to_string()
    } else if workdir.ends_with('/') {
        format!("{workdir}{p}")
    } else {
        format!("{workdir}/{p}")
    }
}

fn copy_steps(no: usize, args: &str, workdir: &str) -> Result<Vec<Step>> {
    if args.starts_with("--") {
        let flag = args.split_whitespace().next().unwrap_or(args);
        return Err(bad(
            no,
            format!(
                "COPY {flag} is not supported; COPY takes sources from the build context and a destination"
            ),
        ));
    }
    let mut ws = match json_form(no, args)? {
        Some(w) => w,
        None => words(no, args)?,
    };
    if ws.len() < 2 {
        return Err(bad(no, "COPY needs at least one source and a destination"));
    }
    let dest = ws.pop().unwrap_or_default();
    if ws.len() > 1 && !dest.ends_with('/') {
        return Err(bad(
            no,
            format!("COPY with several sources needs a destination directory ending in '/', not {dest:?}"),
        ));
    }
    let to = join_dir(workdir, &dest);
    ws.into_iter()
        .map(|src| {
            if src.contains(['*', '?', '[']) {
                return Err(bad(
                    no,
                    format!("COPY {src:?}: wildcards are not supported; name files or directories"),
                ));
            }
            // Docker reads a leading '/' in a source as the context's root.
            let src = src.trim_start_matches('/');
            let src = if src.is_empty() { "." } else { src };
            let step = Step::Upload { src: src.to_string(), to: to.clone() };
            step.validate().map_err(|e| bad(no, e))?;
            Ok(step)
        })
        .collect()
}

/// Parses a Dockerfile into a template called `name`.
pub fn parse(name: &str, text: &str) -> Result<TemplateSpec> {
    if text.len() > MAX_FILE_BYTES {
        return Err(Error::Invalid(format!(
            "the Dockerfile is {} bytes, over the limit of {MAX_FILE_BYTES}",
            text.len()
        )));
    }
    let lines = logical_lines(text);
    let Some(first) = lines.first() else {
        return Err(Error::Invalid("the Dockerfile has no instructions; start it with FROM".into()));
    };
    if first.word != "FROM" {
        return Err(bad(first.no, format!("{} before FROM; the first instruction must be FROM", first.word)));
    }
    let base = from_base(first)?;
    let mut steps = Vec::new();
    let mut workdir = "/".to_string();
    for l in &lines[1..] {
        if steps.len() > crate::MAX_STEPS {
            return Err(bad(l.no, format!("more than {} steps", crate::MAX_STEPS)));
        }
        let step = match l.word.as_str() {
            "RUN" if l.args.starts_with("<<") => {
                return Err(bad(l.no, "RUN heredocs are not supported; COPY a script and RUN it"))
            }
            "RUN" if l.args.starts_with("--") => {
                return Err(bad(l.no, "RUN flags (--mount, --network) are not supported"))
            }
            "RUN" => match json_form(l.no, &l.args)? {
                Some(w) => Step::Run(RunCmd::Argv(w)),
                None => Step::Run(RunCmd::Shell(l.args.clone())),
            },
            "COPY" => {
                steps.extend(copy_steps(l.no, &l.args, &workdir)?);
                continue;
            }
            "ENV" => env_step(l.no, &l.args)?,
            "WORKDIR" => {
                let w = words(l.no, &l.args)?;
                let [w] = w.as_slice() else { return Err(bad(l.no, "WORKDIR takes one path")) };
                workdir = join_dir(&workdir, w);
                Step::Workdir(workdir.clone())
            }
            "USER" => {
                if l.args.contains(':') {
                    return Err(bad(l.no, "USER with a group is not supported; name the user only"));
                }
                Step::User(l.args.clone())
            }
            "FROM" => return Err(bad(l.no, "a second FROM: multi-stage builds are not supported")),
            other => {
                return Err(bad(
                    l.no,
                    format!("{other} is not supported; this Dockerfile subset has {SUPPORTED}"),
                ))
            }
        };
        step.validate().map_err(|e| bad(l.no, e))?;
        steps.push(step);
    }
    let spec = TemplateSpec { name: name.to_string(), base, steps };
    spec.validate()?;
    Ok(spec)
}

fn from_base(l: &Line) -> Result<String> {
    let ws = words(l.no, &l.args)?;
    match ws.as_slice() {
        [b] if !b.starts_with("--") => {
            let spec = TemplateSpec { name: "x".into(), base: b.clone(), steps: Vec::new() };
            spec.base().map_err(|_| {
                bad(
                    l.no,
                    format!(
                        "FROM {b}: only this host's images and templates can be bases (no registry pulls): \
                         `default`, an image's name or a template's name"
                    ),
                )
            })?;
            Ok(b.clone())
        }
        _ => Err(bad(l.no, format!("FROM {}: write `FROM NAME` (no AS, no --platform)", l.args))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subset_parses() {
        let spec = parse(
            "app",
            "# a comment\nFROM default\nRUN apt-get update && \\\n    echo done\nRUN [\"python3\", \"-V\"]\n\
             WORKDIR /srv\nWORKDIR app\nCOPY . .\nCOPY a.py b.py lib/\nENV A=1 B=\"two words\"\nENV C the rest\nuser nobody\n",
        )
        .unwrap();
        assert_eq!(spec.base, "default");
        assert_eq!(
            spec.steps,
            vec![
                Step::Run(RunCmd::Shell("apt-get update && echo done".into())),
                Step::Run(RunCmd::Argv(vec!["python3".into(), "-V".into()])),
                Step::Workdir("/srv".into()),
                Step::Workdir("/srv/app".into()),
                Step::Upload { src: ".".into(), to: "/srv/app/.".into() },
                Step::Upload { src: "a.py".into(), to: "/srv/app/lib/".into() },
                Step::Upload { src: "b.py".into(), to: "/srv/app/lib/".into() },
                Step::Env([("A".to_string(), "1".to_string()), ("B".into(), "two words".into())].into()),
                Step::Env([("C".to_string(), "the rest".to_string())].into()),
                Step::User("nobody".into()),
            ]
        );
    }

    fn err(text: &str) -> String {
        parse("t", text).unwrap_err().to_string()
    }

    #[test]
    fn everything_else_is_refused_naming_the_line_and_instruction() {
        assert!(err("FROM default\n\nADD x /x\n").contains("line 3: ADD is not supported"));
        assert!(err("FROM default\nCMD [\"x\"]\n").contains("line 2: CMD"));
        assert!(err("RUN x\n").contains("line 1: RUN before FROM"));
        assert!(err("FROM python:3.12\n").contains("no registry pulls"));
        assert!(err("FROM default AS b\n").contains("no AS"));
        assert!(err("FROM default\nFROM default\n").contains("multi-stage"));
        assert!(err("FROM default\nCOPY ../etc/passwd /x\n").contains("leaves the build context"));
        assert!(err("FROM default\nCOPY --from=a x /x\n").contains("--from=a"));
        assert!(err("FROM default\nCOPY a b /x\n").contains("ending in '/'"));
        assert!(err("FROM default\nCOPY *.py /x/\n").contains("wildcards"));
        assert!(err("FROM default\nRUN [\"a\", 1]\n").contains("array of strings"));
        assert!(err("FROM default\nENV A=\"x\n").contains("quote"));
        assert!(err("FROM default\nENV 1A=x\n").contains("line 2"));
        assert!(err("FROM default\nUSER a:b\n").contains("group"));
        assert!(err("FROM default\nRUN <<EOF\n").contains("heredocs"));
        assert!(err("").contains("no instructions"));
    }

    proptest::proptest! {
        #[test]
        fn any_text_parses_or_is_refused_without_panicking(text in ".{0,400}") {
            let _ = parse("t", &text);
            let _ = crate::parse_toml(&text);
        }

        #[test]
        fn dockerfile_shaped_text_never_panics(lines in proptest::collection::vec(
            "(FROM|RUN|COPY|ENV|WORKDIR|USER|ADD|#) [ -~]{0,40}\\\\?", 0..12)) {
            let _ = parse("t", &lines.join("\n"));
        }
    }
}
