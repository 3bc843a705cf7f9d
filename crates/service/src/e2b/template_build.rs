//! E2B's template build (`POST /v2/templates/{id}/builds/{buildID}`, the SDK's
//! `TemplateBuildStartV2`) mapped onto branchbox's own template definition
//! ([`branchbox_template::TemplateSpec`]). The body is read and refused by name in
//! [`branchbox_e2b_wire::template`] (pure, fuzzed): this module maps its plan's base and steps
//! onto the definition's, checks each against the definition's rules (naming E2B's step), and
//! turns the start and ready commands into the build's last steps. Pure: no sandbox, no files
//! (unit-tested below).

use branchbox_e2b_wire::template::{self as wire, Base, Op};
use branchbox_model::Limits;
use branchbox_template::{RunCmd, Step, TemplateSpec};

pub use branchbox_e2b_wire::template::{BuildStart, Copy};

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

/// How long a build waits for the ready command to succeed, in tries 0.2 s apart (120 s).
const READY_TRIES: u32 = 600;

/// Where the start command's output goes in the sandbox.
pub const START_LOG: &str = "/tmp/.e2b-start.log";

/// The base's image reference: a template or host image must be a valid name.
fn base_of(base: Base) -> Result<String, String> {
    Ok(match base {
        Base::Default => branchbox_template::DEFAULT_IMAGE.to_string(),
        Base::Template(t) => {
            branchbox_model::Name::parse("fromTemplate", &t).map_err(|e| e.to_string())?;
            format!("template:{t}")
        }
        Base::Image(i) => {
            branchbox_model::Name::parse("image", &i).map_err(|_| wire::not_pulled(&i))?;
            format!("image:{i}")
        }
    })
}

/// The build's steps, and for each its E2B label.
struct Steps {
    steps: Vec<Step>,
    labels: Vec<String>,
}

impl Steps {
    fn push(&mut self, label: &str, s: Step) -> Result<(), String> {
        s.validate().map_err(|e| format!("step {label}: {e}"))?;
        self.steps.push(s);
        self.labels.push(label.to_string());
        Ok(())
    }
}

/// Reads E2B's build start into branchbox's definition of template `name`. E2B's own refusals
/// (in the order of its steps) come first, then the base's name and each step against the
/// definition's rules.
pub fn plan(name: &str, b: BuildStart) -> Result<Plan, String> {
    let p = wire::plan(&b)?;
    let base = base_of(p.base)?;
    let mut out = Steps { steps: Vec::new(), labels: vec!["base".into()] };
    for (label, op) in p.ops {
        let step = match op {
            Op::Run(cmd) => Step::Run(RunCmd::Shell(cmd)),
            Op::User(u) => Step::User(u),
            Op::Upload { src, to } => Step::Upload { src, to },
            Op::Env(vars) => Step::Env(vars),
            Op::Workdir(dir) => Step::Workdir(dir),
        };
        out.push(&label, step)?;
    }
    if let Some(start) = &p.start_cmd {
        // Started in the background; the snapshot after the ready check keeps it running, so
        // every sandbox made from the template starts with it already up.
        let line = format!("(\n{start}\n) </dev/null >>{START_LOG} 2>&1 &");
        out.push("finalize", Step::Run(RunCmd::Shell(line)))?;
    }
    if let Some(ready) = &p.ready_cmd {
        let line = format!(
            "i=0\nuntil (\n{ready}\n) >/tmp/.e2b-ready.log 2>&1; do\n  i=$((i+1))\n  if [ \"$i\" -ge {READY_TRIES} ]; then\n    \
             echo 'the ready command did not succeed within 120 s; its last output:' >&2\n    \
             cat /tmp/.e2b-ready.log >&2\n    exit 1\n  fi\n  sleep 0.2\ndone"
        );
        out.push("finalize", Step::Run(RunCmd::Shell(line)))?;
    }
    let spec = TemplateSpec { name: name.to_string(), base, steps: out.steps };
    spec.validate().map_err(|e| e.to_string())?;
    Ok(Plan { spec, labels: out.labels, copies: p.copies })
}

/// The limits of a template's sandboxes from E2B's build request: the service's, with
/// `cpuCount` and `memoryMB` (MiB) where given, each checked against the bounds of branchbox's
/// own create ([`Limits::validate`]); an error names the field. None when neither is given.
pub fn limits(
    cpu_count: Option<&serde_json::Number>,
    memory_mb: Option<&serde_json::Number>,
    service: Limits,
) -> Result<Option<Limits>, String> {
    if cpu_count.is_none() && memory_mb.is_none() {
        return Ok(None);
    }
    let whole = |what: &str, n: Option<&serde_json::Number>, or: u64| match n {
        None => Ok(or),
        Some(n) => n.as_u64().ok_or_else(|| format!("{what} must be a whole number, not {n}")),
    };
    let cpus = whole("cpuCount", cpu_count, service.cpus.into())?;
    let cpus =
        u32::try_from(cpus).map_err(|_| format!("cpuCount: cpu limit {cpus} is out of range (1..1024)"))?;
    let with_cpus = Limits { cpus, ..service };
    with_cpus.validate().map_err(|e| format!("cpuCount: {e}"))?;
    let both = Limits { memory_mib: whole("memoryMB", memory_mb, service.memory_mib)?, ..with_cpus };
    both.validate().map_err(|e| format!("memoryMB: {e}"))?;
    Ok(Some(both))
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
            (serde_json::json!({"fromImage": "-x"}), "fromImage \"-x\": branchbox does not pull"),
            (serde_json::json!({"fromTemplate": ".."}), "invalid fromTemplate"),
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
    fn limits_take_cpu_count_and_memory_mb_within_creates_bounds() {
        let service = Limits { memory_mib: 1024, cpus: 1, pids: 512 };
        let of = |c: serde_json::Value, m: serde_json::Value| {
            let n = |v: serde_json::Value| serde_json::from_value::<Option<serde_json::Number>>(v).unwrap();
            limits(n(c).as_ref(), n(m).as_ref(), service)
        };
        use serde_json::json;
        assert_eq!(of(json!(null), json!(null)), Ok(None));
        assert_eq!(of(json!(2), json!(512)), Ok(Some(Limits { memory_mib: 512, cpus: 2, pids: 512 })));
        assert_eq!(of(json!(null), json!(64)), Ok(Some(Limits { memory_mib: 64, ..service })));
        assert_eq!(of(json!(1024), json!(null)), Ok(Some(Limits { cpus: 1024, ..service })));
        for (c, m, field) in [
            (json!(0), json!(512), "cpuCount"),
            (json!(1025), json!(null), "cpuCount"),
            (json!(4294967296u64), json!(null), "cpuCount"),
            (json!(-1), json!(null), "cpuCount"),
            (json!(1.5), json!(null), "cpuCount"),
            (json!(1), json!(63), "memoryMB"),
            (json!(null), json!(1024 * 1024 + 1), "memoryMB"),
            (json!(null), json!(-512), "memoryMB"),
        ] {
            let e = of(c.clone(), m.clone()).expect_err(&format!("{c} {m} was accepted"));
            assert!(e.starts_with(field), "{c} {m}: {e:?} does not name {field}");
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
