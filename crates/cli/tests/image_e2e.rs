//! End-to-end: the built-in images (`default` has the tools agents reach for, `minimal` does
//! not) and an image imported from an OCI tarball, each running in a real gVisor sandbox.

mod common;

#[path = "../../image/tests/support/oci_writer.rs"]
mod oci_writer;

use common::*;
use oci_writer::{layer, write_tar, Entry, Image};

fn create(image: &str) -> Sandbox {
    Sandbox::adopt(&ok(&["create", "--backend", "gvisor", "--image", image]))
}

#[test]
fn the_default_image_has_pip_venv_git_curl_node_and_npm() {
    let s = create("default");
    let out = s.sh(
        "set -e; pip --version; python3 -m venv /tmp/venv; /tmp/venv/bin/python -c 'print(\"venv-ok\")'; \
         git --version; curl --version | head -1; node -e 'console.log(6 * 7)'; npm --version",
    );
    for want in ["pip ", "venv-ok", "git version", "curl ", "42"] {
        assert!(out.contains(want), "{want:?} missing from {out}");
    }
}

#[test]
fn the_minimal_image_is_there_by_name_without_the_extras() {
    let s = create("minimal");
    assert!(s.sh("python3 -c 'print(6 * 7)'").contains("42"));
    let out = s.sh_output("git --version");
    assert!(!out.status.success(), "git is not in the minimal image");
}

/// Host files the agent needs (it is linked against glibc) and a shell, as one layer.
fn runtime_layer() -> Vec<u8> {
    let host = |p: &str| std::fs::read(p).unwrap_or_else(|e| panic!("{p}: {e}"));
    let mut entries = vec![Entry::Dir("lib64/"), Entry::Dir("lib/"), Entry::Dir("lib/x86_64-linux-gnu/")];
    entries.push(Entry::File(
        "lib64/ld-linux-x86-64.so.2".into(),
        host("/lib64/ld-linux-x86-64.so.2"),
        0o755,
    ));
    for lib in ["libc.so.6", "libgcc_s.so.1"] {
        let path = format!("/lib/x86_64-linux-gnu/{lib}");
        entries.push(Entry::File(format!("lib/x86_64-linux-gnu/{lib}"), host(&path), 0o755));
    }
    entries.push(Entry::Dir("bin/"));
    entries.push(Entry::File("bin/sh".into(), host("/bin/dash"), 0o755));
    entries.push(Entry::Dir("etc/"));
    entries.push(Entry::File("etc/gone".into(), b"removed by the next layer".to_vec(), 0o644));
    layer(&entries)
}

#[test]
fn an_imported_oci_tarball_runs_its_program() {
    let dir = tempfile::tempdir().unwrap();
    let app = layer(&[
        Entry::Dir("usr/"),
        Entry::Dir("usr/local/"),
        Entry::Dir("usr/local/bin/"),
        Entry::File("usr/local/bin/hello".into(), b"#!/bin/sh\necho hello from $GREETING\n".to_vec(), 0o755),
        Entry::File("etc/.wh.gone".into(), Vec::new(), 0o644),
    ]);
    let image = Image {
        layers: vec![(runtime_layer(), true), (app, false)],
        env: vec!["GREETING=oci".into()],
        workdir: Some("/usr/local/bin".into()),
    };
    let tarball = dir.path().join("hello.tar");
    write_tar(&tarball, &image.oci_files());
    let name = "e2e-oci-hello";
    let out = ok(&["--json", "image", "import", name, tarball.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["config"]["env"][0], "GREETING=oci", "{out}");
    assert!(ok(&["image", "ls"]).contains(name));
    let s = create(name);
    assert_eq!(s.sh("GREETING=branchbox hello").trim(), "hello from branchbox");
    assert!(!s.sh_output("test -e /etc/gone").status.success(), "the whiteout removed /etc/gone");
    // The Debian tools are not there: this is the imported tree, not the default image.
    assert!(!s.sh_output("python3 -c 1").status.success());
    // A template built on the imported image starts with its Env and WorkingDir.
    let ctx = tempfile::tempdir().unwrap();
    let dockerfile = ctx.path().join("Dockerfile");
    std::fs::write(&dockerfile, format!("FROM {name}\nRUN echo built > /marker\n")).unwrap();
    ok(&["template", "build", "e2e-oci-tpl", "-f", dockerfile.to_str().unwrap()]);
    let t = Sandbox::adopt(&ok(&["create", "--template", "e2e-oci-tpl"]));
    // No cat in this image: the shell's own `read`.
    assert_eq!(
        t.sh("read m < /marker && echo \"$(hello)|$(pwd)|$m\"").trim(),
        "hello from oci|/usr/local/bin|built"
    );
    drop(t);
    ok(&["template", "rm", "e2e-oci-tpl"]);
}
