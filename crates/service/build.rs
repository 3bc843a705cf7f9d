//! Copies the console terminal's npm packages (xterm.js and its fit addon, pinned in
//! `ui/vendor/package-lock.json` and installed by `scripts/setup.sh` with `npm ci`) into the
//! build, where `src/ui/terminal.rs` includes them: the binary serves them itself, so the
//! console needs nothing from elsewhere at run time.

use std::path::{Path, PathBuf};

/// (file under `ui/vendor/node_modules/`, name in the build)
const ASSETS: [(&str, &str); 3] = [
    ("@xterm/xterm/lib/xterm.js", "xterm.js"),
    ("@xterm/xterm/css/xterm.css", "xterm.css"),
    ("@xterm/addon-fit/lib/addon-fit.js", "addon-fit.js"),
];

fn main() {
    let manifest =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let vendor = manifest.join("ui/vendor");
    println!("cargo:rerun-if-changed={}", vendor.join("package-lock.json").display());
    for (from, to) in ASSETS {
        let src = vendor.join("node_modules").join(from);
        println!("cargo:rerun-if-changed={}", src.display());
        copy(&src, &out.join(to), &vendor);
    }
}

fn copy(src: &Path, dst: &Path, vendor: &Path) {
    let bytes = std::fs::read(src).unwrap_or_else(|e| {
        panic!(
            "\n\nthe console's terminal needs {} ({e}).\nIt comes from npm, pinned in {}: run ./scripts/setup.sh, \
             or `npm ci` in {}\n\n",
            src.display(),
            vendor.join("package-lock.json").display(),
            vendor.display()
        )
    });
    std::fs::write(dst, bytes).unwrap_or_else(|e| panic!("cannot write {}: {e}", dst.display()));
}
