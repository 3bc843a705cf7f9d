//! Errors: unknown, malformed and dead targets get a message naming what was given and a
//! non-zero exit, and change nothing.

use branchbox_conformance::{Ctx, Shell};

const UNKNOWN_SANDBOX: &str = "sbx-0000000000000000";
const UNKNOWN_SNAPSHOT: &str = "snap-0000000000000000";

pub fn unknown_and_malformed_ids_get_clear_errors(c: &Ctx) {
    let s = c.create(&[]);
    s.sh("echo precious > /root/p");
    for args in [
        vec!["exec", UNKNOWN_SANDBOX, "--", "true"],
        vec!["files", "ls", UNKNOWN_SANDBOX, "/"],
        vec!["fork", UNKNOWN_SANDBOX],
        vec!["snapshot", UNKNOWN_SANDBOX],
        vec!["kill", UNKNOWN_SANDBOX],
    ] {
        let err = c.fails(&args);
        assert!(err.contains(UNKNOWN_SANDBOX) && err.contains("not found"), "{args:?}: {err}");
    }
    let err = c.fails(&["exec", "not-an-id", "--", "true"]);
    assert!(err.contains("not-an-id") && err.contains("not a sandbox id"), "{err}");
    for n in ["0", "100000"] {
        let err = c.fails(&["fork", &s.id, "-n", n]);
        assert!(err.contains("out of range"), "fork -n {n}: {err}");
    }
    let out = c.run(&["--json", "exec", UNKNOWN_SANDBOX, "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("an error as json");
    assert_eq!(v["error"]["code"], "not_found", "{v}");
    assert_eq!(s.sh("cat /root/p").trim(), "precious");
}

pub fn bad_snapshots_get_clear_errors_and_change_nothing(c: &Ctx) {
    let (a, b) = (c.create(&[]), c.create(&[]));
    b.sh("echo current > /root/f");
    for by in [UNKNOWN_SNAPSHOT, "no-such-name"] {
        let err = c.fails(&["restore", by]);
        assert!(err.contains(by) && err.contains("not found"), "restore {by}: {err}");
    }
    let err = c.fails(&["rollback", &b.id, UNKNOWN_SNAPSHOT]);
    assert!(err.contains("not found"), "{err}");
    // A snapshot of another sandbox is for `restore`, never for rolling this one back.
    let theirs = c.ok(&["checkpoint", &a.id]).trim().to_string();
    let err = c.fails(&["rollback", &b.id, &theirs]);
    assert!(err.contains(&theirs) && err.contains("restore"), "{err}");
    let gone = c.ok(&["checkpoint", &b.id]).trim().to_string();
    c.ok(&["rmsnap", &gone]);
    for args in [vec!["restore", gone.as_str()], vec!["rollback", &b.id, &gone]] {
        let err = c.fails(&args);
        assert!(err.contains(&gone) && err.contains("deleted"), "{args:?}: {err}");
    }
    assert_eq!(b.sh("cat /root/f").trim(), "current", "a failed command changed the sandbox");
}

pub fn a_killed_sandbox_refuses_every_command_clearly(c: &Ctx) {
    let id = c.create(&[]).kill();
    assert!(!c.dir().join("sandboxes").join(&id).exists(), "the killed sandbox's directory is left");
    for args in [
        vec!["exec", &id, "--", "true"],
        vec!["files", "get", &id, "/etc/hostname", "-"],
        vec!["fork", &id],
        vec!["snapshot", &id],
        vec!["checkpoint", &id],
        vec!["pause", &id],
        vec!["kill", &id],
    ] {
        let err = c.fails(&args);
        assert!(err.contains(&id) && err.contains("not found"), "{args:?}: {err}");
    }
    let listed = c.json(&["ls"]);
    assert!(!listed.to_string().contains(&id), "a killed sandbox is listed: {listed}");
}
