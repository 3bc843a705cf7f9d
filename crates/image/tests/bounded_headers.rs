//! Tar extension headers (GNU long names and links, PAX records) are held to a budget before
//! they are read: a tarball claiming a gigabyte-long name is refused in bounded memory with a
//! short error, in a layer and in the outer `docker save` tarball, while names within the
//! budget still import.
//!
//! The gigabyte is a hole in a sparse file, so the test writes a few kilobytes; the import runs
//! in a child process (this test binary again) whose peak RSS (`VmHWM`) is its own.

#[path = "support/oci_writer.rs"]
mod oci_writer;

use branchbox_image::{import_image, ImportLimits};
use oci_writer::{layer, write_dir, write_tar, Entry, Image};
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

/// The size the hostile extension header claims: the attack's gigabyte.
const CLAIMED: u64 = 1 << 30;
/// Set in the child: the image to import.
const CHILD_ENV: &str = "BRANCHBOX_TEST_IMPORT_PATH";
/// Peak RSS the importing child may reach.
const MAX_HWM: u64 = 256 << 20;

fn file(p: &str, s: &str) -> Entry {
    Entry::File(p.to_string(), s.as_bytes().to_vec(), 0o644)
}

fn image(layers: Vec<(Vec<u8>, bool)>) -> Image {
    Image { layers, env: Vec::new(), workdir: None }
}

fn loader() -> Entry {
    file("lib64/ld-linux-x86-64.so.2", "loader")
}

/// Writes, at the start of `path`, a GNU header of `kind` claiming [`CLAIMED`] bytes followed by
/// a hole of that size (zeros), then `rest` after it.
fn sparse_extension(path: &Path, kind: tar::EntryType, rest: &[u8]) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
    h.set_mode(0o644);
    h.set_size(CLAIMED);
    h.set_cksum();
    let mut f = std::fs::File::create(path).expect("create");
    f.write_all(h.as_bytes()).expect("header");
    f.seek(SeekFrom::Start(512 + CLAIMED)).expect("seek past the hole");
    f.write_all(rest).expect("rest");
}

/// The peak RSS in a `/proc/self/status`, bytes.
fn own_hwm() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
    line.split_whitespace().nth(1).and_then(|k| k.parse::<u64>().ok()).expect("kB") * 1024
}

/// Imports `image` in a child process; returns its error (cut to 4 KiB) and its peak RSS.
fn import_in_child(test: &str, image: &Path) -> (String, u64) {
    let out = std::process::Command::new(std::env::current_exe().expect("this test binary"))
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, image)
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the importing child failed: {:?}", out.status);
    let field = |key: &str| {
        // The harness may print the test's name on the same line first.
        let line = stdout.lines().find_map(|l| l.split_once(key)).unwrap_or_else(|| panic!("no {key}"));
        line.1.to_string()
    };
    (field("ERROR: "), field("HWM: ").parse().expect("a number"))
}

/// In the child: imports the image named by the environment and reports its error and peak
/// RSS; returns false in the parent.
fn child_imports() -> bool {
    let Some(image) = std::env::var_os(CHILD_ENV) else { return false };
    let images = tempfile::tempdir().expect("images");
    let limits = ImportLimits { max_bytes: 4 * CLAIMED, ..ImportLimits::default() };
    let error = match import_image(images.path(), "huge", Path::new(&image), limits, &mut |_| {}) {
        Ok(_) => "imported".to_string(),
        Err(e) => e.to_string(),
    };
    let shown: String = error.chars().take(4096).collect();
    println!("\nERROR: {}", shown.replace('\n', " "));
    println!("HWM: {}", own_hwm());
    true
}

fn assert_refused_small(error: &str, hwm: u64, what: &str) {
    assert!(hwm < MAX_HWM, "peak RSS {hwm} bytes, over {MAX_HWM}");
    assert!(error.contains(&format!("claims {CLAIMED} bytes")), "{error}");
    assert!(error.contains(what), "{error}");
    assert!(error.len() < 512, "the error is short: {} bytes", error.len());
}

#[test]
fn a_gigabyte_long_name_in_a_layer_is_refused_in_bounded_memory_with_a_short_error() {
    if child_imports() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("layout");
    let small = layer(&[loader()]);
    let files = image(vec![(small.clone(), false)]).oci_files();
    write_dir(&src, &files);
    // The layer blob becomes the hostile one (its digest is checked once it is read: too late).
    let blob = src.join(format!("blobs/sha256/{}", oci_writer::sha(&small)));
    sparse_extension(&blob, tar::EntryType::GNULongName, &small);
    let (error, hwm) = import_in_child(
        "a_gigabyte_long_name_in_a_layer_is_refused_in_bounded_memory_with_a_short_error",
        &src,
    );
    assert_refused_small(&error, hwm, "GNU long name");
}

