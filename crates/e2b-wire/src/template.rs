//! E2B's template build start (`POST /v2/templates/{id}/builds/{buildID}`, the SDK's
//! `TemplateBuildStartV2`; `docs/e2b.md`) read as hostile client input into a typed [`Plan`]
//! ([`plan`]). The plan holds the steps branchbox's templates express: the base (`fromImage`:
//! E2B's base image or one of the host's images by name; `fromTemplate`), `RUN` (with its
//! optional user), `COPY` (its files come as an archive: [`crate::template_files`]), `ENV`,
//! `WORKDIR`, `USER`, and the start and ready commands. Anything else (a registry image,
//! registry credentials, `force`/skip_cache, a COPY's owner or mode, a wildcard source, an
//! unknown step type or field) is refused with a message naming the step and what to change.
//! branchboxd maps the plan onto its own template definition (and checks names and each step
//! against that definition's rules); this module knows nothing of it. Pure, unit-tested below
//! and fuzzed (`fuzz/fuzz_targets/e2b_template_steps.rs`).

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Component, Path};

/// The body of E2B's build start. Unknown fields are refused by name (serde's message).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BuildStart {
    from_image: Option<String>,
    from_template: Option<String>,
    from_image_registry: Option<serde_json::Value>,
    start_cmd: Option<String>,
    ready_cmd: Option<String>,
    #[serde(default)]
    steps: Vec<E2bStep>,
    #[serde(default)]
    force: bool,
}

/// One of E2B's steps (`TemplateStep`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct E2bStep {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    force: bool,
    files_hash: Option<String>,
    force_upload: Option<bool>,
}

/// What a build starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Base {
    /// E2B's base image (`e2bdev/base`), `fromTemplate` `base` or `default`, or nothing given:
    /// the host's default image.
    Default,
    /// `fromTemplate`: another template, by the name as sent (not yet checked as a name).
    Template(String),
    /// `fromImage` naming one of the host's images: a bare name, without `/`, `:` or `@` (not
    /// yet checked as a name; [`not_pulled`] is the refusal for one that is not a name).
    Image(String),
}

/// One step of the plan, in the order it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// A shell command, run as the current user in the current directory.
    Run(String),
    /// The user the following steps run as.
    User(String),
    /// A COPY: `src` is the path in the build's context (the COPY's [`Copy::dir`], then the
    /// source as normalized), `to` the absolute destination (a trailing `/` kept).
    Upload { src: String, to: String },
    /// Environment variables for the following steps.
    Env(BTreeMap<String, String>),
    /// The absolute working directory of the following steps.
    Workdir(String),
}

/// A COPY step's files: which upload, and where in the build's context they are unpacked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copy {
    /// E2B's step number (1-based), for messages.
    pub step: usize,
    /// E2B's files hash (64 lowercase hex digits), which the upload must match.
    pub hash: String,
    /// The source as E2B's SDK sent it (part of the hash).
    pub src: String,
    /// The destination as sent (part of the hash).
    pub dest: String,
    /// The directory, relative to the build's context, the archive is unpacked into.
    pub dir: String,
}

/// What a build start becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// What the build starts from.
    pub base: Base,
    /// The steps, each with E2B's step number (as text, as the SDK reads a failed build's
    /// `reason.step`); one E2B step may become several (a RUN as another user).
    pub ops: Vec<(String, Op)>,
    /// The COPY steps' uploads.
    pub copies: Vec<Copy>,
    /// The command started in the background once the steps ran (not empty).
    pub start_cmd: Option<String>,
    /// The command that must succeed before the template is ready (not empty).
    pub ready_cmd: Option<String>,
}

/// E2B's default base image (`Template()`, `from_base_image()`), which is the host's default
/// image.
const E2B_BASE_IMAGES: [&str; 2] = ["e2bdev/base", "e2bdev/base:latest"];

fn refuse(step: &str, what: &str) -> String {
    format!("{step}: {what}")
}

/// The refusal of a `fromImage` that is not one of the host's images by name.
pub fn not_pulled(image: &str) -> String {
    refuse(
        &format!("fromImage {:?}", image.chars().take(128).collect::<String>()),
        "branchbox does not pull images from registries; start from from_base_image() (branchbox's \
         default image), from_template(NAME), or from_image(NAME) naming an image on this host",
    )
}

