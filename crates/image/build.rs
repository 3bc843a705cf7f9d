//! Compiles the statx compatibility library that images carry for gVisor (see
//! `compat/statx_compat.c`) into a shared object embedded in this crate.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "compat/statx_compat.c";
    println!("cargo:rerun-if-changed={src}");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("libbranchbox-statx.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(src)
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?} ({e}); install gcc"));
    assert!(status.success(), "compiling {src} failed");
}
