//! Fuzz target: E2B's template build start (`POST /v2/templates/{id}/builds/{build}`) as
//! branchboxd reads it (`branchbox-e2b-wire`'s `template::plan`). The input is the request
//! body, any bytes a client may send. Every body must parse into a plan or be refused with a
//! message, never panic; a plan must be what branchboxd can build from: each step labelled with
//! an E2B step number, absolute working directories and destinations, one upload per COPY
//! under its own context directory with a well-formed files hash, no empty start or ready
//! command. Each step then goes through the template definition's own check, as branchboxd
//! maps it.
#![no_main]

use branchbox_e2b_wire::template::{self, BuildStart, Op};
use branchbox_template::{RunCmd, Step};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(start) = serde_json::from_slice::<BuildStart>(data) else { return };
    let Ok(plan) = template::plan(&start) else { return };
    assert_eq!(template::plan(&start).as_ref(), Ok(&plan), "a plan is the same each time");
    let mut uploads = 0;
    let mut last = 0;
    for (label, op) in &plan.ops {
        let n: usize = label.parse().expect("a step's label is its E2B step number");
        assert!(n >= 1 && n >= last, "labels {last} then {n}");
        last = n;
        let step = match op {
            Op::Run(cmd) => Step::Run(RunCmd::Shell(cmd.clone())),
            Op::User(u) => Step::User(u.clone()),
            Op::Upload { src, to } => {
                let copy = &plan.copies[uploads];
                uploads += 1;
                assert_eq!(copy.step, n);
                assert!(src.starts_with(&format!("{}/", copy.dir)), "{src:?} is outside {:?}", copy.dir);
                assert!(!src.split('/').any(|c| c == ".." || c.is_empty()), "{src:?}");
                assert!(template::is_hash(&copy.hash));
                assert!(to.starts_with('/'), "{to:?}");
                Step::Upload { src: src.clone(), to: to.clone() }
            }
            Op::Env(vars) => {
                assert!(!vars.is_empty());
                Step::Env(vars.clone())
            }
            Op::Workdir(dir) => {
                assert!(dir.starts_with('/'), "{dir:?}");
                Step::Workdir(dir.clone())
            }
        };
        let _ = step.validate();
    }
    assert_eq!(uploads, plan.copies.len(), "one upload per COPY");
    let mut dirs: Vec<&str> = plan.copies.iter().map(|c| c.dir.as_str()).collect();
    dirs.sort_unstable();
    dirs.dedup();
    assert_eq!(dirs.len(), plan.copies.len(), "each COPY has its own directory");
    for cmd in [&plan.start_cmd, &plan.ready_cmd].into_iter().flatten() {
        assert!(!cmd.trim().is_empty());
    }
});
