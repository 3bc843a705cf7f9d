//! End-to-end: the built-in images (`default` has the tools agents reach for, `minimal` does
//! not) and an image imported from an OCI tarball, each running in a real gVisor sandbox.

mod common;

#[path = "../../image/tests/support/oci_writer.rs"]
mod oci_writer;

use common::*;
use oci_writer::{layer, write_tar, Entry, Image};
use std::path::{Path, PathBuf};

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

/// An OCI tarball in `dir`: [`runtime_layer`] and a `hello` program, with `ENV GREETING=oci`
/// and `WORKDIR /usr/local/bin`; with a `marker`, one more layer holding it (another tree).
fn hello_tarball(dir: &Path, marker: Option<&str>) -> PathBuf {
    let app = layer(&[
        Entry::Dir("usr/"),
        Entry::Dir("usr/local/"),
        Entry::Dir("usr/local/bin/"),
        Entry::File("usr/local/bin/hello".into(), b"#!/bin/sh\necho hello from $GREETING\n".to_vec(), 0o755),
        Entry::File("etc/.wh.gone".into(), Vec::new(), 0o644),
    ]);
    let mut layers = vec![(runtime_layer(), true), (app, false)];
    if let Some(m) = marker {
        layers.push((layer(&[Entry::File("etc/marker".into(), m.as_bytes().to_vec(), 0o644)]), false));
    }
    let image = Image { layers, env: vec!["GREETING=oci".into()], workdir: Some("/usr/local/bin".into()) };
    let tarball = dir.join("hello.tar");
    write_tar(&tarball, &image.oci_files());
    tarball
}

#[test]
fn an_imported_oci_tarball_runs_its_program() {
    let dir = tempfile::tempdir().unwrap();
    let tarball = hello_tarball(dir.path(), None);
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

#[test]
fn create_of_an_imported_image_gives_its_commands_the_image_env_and_workdir() {
    let dir = tempfile::tempdir().unwrap();
    let name = "e2e-oci-env";
    // Its own tree (the marker layer): the other tests' sandboxes never run on it.
    let tarball = hello_tarball(dir.path(), Some(name));
    ok(&["image", "import", name, tarball.to_str().unwrap()]);
    let s = create(name);
    assert_eq!(s.sh("echo \"$GREETING|$(pwd)\"").trim(), "oci|/usr/local/bin");
    // The program finds its greeting without being told, and a command's own env and cwd win.
    assert_eq!(s.sh("./hello").trim(), "hello from oci");
    let own = ok(&[
        "exec",
        &s.0,
        "--env",
        "GREETING=mine",
        "--cwd",
        "/tmp",
        "-s",
        "--",
        "echo \"$GREETING|$(pwd)\"",
    ]);
    assert_eq!(own.trim(), "mine|/tmp");
    // A sandbox of a built-in image gets no such defaults.
    let plain = create("minimal");
    assert_eq!(plain.sh("echo \"${GREETING:-unset}|$(pwd)\"").trim(), "unset|/");
    // The same image imported under a second name shares the tree: removing the first name
    // while its sandbox runs leaves the tree to the second, and the sandbox runs on.
    let twin = "e2e-oci-env-twin";
    ok(&["image", "import", twin, tarball.to_str().unwrap()]);
    let gone: serde_json::Value = serde_json::from_str(&ok(&["--json", "image", "rm", name])).unwrap();
    assert_eq!(gone["tree_removed"], false, "{gone}");
    assert_eq!(s.sh("./hello").trim(), "hello from oci");
    assert!(fails(&["image", "rm", twin]).contains(&s.0), "the last name of a tree in use is kept");
    drop(s);
    ok(&["image", "rm", twin]);
}

#[test]
fn an_imported_image_is_removed_only_once_no_sandbox_or_template_uses_it() {
    let dir = tempfile::tempdir().unwrap();
    let name = "e2e-oci-rm";
    let tarball = hello_tarball(dir.path(), Some(name));
    let v: serde_json::Value =
        serde_json::from_str(&ok(&["--json", "image", "import", name, tarball.to_str().unwrap()])).unwrap();
    let images =
        std::env::var_os("BRANCHBOX_IMAGES").map(PathBuf::from).unwrap_or_else(|| data_dir().join("images"));
    let tree = images.join(v["tree"].as_str().unwrap());
    assert!(tree.is_dir());
    for builtin in ["default", "minimal"] {
        let e = fails(&["image", "rm", builtin]);
        assert!(e.contains("built-in"), "{e}");
    }
    assert!(fails(&["image", "rm", "e2e-no-such-image"]).contains("image ls"));
    let s = create(name);
    let e = fails(&["image", "rm", name]);
    assert!(e.contains(&s.0) && e.contains("branchbox kill"), "the refusal names the sandbox: {e}");
    drop(s);
    let dockerfile = dir.path().join("Dockerfile");
    std::fs::write(&dockerfile, format!("FROM {name}\nRUN echo built > /marker\n")).unwrap();
    ok(&["template", "build", "e2e-oci-rm-tpl", "-f", dockerfile.to_str().unwrap()]);
    let e = fails(&["image", "rm", name]);
    assert!(e.contains("e2e-oci-rm-tpl") && e.contains("template rm"), "the refusal names the template: {e}");
    ok(&["template", "rm", "e2e-oci-rm-tpl"]);
    let gone: serde_json::Value = serde_json::from_str(&ok(&["--json", "image", "rm", name])).unwrap();
    assert_eq!(gone["tree_removed"], true, "{gone}");
    assert!(!tree.exists(), "the unpacked tree is gone");
    assert!(!ok(&["image", "ls"]).lines().any(|l| l.starts_with(&format!("{name}\t"))));
    assert!(fails(&["create", "--image", name]).contains("image import"));
}