/// The base: E2B's base image is the default image; a bare name is one of the host's images;
/// a registry reference is refused (branchbox does not pull images).
fn base_of(b: &BuildStart) -> Result<Base, String> {
    if b.from_image_registry.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(refuse(
            "fromImageRegistry",
            "registry credentials are not served: branchbox does not pull images from registries",
        ));
    }
    match (&b.from_template, &b.from_image) {
        (Some(_), Some(_)) => Err("give fromImage or fromTemplate, not both".into()),
        (Some(t), None) if t == "base" || t == "default" => Ok(Base::Default),
        (Some(t), None) => Ok(Base::Template(t.clone())),
        (None, Some(i)) if E2B_BASE_IMAGES.contains(&i.as_str()) => Ok(Base::Default),
        (None, Some(i)) if !i.contains(['/', ':', '@']) => Ok(Base::Image(i.clone())),
        (None, Some(i)) => Err(not_pulled(i)),
        (None, None) => Ok(Base::Default),
    }
}

/// A COPY source, normalized as E2B's SDK names it in the archive (no `./`); wildcards and
/// paths leaving the context are refused.
fn copy_source(step: &str, src: &str) -> Result<String, String> {
    if src.contains(['*', '?', '[', '{']) {
        return Err(refuse(step, "a wildcard source is not served; copy each file or directory by name"));
    }
    let mut parts = Vec::new();
    for c in Path::new(src).components() {
        match c {
            Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
            Component::CurDir => {}
            _ => {
                return Err(refuse(step, "the source must be a path inside the build context, without '..'"))
            }
        }
    }
    Ok(if parts.is_empty() { ".".into() } else { parts.join("/") })
}

/// Whether `h` is a files hash as the SDK sends it.
pub fn is_hash(h: &str) -> bool {
    h.len() == 64 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `path` taken from the working directory `wd` (the root when none), as Docker does.
fn from_workdir(wd: &Option<String>, path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{}/{path}", wd.as_deref().unwrap_or("/").trim_end_matches('/'))
    }
}

