//! E2B's template build (`POST /v2/templates/{id}/builds/{buildID}`, the SDK's
//! `TemplateBuildStartV2`) read into branchbox's own template definition
//! ([`branchbox_template::TemplateSpec`]), for the steps branchbox's templates express: the
//! base (`fromImage`: E2B's base image or one of this host's images by name; `fromTemplate`),
//! `RUN` (with its optional user), `COPY` (files uploaded through the link the service hands
//! out: `template_files.rs`), `ENV`, `WORKDIR`, `USER`, and the start and ready commands.
//! Anything else (a registry image, registry credentials, `force`/skip_cache, a COPY's owner or
//! mode, a wildcard source, an unknown step type or field) is refused with a message naming
//! the step and what to change. Pure: no sandbox, no files (unit-tested below).

use branchbox_template::{RunCmd, Step, TemplateSpec};
use serde::Deserialize;
use std::collections::BTreeMap;

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

/// A COPY step's files: which upload, and where in the build's context they are unpacked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copy {
    /// E2B's step number (1-based), for messages.
    pub step: usize,
    /// E2B's files hash (64 hex digits), which the upload must match.
    pub hash: String,
    /// The source as E2B's SDK sent it (part of the hash).
    pub src: String,
    /// The destination as sent (part of the hash).
    pub dest: String,
    /// The directory, relative to the build's context, the archive is unpacked into.
    pub dir: String,
}

/// What a build start becomes.
#[derive(Debug)]
pub struct Plan {
    /// branchbox's definition.
    pub spec: TemplateSpec,
    /// E2B's name for each of the definition's steps, index 0 being the base: `base`, E2B's
    /// step number, or `finalize` (the start and ready commands), as the SDK reads a failed
    /// build's `reason.step`.
    pub labels: Vec<String>,
    /// The COPY steps' uploads.
    pub copies: Vec<Copy>,
}

/// E2B's default base image (`Template()`, `from_base_image()`), which is branchbox's default
/// image here.
const E2B_BASE_IMAGES: [&str; 2] = ["e2bdev/base", "e2bdev/base:latest"];

/// How long a build waits for the ready command to succeed, in tries 0.2 s apart (120 s).
const READY_TRIES: u32 = 600;

/// Where the start command's output goes in the sandbox.
pub const START_LOG: &str = "/tmp/.e2b-start.log";

fn refuse(step: &str, what: &str) -> String {
    format!("{step}: {what}")
}

/// The base: E2B's base image is the default image; a bare name is one of this host's images;
/// a registry reference is refused (branchbox does not pull images).
fn base_of(b: &BuildStart) -> Result<String, String> {
    if b.from_image_registry.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(refuse(
            "fromImageRegistry",
            "registry credentials are not served: branchbox does not pull images from registries",
        ));
    }
    match (&b.from_template, &b.from_image) {
        (Some(_), Some(_)) => Err("give fromImage or fromTemplate, not both".into()),
        (Some(t), None) => {
            branchbox_model::Name::parse("fromTemplate", t).map_err(|e| e.to_string())?;
            Ok(if t == "base" || t == "default" {
                branchbox_template::DEFAULT_IMAGE.to_string()
            } else {
                format!("template:{t}")
            })
        }
        (None, Some(i)) if E2B_BASE_IMAGES.contains(&i.as_str()) => {
            Ok(branchbox_template::DEFAULT_IMAGE.to_string())
        }
        (None, Some(i))
            if !i.contains(['/', ':', '@']) && branchbox_model::Name::parse("image", i).is_ok() =>
        {
            Ok(format!("image:{i}"))
        }
        (None, Some(i)) => Err(refuse(
            &format!("fromImage {:?}", i.chars().take(128).collect::<String>()),
            "branchbox does not pull images from registries; start from from_base_image() (branchbox's \
             default image), from_template(NAME), or from_image(NAME) naming an image on this host",
        )),
        (None, None) => Ok(branchbox_template::DEFAULT_IMAGE.to_string()),
    }
}

/// A COPY source, normalized as E2B's SDK names it in the archive (no `./`); wildcards and
/// paths leaving the context are refused.
fn copy_source(step: &str, src: &str) -> Result<String, String> {
    if src.contains(['*', '?', '[', '{']) {
        return Err(refuse(step, "a wildcard source is not served; copy each file or directory by name"));
    }
    let mut parts = Vec::new();
    for c in std::path::Path::new(src).components() {
        match c {
            std::path::Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
            std::path::Component::CurDir => {}
            _ => {
                return Err(refuse(step, "the source must be a path inside the build context, without '..'"))
            }
        }
    }
    Ok(if parts.is_empty() { ".".into() } else { parts.join("/") })
}

