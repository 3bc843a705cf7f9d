//! `branchbox guest kernel|disk` as scripts and tests call them: `--cached` never builds and
//! says how to build on a miss; `BRANCHBOX_KERNEL` replaces the built kernel. (The builds
//! themselves run in `scripts/test.sh`; the disk build is tested in crates/image.)

use std::process::{Command, Output};

fn branchbox(images: &std::path::Path, args: &[&str], kernel: Option<&std::path::Path>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_branchbox"));
    c.args(args).env("BRANCHBOX_IMAGES", images).env_remove("BRANCHBOX_KERNEL");
    if let Some(k) = kernel {
        c.env("BRANCHBOX_KERNEL", k);
    }
    c.output().unwrap()
}

#[test]
fn cached_lookups_build_nothing_and_name_the_build_command() {
    let d = tempfile::tempdir().unwrap();
    let agent = d.path().join("agent");
    std::fs::write(&agent, b"\x7fELF").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_branchbox"))
        .args(["guest", "disk", "--print-path", "--cached"])
        .env("BRANCHBOX_IMAGES", d.path())
        .env("BRANCHBOX_AGENT", &agent)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`branchbox guest disk --image default`"), "{err}");
    assert!(out.stdout.is_empty());
    // Nothing was built or even started in the cache.
    assert!(!d.path().join("disk").exists() && !d.path().join("kernel").exists());

    let out = branchbox(d.path(), &["guest", "kernel", "--print-path", "--cached"], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    // Without Debian's source package the message says to install it; with it, how to build.
    assert!(err.contains("`branchbox guest kernel`") || err.contains("linux-source-6.12"), "{err}");
    assert!(!d.path().join("kernel").exists());
}

#[test]
fn a_kernel_named_by_the_user_is_reported_and_nothing_is_built() {
    let d = tempfile::tempdir().unwrap();
    let vmlinux = d.path().join("my-vmlinux");
    std::fs::write(&vmlinux, b"\x7fELF\x02\x01\x01\0").unwrap();
    let out = branchbox(d.path(), &["guest", "kernel", "--print-path"], Some(&vmlinux));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), vmlinux.display().to_string());
    let out = branchbox(d.path(), &["--json", "guest", "kernel"], Some(&vmlinux));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["vmlinux"], vmlinux.display().to_string());
    assert_eq!(v["bzimage"], serde_json::Value::Null);
    assert_eq!(v["built"], false);

    let junk = d.path().join("junk");
    std::fs::write(&junk, b"not a kernel").unwrap();
    let out = branchbox(d.path(), &["guest", "kernel"], Some(&junk));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("neither an ELF vmlinux nor an x86 bzImage"));
    assert!(!d.path().join("kernel").exists());
}