/// Reads E2B's build start into a plan, or says which step or option is not served and why.
pub fn plan(b: &BuildStart) -> Result<Plan, String> {
    let base = base_of(b)?;
    if b.force {
        return Err(refuse(
            "force",
            "skip_cache is not served: branchbox reuses a step's cached result whenever it and every \
             step before it are unchanged; change the step (or a COPY's files) to rebuild it",
        ));
    }
    let mut ops = Vec::new();
    let mut copies = Vec::new();
    let (mut user, mut workdir): (Option<String>, Option<String>) = (None, None);
    for (i, s) in b.steps.iter().enumerate() {
        let n = i + 1;
        let label = n.to_string();
        let kind: String = s.kind.chars().take(32).collect();
        let at = format!("step {n} ({kind})");
        if s.files_hash.is_some() && s.kind != "COPY" {
            return Err(refuse(&at, "filesHash belongs to a COPY step"));
        }
        if s.force && !(s.kind == "COPY" && s.force_upload == Some(true)) {
            return Err(refuse(&at, "force (skip_cache) is not served: branchbox reuses unchanged steps"));
        }
        let args: Vec<&str> = s.args.iter().map(String::as_str).collect();
        let mut push = |op: Op| ops.push((label.clone(), op));
        match (s.kind.as_str(), args.as_slice()) {
            ("RUN", [cmd]) => push(Op::Run(cmd.to_string())),
            ("RUN", [cmd, as_user]) => {
                let now = user.clone().unwrap_or_else(|| "root".into());
                if *as_user == now || as_user.is_empty() {
                    push(Op::Run(cmd.to_string()));
                } else {
                    push(Op::User(as_user.to_string()));
                    push(Op::Run(cmd.to_string()));
                    push(Op::User(now));
                }
            }
            ("COPY", [src, dest, owner, mode]) => {
                if !owner.is_empty() {
                    return Err(refuse(
                        &at,
                        "an owner (user) for copied files is not served; chown them in a RUN step",
                    ));
                }
                if !mode.is_empty() {
                    return Err(refuse(
                        &at,
                        "a mode for copied files is not served; chmod them in a RUN step",
                    ));
                }
                let hash = s
                    .files_hash
                    .clone()
                    .filter(|h| is_hash(h))
                    .ok_or_else(|| refuse(&at, "filesHash must be the 64 hex digits the SDK computed"))?;
                let rel = copy_source(&at, src)?;
                let dir = format!("s{n}");
                push(Op::Upload { src: format!("{dir}/{rel}"), to: from_workdir(&workdir, dest) });
                copies.push(Copy { step: n, hash, src: src.to_string(), dest: dest.to_string(), dir });
            }
            ("ENV", kv) if !kv.is_empty() && kv.len() % 2 == 0 => {
                push(Op::Env(kv.chunks(2).map(|p| (p[0].to_string(), p[1].to_string())).collect()));
            }
            ("WORKDIR", [dir]) => {
                let abs = from_workdir(&workdir, dir);
                workdir = Some(abs.clone());
                push(Op::Workdir(abs));
            }
            ("USER", [u]) => {
                user = Some(u.to_string());
                push(Op::User(u.to_string()));
            }
            ("RUN" | "COPY" | "ENV" | "WORKDIR" | "USER", _) => {
                return Err(refuse(&at, &format!("{} arguments is not a form branchbox serves", args.len())));
            }
            _ => return Err(refuse(
                &at,
                "this step type is not served; branchbox's templates take RUN, COPY, ENV, WORKDIR and USER",
            )),
        }
    }
    for (what, cmd) in [("startCmd", &b.start_cmd), ("readyCmd", &b.ready_cmd)] {
        if cmd.as_deref().is_some_and(|c| c.trim().is_empty()) {
            return Err(refuse(what, "the command is empty"));
        }
    }
    Ok(Plan { base, ops, copies, start_cmd: b.start_cmd.clone(), ready_cmd: b.ready_cmd.clone() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(v: serde_json::Value) -> Result<Plan, String> {
        let b: BuildStart = serde_json::from_value(v).map_err(|e| e.to_string())?;
        plan(&b)
    }

    const H: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn every_served_step_becomes_an_op_with_its_step_number() {
        let p = start(serde_json::json!({
            "fromImage": "e2bdev/base", "force": false,
            "steps": [
                {"type": "RUN", "args": ["echo hi"], "force": false},
                {"type": "COPY", "args": ["./app/a.txt", "/srv/", "", ""], "force": false, "filesHash": H},
                {"type": "ENV", "args": ["A", "1", "B", "2"], "force": false},
                {"type": "WORKDIR", "args": ["/srv"], "force": false},
                {"type": "RUN", "args": ["id", "user"], "force": false},
                {"type": "USER", "args": ["user"], "force": false},
                {"type": "RUN", "args": ["id", "user"], "force": false},
            ],
            "startCmd": "sleep 100", "readyCmd": "true",
        }))
        .unwrap();
        assert_eq!(p.base, Base::Default);
        let labels: Vec<&str> = p.ops.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(labels, ["1", "2", "3", "4", "5", "5", "5", "6", "7"]);
        assert_eq!(p.ops[1].1, Op::Upload { src: "s2/app/a.txt".into(), to: "/srv/".into() });
        assert_eq!(p.ops[2].1, Op::Env([("A".into(), "1".into()), ("B".into(), "2".into())].into()));
        assert_eq!(p.ops[4].1, Op::User("user".into()));
        assert_eq!(p.ops[5].1, Op::Run("id".into()));
        assert_eq!(p.ops[6].1, Op::User("root".into()));
        assert_eq!(p.ops[8].1, Op::Run("id".into()), "a RUN as the current user switches no user");
        assert_eq!(
            p.copies,
            [Copy {
                step: 2,
                hash: H.into(),
                src: "./app/a.txt".into(),
                dest: "/srv/".into(),
                dir: "s2".into()
            }]
        );
        assert_eq!((p.start_cmd.as_deref(), p.ready_cmd.as_deref()), (Some("sleep 100"), Some("true")));
    }

    #[test]
    fn refused_steps_and_options_are_named() {
        let cases = [
            (serde_json::json!({"steps": [{"type": "ADD", "args": ["x"]}]}), "step 1 (ADD)"),
            (serde_json::json!({"fromImage": "python:3", "steps": []}), "fromImage \"python:3\""),
            (serde_json::json!({"fromImage": "a", "fromTemplate": "b"}), "not both"),
            (serde_json::json!({"fromImageRegistry": {"type": "registry"}}), "fromImageRegistry"),
            (serde_json::json!({"force": true}), "force"),
            (serde_json::json!({"steps": [{"type": "RUN", "args": ["x"], "force": true}]}), "step 1 (RUN)"),
            (
                serde_json::json!({"steps": [{"type": "RUN", "args": ["x"], "filesHash": H}]}),
                "belongs to a COPY",
            ),
            (
                serde_json::json!({"steps": [{"type": "COPY", "args": ["a", "/b", "user", ""], "filesHash": H}]}),
                "step 1 (COPY): an owner",
            ),
            (
                serde_json::json!({"steps": [{"type": "COPY", "args": ["a", "/b", "", "0755"], "filesHash": H}]}),
                "step 1 (COPY): a mode",
            ),
            (
                serde_json::json!({"steps": [{"type": "COPY", "args": ["*.py", "/b", "", ""], "filesHash": H}]}),
                "wildcard",
            ),
            (
                serde_json::json!({"steps": [{"type": "COPY", "args": ["../x", "/b", "", ""], "filesHash": H}]}),
                "'..'",
            ),
            (
                serde_json::json!({"steps": [{"type": "COPY", "args": ["a", "/b", "", ""], "filesHash": "zz"}]}),
                "filesHash",
            ),
            (serde_json::json!({"steps": [{"type": "COPY", "args": ["a", "/b", "", ""]}]}), "filesHash"),
            (serde_json::json!({"steps": [{"type": "ENV", "args": ["A"]}]}), "step 1 (ENV)"),
            (serde_json::json!({"steps": [{"type": "USER", "args": []}]}), "0 arguments"),
            (serde_json::json!({"steps": [{"type": "RUN", "args": ["x"], "mystery": 1}]}), "mystery"),
            (serde_json::json!({"readyCmd": " "}), "readyCmd"),
            (serde_json::json!({"cpuCount": 2}), "cpuCount"),
        ];
        for (body, want) in cases {
            let e = start(body.clone()).err().unwrap_or_else(|| panic!("{body} was accepted"));
            assert!(e.contains(want), "{body}: {e:?} does not name {want:?}");
        }
    }

    #[test]
    fn bases_are_the_default_image_host_images_and_templates() {
        let base = |v| start(v).unwrap().base;
        assert_eq!(base(serde_json::json!({})), Base::Default);
        assert_eq!(base(serde_json::json!({"fromImage": "e2bdev/base:latest"})), Base::Default);
        assert_eq!(base(serde_json::json!({"fromImage": "minimal"})), Base::Image("minimal".into()));
        assert_eq!(base(serde_json::json!({"fromTemplate": "web"})), Base::Template("web".into()));
        assert_eq!(base(serde_json::json!({"fromTemplate": "base"})), Base::Default);
        assert_eq!(base(serde_json::json!({"fromImageRegistry": null})), Base::Default);
    }

    #[test]
    fn relative_workdirs_and_destinations_join_the_working_directory() {
        let p = start(serde_json::json!({"steps": [
            {"type": "COPY", "args": [".", "conf", "", ""], "filesHash": H},
            {"type": "WORKDIR", "args": ["/srv/"]},
            {"type": "WORKDIR", "args": ["app"]},
            {"type": "COPY", "args": ["a", "conf/", "", ""], "filesHash": H},
        ]}))
        .unwrap();
        assert_eq!(p.ops[0].1, Op::Upload { src: "s1/.".into(), to: "/conf".into() });
        assert_eq!(p.ops[2].1, Op::Workdir("/srv/app".into()));
        assert_eq!(p.ops[3].1, Op::Upload { src: "s4/a".into(), to: "/srv/app/conf/".into() });
    }

    #[test]
    fn arbitrary_json_never_panics() {
        let samples = [
            "{}",
            "{\"steps\":[{\"type\":\"RUN\",\"args\":[]}]}",
            "{\"steps\":[{\"type\":\"\u{0}\",\"args\":[\"\u{0}\"]}]}",
            "{\"steps\":[{\"type\":\"WORKDIR\",\"args\":[\"\"]}]}",
            "{\"steps\":[{\"type\":\"USER\",\"args\":[\"a b\"]}]}",
            "{\"steps\":[{\"type\":\"ééééééééééééééééééééééééééééééééééé\",\"args\":[]}]}",
            "{\"startCmd\":\"\",\"readyCmd\":\"\"}",
            "{\"fromTemplate\":\"\"}",
            "{\"fromImage\":\"\"}",
        ];
        for s in samples {
            if let Ok(b) = serde_json::from_str::<BuildStart>(s) {
                let _ = plan(&b);
            }
        }
    }
}
