//! Fuzz target: `branchbox image import` on arbitrary bytes as a tarball (an OCI layout or a
//! `docker save` archive, with its JSON and layers). Imported images are untrusted input: any
//! bytes must import or be refused, never panic, and nothing may be written outside the images
//! directory.
#![no_main]

use branchbox_image::{import_image, ImportLimits};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(dir) = tempfile::tempdir() else { return };
    let (tarball, images) = (dir.path().join("in.tar"), dir.path().join("images"));
    if std::fs::write(&tarball, data).is_err() {
        return;
    }
    let limits = ImportLimits { max_bytes: 16 << 20, max_entries: 10_000, max_layers: 16 };
    let _ = import_image(&images, "fuzz", &tarball, limits, &mut |_| {});
    // Only the tarball and the images directory may exist beside each other.
    let mut names: Vec<_> =
        std::fs::read_dir(dir.path()).into_iter().flatten().flatten().map(|e| e.file_name()).collect();
    names.sort();
    assert!(names.len() <= 2, "the import wrote outside its directory: {names:?}");
});