#[test]
fn a_gigabyte_long_name_in_a_docker_save_tarball_is_refused_in_bounded_memory() {
    if child_imports() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (plain, hostile) = (d.path().join("plain.tar"), d.path().join("hostile.tar"));
    write_tar(&plain, &image(vec![(layer(&[loader()]), false)]).docker_files());
    sparse_extension(&hostile, tar::EntryType::GNULongName, &std::fs::read(&plain).unwrap());
    let (error, hwm) = import_in_child(
        "a_gigabyte_long_name_in_a_docker_save_tarball_is_refused_in_bounded_memory",
        &hostile,
    );
    assert_refused_small(&error, hwm, "GNU long name");
}

#[test]
fn a_gigabyte_pax_header_in_a_layer_is_refused_in_bounded_memory() {
    if child_imports() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("layout");
    let small = layer(&[loader()]);
    write_dir(&src, &image(vec![(small.clone(), false)]).oci_files());
    let blob = src.join(format!("blobs/sha256/{}", oci_writer::sha(&small)));
    sparse_extension(&blob, tar::EntryType::XHeader, &small);
    let (error, hwm) = import_in_child("a_gigabyte_pax_header_in_a_layer_is_refused_in_bounded_memory", &src);
    assert_refused_small(&error, hwm, "PAX");
}

#[test]
fn long_names_and_pax_records_within_the_budget_still_import() {
    let d = tempfile::tempdir().unwrap();
    let (images, src) = (d.path().join("images"), d.path().join("layout"));
    let (a, b) = ("a".repeat(200), "b".repeat(200));
    let (gnu_name, pax_name, pax_link) =
        (format!("deep/{a}/{b}/gnu"), format!("deep/{a}/{b}/pax"), format!("deep/{a}/{b}/link"));
    let mut builder = tar::Builder::new(Vec::new());
    for (path, data) in [("lib64/ld-linux-x86-64.so.2", &b"loader"[..]), (gnu_name.as_str(), b"long")] {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        builder.append_data(&mut h, path, data).unwrap();
    }
    builder
        .append_pax_extensions([
            ("path", pax_name.as_bytes()),
            ("uid", b"0".as_slice()),
            ("size", b"3".as_slice()),
        ])
        .unwrap();
    let mut h = tar::Header::new_ustar();
    h.set_path("short-name-replaced-by-pax").unwrap();
    h.set_mode(0o644);
    h.set_size(3);
    h.set_cksum();
    builder.append(&h, &b"pax"[..]).unwrap();
    builder
        .append_pax_extensions([("path", pax_link.as_bytes()), ("linkpath", gnu_name.as_bytes())])
        .unwrap();
    let mut h = tar::Header::new_ustar();
    h.set_path("link-replaced-by-pax").unwrap();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_mode(0o777);
    h.set_size(0);
    h.set_cksum();
    builder.append(&h, &[][..]).unwrap();
    let tar = builder.into_inner().unwrap();
    write_dir(&src, &image(vec![(tar, true)]).oci_files());
    let record = import_image(&images, "long", &src, ImportLimits::default(), &mut |_| {}).unwrap();
    let root = images.join(record.tree).join("rootfs");
    assert_eq!(std::fs::read(root.join(&gnu_name)).unwrap(), b"long");
    assert_eq!(std::fs::read(root.join(&pax_name)).unwrap(), b"pax");
    assert_eq!(std::fs::read_link(root.join(&pax_link)).unwrap(), Path::new(&gnu_name));
    assert!(!root.join("short-name-replaced-by-pax").exists());
}

#[test]
fn an_extension_header_just_over_the_budget_is_refused_without_echoing_it() {
    let d = tempfile::tempdir().unwrap();
    let (images, src) = (d.path().join("images"), d.path().join("layout"));
    let name = format!("{}/x", "n".repeat((64 << 10) + 1));
    let mut builder = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o644);
    h.set_size(0);
    builder.append_data(&mut h, &name, &[][..]).unwrap();
    let tar = builder.into_inner().unwrap();
    write_dir(&src, &image(vec![(layer(&[loader()]), false), (tar, true)]).oci_files());
    let e =
        import_image(&images, "over", &src, ImportLimits::default(), &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("over the limit of 65536"), "{e}");
    assert!(!e.contains("nnnn"), "the name is not echoed: {e}");
}

#[test]
fn a_path_within_the_budget_but_too_long_for_linux_is_refused_with_a_short_error() {
    let d = tempfile::tempdir().unwrap();
    let (images, src) = (d.path().join("images"), d.path().join("layout"));
    let mut builder = tar::Builder::new(Vec::new());
    for name in [format!("{}/x", "d/".repeat(30_000)), format!("{}/x", "n".repeat(300))] {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(0);
        builder.append_data(&mut h, &name, &[][..]).unwrap();
        let tar = builder.into_inner().unwrap();
        write_dir(&src, &image(vec![(layer(&[loader()]), false), (tar, true)]).oci_files());
        let e = import_image(&images, "long", &src, ImportLimits::default(), &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(e.contains("longer than 4096 bytes") || e.contains("over 255 bytes"), "{e}");
        assert!(e.len() < 512, "the error is short: {} bytes", e.len());
        builder = tar::Builder::new(Vec::new());
    }
}
