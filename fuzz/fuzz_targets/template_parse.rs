//! Fuzz target: the template parsers on arbitrary bytes, as a TOML template file, as the API's
//! JSON and as a Dockerfile. Template files and API bodies are client input: any bytes must
//! parse or be refused, never panic; what parses must then describe, key and give its exec
//! defaults (what a build does with it before any sandbox runs) without panicking either, and
//! read back from its JSON as the same template.
#![no_main]

use branchbox_protocol::ExecSpec;
use branchbox_template::{chain, command, dockerfile, parse_toml, ExecDefaults, Step, TemplateSpec};

/// What a build does with a parsed template before it starts a sandbox.
fn walk(spec: &TemplateSpec) {
    let _ = spec.base();
    let mut key = chain::base_key(&spec.base);
    let mut defaults = ExecDefaults::default();
    for step in &spec.steps {
        let _ = (step.describe(), step.changes_sandbox());
        key = chain::step_key(&key, step, None);
        defaults.after(step);
        if let Step::Run(cmd) = step {
            defaults.apply(&mut ExecSpec::new(command(cmd)));
        }
    }
    // TOML files, Dockerfiles and the API share one wire shape: whatever parsed reads back
    // from its JSON as the same template.
    let json = serde_json::to_vec(spec).expect("a parsed template encodes");
    let back: TemplateSpec = serde_json::from_slice(&json).expect("a parsed template's JSON parses");
    assert_eq!(&back, spec);
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(spec) = parse_toml(&text) {
        walk(&spec);
    }
    if let Ok(spec) = dockerfile::parse("fuzz", &text) {
        walk(&spec);
    }
    if let Ok(spec) = serde_json::from_slice::<TemplateSpec>(data) {
        if spec.validate().is_ok() {
            walk(&spec);
        }
    }
});