fn is_hash(h: &str) -> bool {
    h.len() == 64 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The build's steps, and for each its E2B label.
struct Steps {
    steps: Vec<Step>,
    labels: Vec<String>,
    user: Option<String>,
    workdir: Option<String>,
}

impl Steps {
    fn push(&mut self, label: &str, s: Step) -> Result<(), String> {
        s.validate().map_err(|e| refuse(&format!("step {label}"), &e.to_string()))?;
        self.steps.push(s);
        self.labels.push(label.to_string());
        Ok(())
    }
}

/// Reads E2B's build start into branchbox's definition of template `name`.
pub fn plan(name: &str, b: BuildStart) -> Result<Plan, String> {
    let base = base_of(&b)?;
    if b.force {
        return Err(refuse(
            "force",
            "skip_cache is not served: branchbox reuses a step's cached result whenever it and every \
             step before it are unchanged; change the step (or a COPY's files) to rebuild it",
        ));
    }
    let mut out = Steps { steps: Vec::new(), labels: vec!["base".into()], user: None, workdir: None };
    let mut copies = Vec::new();
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
        match (s.kind.as_str(), args.as_slice()) {
            ("RUN", [cmd]) => out.push(&label, Step::Run(RunCmd::Shell(cmd.to_string())))?,
            ("RUN", [cmd, user]) => {
                let now = out.user.clone().unwrap_or_else(|| "root".into());
                if *user == now || user.is_empty() {
                    out.push(&label, Step::Run(RunCmd::Shell(cmd.to_string())))?;
                } else {
                    out.push(&label, Step::User(user.to_string()))?;
                    out.push(&label, Step::Run(RunCmd::Shell(cmd.to_string())))?;
                    out.push(&label, Step::User(now))?;
                }
            }
            ("COPY", [src, dest, user, mode]) => {
                if !user.is_empty() {
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
                let to = if dest.starts_with('/') {
                    dest.to_string()
                } else {
                    // Relative destinations are taken from the working directory, as Docker does.
                    let wd = out.workdir.clone().unwrap_or_else(|| "/".into());
                    format!("{}/{dest}", wd.trim_end_matches('/'))
                };
                out.push(&label, Step::Upload { src: format!("{dir}/{rel}"), to })?;
                copies.push(Copy { step: n, hash, src: src.to_string(), dest: dest.to_string(), dir });
            }
            ("ENV", kv) if !kv.is_empty() && kv.len() % 2 == 0 => {
                let vars: BTreeMap<String, String> =
                    kv.chunks(2).map(|p| (p[0].to_string(), p[1].to_string())).collect();
                out.push(&label, Step::Env(vars))?;
            }
            ("WORKDIR", [dir]) => {
                let abs = if dir.starts_with('/') {
                    dir.to_string()
                } else {
                    let wd = out.workdir.clone().unwrap_or_else(|| "/".into());
                    format!("{}/{dir}", wd.trim_end_matches('/'))
                };
                out.workdir = Some(abs.clone());
                out.push(&label, Step::Workdir(abs))?;
            }
            ("USER", [user]) => {
                out.user = Some(user.to_string());
                out.push(&label, Step::User(user.to_string()))?;
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
    if let Some(start) = &b.start_cmd {
        // Started in the background; the snapshot after the ready check keeps it running, so
        // every sandbox made from the template starts with it already up.
        let line = format!("(\n{start}\n) </dev/null >>{START_LOG} 2>&1 &");
        out.push("finalize", Step::Run(RunCmd::Shell(line)))?;
    }
    if let Some(ready) = &b.ready_cmd {
        let line = format!(
            "i=0\nuntil (\n{ready}\n) >/tmp/.e2b-ready.log 2>&1; do\n  i=$((i+1))\n  if [ \"$i\" -ge {READY_TRIES} ]; then\n    \
             echo 'the ready command did not succeed within 120 s; its last output:' >&2\n    \
             cat /tmp/.e2b-ready.log >&2\n    exit 1\n  fi\n  sleep 0.2\ndone"
        );
        out.push("finalize", Step::Run(RunCmd::Shell(line)))?;
    }
    let spec = TemplateSpec { name: name.to_string(), base, steps: out.steps };
    spec.validate().map_err(|e| e.to_string())?;
    Ok(Plan { spec, labels: out.labels, copies })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(v: serde_json::Value) -> Result<Plan, String> {
        let b: BuildStart = serde_json::from_value(v).map_err(|e| e.to_string())?;
        plan("t1", b)
    }

    const H: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn every_served_step_maps_onto_a_template_step_with_its_label() {
        let p = start(serde_json::json!({
            "fromImage": "e2bdev/base", "force": false,
            "steps": [
                {"type": "RUN", "args": ["echo hi"], "force": false},
                {"type": "COPY", "args": ["./app/a.txt", "/srv/", "", ""], "force": false, "filesHash": H},
                {"type": "ENV", "args": ["A", "1", "B", "2"], "force": false},
                {"type": "WORKDIR", "args": ["/srv"], "force": false},
                {"type": "RUN", "args": ["id", "user"], "force": false},
                {"type": "USER", "args": ["user"], "force": false},
            ],
            "startCmd": "sleep 100", "readyCmd": "true",
        }))
        .unwrap();
        assert_eq!(p.spec.base, "default");
        assert_eq!(p.spec.steps[1], Step::Upload { src: "s2/app/a.txt".into(), to: "/srv/".into() });
        assert_eq!(p.spec.steps[4], Step::User("user".into()));
        assert_eq!(p.spec.steps[6], Step::User("root".into()));
        assert_eq!(p.labels, ["base", "1", "2", "3", "4", "5", "5", "5", "6", "finalize", "finalize"]);
        assert_eq!(p.copies[0].src, "./app/a.txt");
        assert_eq!(p.copies[0].dir, "s2");
        assert_eq!(p.labels.len(), p.spec.steps.len() + 1);
    }

    #[test]
    fn refused_steps_and_options_are_named() {
        let cases = [
            (serde_json::json!({"steps": [{"type": "ADD", "args": ["x"]}]}), "step 1 (ADD)"),
            (serde_json::json!({"fromImage": "python:3", "steps": []}), "fromImage \"python:3\""),
            (serde_json::json!({"fromImageRegistry": {"type": "registry"}}), "fromImageRegistry"),
            (serde_json::json!({"force": true}), "force"),
            (serde_json::json!({"steps": [{"type": "RUN", "args": ["x"], "force": true}]}), "step 1 (RUN)"),
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
            (serde_json::json!({"steps": [{"type": "ENV", "args": ["A"]}]}), "step 1 (ENV)"),
            (serde_json::json!({"steps": [{"type": "ENV", "args": ["1A", "x"]}]}), "step 1"),
            (serde_json::json!({"steps": [{"type": "RUN", "args": ["x"], "mystery": 1}]}), "mystery"),
            (serde_json::json!({"cpuCount": 2}), "cpuCount"),
        ];
        for (body, want) in cases {
            let e = start(body.clone()).err().unwrap_or_else(|| panic!("{body} was accepted"));
            assert!(e.contains(want), "{body}: {e:?} does not name {want:?}");
        }
    }

    #[test]
    fn bases_map_to_the_default_image_host_images_and_templates() {
        let base = |v| start(v).unwrap().spec.base;
        assert_eq!(base(serde_json::json!({})), "default");
        assert_eq!(base(serde_json::json!({"fromImage": "e2bdev/base:latest"})), "default");
        assert_eq!(base(serde_json::json!({"fromImage": "minimal"})), "image:minimal");
        assert_eq!(base(serde_json::json!({"fromTemplate": "web"})), "template:web");
        assert_eq!(base(serde_json::json!({"fromTemplate": "base"})), "default");
    }

    #[test]
    fn relative_workdirs_and_destinations_join_the_working_directory() {
        let p = start(serde_json::json!({"steps": [
            {"type": "WORKDIR", "args": ["/srv"]},
            {"type": "WORKDIR", "args": ["app"]},
            {"type": "COPY", "args": ["a", "conf/", "", ""], "filesHash": H},
        ]}))
        .unwrap();
        assert_eq!(p.spec.steps[1], Step::Workdir("/srv/app".into()));
        assert_eq!(p.spec.steps[2], Step::Upload { src: "s3/a".into(), to: "/srv/app/conf/".into() });
    }

    #[test]
    fn arbitrary_json_never_panics() {
        let samples = [
            "{}",
            "{\"steps\":[{\"type\":\"RUN\",\"args\":[]}]}",
            "{\"steps\":[{\"type\":\"\u{0}\",\"args\":[\"\u{0}\"]}]}",
            "{\"steps\":[{\"type\":\"WORKDIR\",\"args\":[\"\"]}]}",
            "{\"steps\":[{\"type\":\"USER\",\"args\":[\"a b\"]}]}",
            "{\"startCmd\":\"\",\"readyCmd\":\"\"}",
            "{\"fromTemplate\":\"\"}",
            "{\"fromImage\":\"\"}",
        ];
        for s in samples {
            if let Ok(b) = serde_json::from_str::<BuildStart>(s) {
                let _ = plan("t1", b);
            }
        }
    }
}
