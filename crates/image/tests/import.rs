//! Importing OCI image layouts and `docker save` tarballs: layers in order with whiteouts,
//! digests verified, hostile entries refused, limits enforced.

#[path = "support/oci_writer.rs"]
mod oci_writer;

use branchbox_image::{
    image_names, images_of, import_image, imported_image, remove_image, resolve_image, ImportLimits,
};
use oci_writer::{layer, write_dir, write_tar, Entry, Image};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

fn file(p: &str, s: &str) -> Entry {
    Entry::File(p.to_string(), s.as_bytes().to_vec(), 0o644)
}

/// A base layer with the agent's loader (a stand-in: nothing runs here) and some files.
fn base_layer() -> Vec<u8> {
    layer(&[
        Entry::Dir("usr/"),
        Entry::Dir("usr/lib64/"),
        file("usr/lib64/ld-linux-x86-64.so.2", "loader"),
        Entry::Symlink("lib64", "usr/lib64"),
        Entry::Dir("etc/"),
        file("etc/gone", "whited out"),
        file("etc/kept", "kept"),
        Entry::Dir("opaque/"),
        file("opaque/old", "hidden by the opaque marker"),
        Entry::CharDevice("dev-null"),
    ])
}

fn top_layer() -> Vec<u8> {
    layer(&[
        file("etc/.wh.gone", ""),
        Entry::Dir("opaque/"),
        file("opaque/.wh..wh..opq", ""),
        file("opaque/new", "new"),
        Entry::Hardlink("etc/kept-link", "etc/kept"),
        Entry::File("bin/hello".into(), b"#!/bin/sh\necho hello\n".to_vec(), 0o755),
    ])
}

fn image(layers: Vec<(Vec<u8>, bool)>) -> Image {
    Image { layers, env: vec!["GREETING=hi".into()], workdir: Some("/work".into()) }
}

fn import(images: &Path, name: &str, path: &Path) -> branchbox_model::Result<branchbox_image::ImportedImage> {
    import_image(images, name, path, ImportLimits::default(), &mut |_| {})
}

fn tree(images: &Path, name: &str) -> PathBuf {
    let record = imported_image(images, name).unwrap().expect("recorded");
    images.join(record.tree).join("rootfs")
}

fn no_temporaries(images: &Path) {
    for e in std::fs::read_dir(images).unwrap().flatten() {
        assert!(!e.file_name().to_string_lossy().starts_with("tmp-"), "left {:?}", e.file_name());
    }
}

#[test]
fn an_oci_layout_applies_its_layers_in_order_with_whiteouts() {
    let d = tempfile::tempdir().unwrap();
    let (images, src) = (d.path().join("images"), d.path().join("layout"));
    write_dir(&src, &image(vec![(base_layer(), true), (top_layer(), false)]).oci_files());
    let record = import(&images, "app", &src).unwrap();
    assert_eq!(record.config.env, Some(vec!["GREETING=hi".to_string()]));
    assert_eq!(record.config.working_dir.as_deref(), Some("/work"));
    assert_eq!(record.skipped_entries, 1, "the device node is skipped");
    let root = tree(&images, "app");
    assert!(!root.join("etc/gone").exists(), "a whiteout removes the lower layer's file");
    assert_eq!(std::fs::read_to_string(root.join("etc/kept")).unwrap(), "kept");
    let names: Vec<_> =
        std::fs::read_dir(root.join("opaque")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(names, vec!["new"], "an opaque directory hides the lower layer's entries");
    let (a, b) = (root.join("etc/kept").metadata().unwrap(), root.join("etc/kept-link").metadata().unwrap());
    assert_eq!(a.ino(), b.ino(), "a hard link is one file");
    assert_eq!(root.join("bin/hello").metadata().unwrap().mode() & 0o777, 0o755);
    assert!(!root.join("dev-null").exists());
    for m in ["proc", "dev", "sys", "tmp", "run", "root"] {
        assert!(root.join(m).is_dir(), "mount point {m} is made");
    }
    no_temporaries(&images);
}

#[test]
fn docker_save_and_an_oci_tarball_unpack_to_the_same_tree() {
    let d = tempfile::tempdir().unwrap();
    let images = d.path().join("images");
    let img = image(vec![(base_layer(), false), (top_layer(), true)]);
    write_tar(&d.path().join("docker.tar"), &img.docker_files());
    write_tar(&d.path().join("oci.tar"), &img.oci_files());
    let a = import(&images, "from-docker", &d.path().join("docker.tar")).unwrap();
    let b = import(&images, "from-oci", &d.path().join("oci.tar")).unwrap();
    assert_eq!(a.tree, b.tree, "the same layers make the same tree, unpacked once");
    assert_eq!(a.config, b.config);
    assert!(!tree(&images, "from-docker").join("etc/gone").exists());
}

#[test]
fn the_agent_is_installed_inside_the_tree_even_through_symlinked_directories() {
    let d = tempfile::tempdir().unwrap();
    let (images, src, outside) = (d.path().join("images"), d.path().join("layout"), d.path().join("outside"));
    std::fs::create_dir_all(&outside).unwrap();
    let escape: &'static str = Box::leak(outside.to_string_lossy().into_owned().into_boxed_str());
    let hostile =
        layer(&[Entry::Dir("usr/"), Entry::Dir("usr/local/"), Entry::Symlink("usr/local/bin", escape)]);
    write_dir(&src, &image(vec![(base_layer(), false), (hostile, false)]).oci_files());
    import(&images, "trick", &src).unwrap();
    let agent = d.path().join("agent");
    std::fs::write(&agent, b"agent").unwrap();
    let img = resolve_image(&images, "trick", &agent, "unused", &mut |_| {}).unwrap();
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "nothing is written outside the tree");
    let inside = img.rootfs.join(escape.trim_start_matches('/')).join("branchbox-agent");
    assert_eq!(std::fs::read(inside).unwrap(), b"agent", "the symlink resolves inside the tree");
}

#[test]
fn entries_that_leave_the_root_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let images = d.path().join("images");
    for (i, bad) in ["../escape", "/etc/absolute", "etc/../../escape"].iter().enumerate() {
        let src = d.path().join(format!("layout{i}"));
        let hostile = layer(&[file(bad, "x")]);
        write_dir(&src, &image(vec![(base_layer(), false), (hostile, false)]).oci_files());
        let e = import(&images, "bad", &src).unwrap_err().to_string();
        assert!(e.contains("leaves the image root"), "{bad}: {e}");
        assert!(!d.path().join("escape").exists());
    }
    assert!(imported_image(&images, "bad").unwrap().is_none(), "a refused import records nothing");
    no_temporaries(&images);
}

#[test]
fn whiteouts_that_hide_no_name_are_refused_and_remove_nothing() {
    let d = tempfile::tempdir().unwrap();
    let images = d.path().join("images");
    let kept = d.path().join("kept");
    write_dir(&kept, &image(vec![(base_layer(), false)]).oci_files());
    import(&images, "kept", &kept).unwrap();
    // `.wh...` is `.wh.` hiding `..`: the directory above the one it sits in.
    for (i, bad) in [".wh...", ".wh..", ".wh.", "etc/.wh...", "etc/.wh.."].iter().enumerate() {
        let src = d.path().join(format!("layout{i}"));
        write_dir(&src, &image(vec![(base_layer(), false), (layer(&[file(bad, "")]), false)]).oci_files());
        let e = import(&images, "bad", &src).unwrap_err().to_string();
        assert!(e.contains("whiteout") && e.contains("hides no name"), "{bad}: {e}");
        assert!(tree(&images, "kept").join("etc/kept").is_file(), "{bad} removed another image");
    }
    assert!(imported_image(&images, "bad").unwrap().is_none());
    no_temporaries(&images);
}

#[test]
fn writing_through_a_symlink_stays_inside_the_root() {
    let d = tempfile::tempdir().unwrap();
    let (images, src, outside) = (d.path().join("images"), d.path().join("layout"), d.path().join("outside"));
    std::fs::create_dir_all(&outside).unwrap();
    let escape: &'static str = Box::leak(outside.to_string_lossy().into_owned().into_boxed_str());
    let links = layer(&[Entry::Symlink("abs", escape), Entry::Symlink("rel", "../../../../../../..")]);
    let writes =
        layer(&[file("abs/pwned", "x"), file("rel/pwned-too", "x"), Entry::Hardlink("hl", "rel/etc/kept")]);
    write_dir(&src, &image(vec![(base_layer(), false), (links, false), (writes, false)]).oci_files());
    import(&images, "links", &src).unwrap();
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "nothing lands outside");
    let root = tree(&images, "links");
    assert!(root.join(escape.trim_start_matches('/')).join("pwned").is_file());
    assert!(root.join("pwned-too").is_file(), "'..' past the root stays at the root");
    assert_eq!(root.join("hl").metadata().unwrap().ino(), root.join("etc/kept").metadata().unwrap().ino());
}

#[test]
fn a_layer_that_does_not_match_its_digest_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let images = d.path().join("images");
    // OCI: the blob is altered after its digest was written.
    let src = d.path().join("layout");
    let mut files = image(vec![(base_layer(), true)]).oci_files();
    let blob =
        files.iter_mut().find(|(n, b)| n.starts_with("blobs/") && b.starts_with(&[0x1f, 0x8b])).unwrap();
    blob.1 = oci_writer::gzip(&layer(&[file("usr/lib64/ld-linux-x86-64.so.2", "altered")]));
    write_dir(&src, &files);
    let e = import(&images, "altered", &src).unwrap_err().to_string();
    assert!(e.contains("does not match its digest"), "{e}");
    // docker save: the layer no longer matches the config's diff_id.
    let mut files = image(vec![(base_layer(), false)]).docker_files();
    files[0].1 = layer(&[file("usr/lib64/ld-linux-x86-64.so.2", "altered")]);
    write_tar(&d.path().join("docker.tar"), &files);
    let e = import(&images, "altered", &d.path().join("docker.tar")).unwrap_err().to_string();
    assert!(e.contains("does not match its digest"), "{e}");
    assert!(imported_image(&images, "altered").unwrap().is_none());
    no_temporaries(&images);
}

#[test]
fn limits_on_bytes_and_entries_stop_an_import() {
    let d = tempfile::tempdir().unwrap();
    let (images, src) = (d.path().join("images"), d.path().join("layout"));
    let big = layer(&[Entry::File("big".into(), vec![0u8; 1 << 20], 0o644)]);
    write_dir(&src, &image(vec![(base_layer(), false), (big, true)]).oci_files());
    let limits = ImportLimits { max_bytes: 512 << 10, ..ImportLimits::default() };
    let e = import_image(&images, "big", &src, limits, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("limit of 524288 bytes"), "{e}");
    let limits = ImportLimits { max_entries: 5, ..ImportLimits::default() };
    let e = import_image(&images, "big", &src, limits, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("limit of 5 entries"), "{e}");
    no_temporaries(&images);
}

#[test]
fn images_the_agent_cannot_run_in_and_bad_names_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let (images, src) = (d.path().join("images"), d.path().join("layout"));
    write_dir(&src, &image(vec![(layer(&[file("etc/alpine-release", "3.20")]), false)]).oci_files());
    let e = import(&images, "musl", &src).unwrap_err().to_string();
    assert!(e.contains("needs glibc"), "{e}");
    write_dir(&src, &image(vec![(base_layer(), false)]).oci_files());
    for name in ["default", "minimal", "a/b", ""] {
        assert!(import(&images, name, &src).is_err(), "{name:?} is refused");
    }
    let e = import(&images, "x", &d.path().join("missing")).unwrap_err().to_string();
    assert!(e.contains("missing"), "{e}");
    let e = resolve_image(&images, "nosuch", &src, "unused", &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("branchbox image import nosuch"), "{e}");
}

#[test]
fn the_record_keeps_the_config_under_its_own_names_and_reads_back() {
    let d = tempfile::tempdir().unwrap();
    let (images, src) = (d.path().join("images"), d.path().join("layout"));
    write_dir(&src, &image(vec![(base_layer(), false)]).oci_files());
    let record = import(&images, "cfg", &src).unwrap();
    let json = serde_json::to_value(&record).unwrap();
    assert_eq!(json["config"]["env"][0], "GREETING=hi", "{json}");
    assert_eq!(json["config"]["working_dir"], "/work", "{json}");
    assert_eq!(imported_image(&images, "cfg").unwrap(), Some(record), "the record reads back whole");
}

#[test]
fn a_layout_directory_cannot_name_a_host_file_outside_it() {
    let d = tempfile::tempdir().unwrap();
    let (images, src, outside) = (d.path().join("images"), d.path().join("saved"), d.path().join("outside"));
    let img = image(vec![(base_layer(), false)]);
    let mut files = img.docker_files();
    // The layer lives outside the directory; manifest.json reaches for it with '..'.
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("layer.tar"), &files[0].1).unwrap();
    files.remove(0);
    let manifest = files.iter_mut().find(|(n, _)| n == "manifest.json").unwrap();
    let text = String::from_utf8(manifest.1.clone()).unwrap();
    let layer_name = format!("{}/layer.tar", oci_writer::sha(&base_layer()));
    manifest.1 = text.replace(&layer_name, "../outside/layer.tar").into_bytes();
    write_dir(&src, &files);
    let e = import(&images, "reach", &src).unwrap_err().to_string();
    assert!(e.contains("not a plain file inside"), "{e}");
    // And through a symlink inside the directory.
    let manifest = files.iter_mut().find(|(n, _)| n == "manifest.json").unwrap();
    manifest.1 = String::from_utf8(manifest.1.clone())
        .unwrap()
        .replace("../outside/layer.tar", "link/layer.tar")
        .into_bytes();
    write_dir(&src, &files);
    std::os::unix::fs::symlink(&outside, src.join("link")).unwrap();
    let e = import(&images, "reach", &src).unwrap_err().to_string();
    assert!(e.contains("not a plain file inside"), "{e}");
}

#[test]
fn removing_a_name_removes_its_tree_and_images_once_no_other_name_records_them() {
    let d = tempfile::tempdir().unwrap();
    let (images, src) = (d.path().join("images"), d.path().join("layout"));
    write_dir(&src, &image(vec![(base_layer(), false)]).oci_files());
    let agent = d.path().join("agent");
    std::fs::write(&agent, b"agent").unwrap();
    let a = import(&images, "a", &src).unwrap();
    import(&images, "b", &src).unwrap();
    let made = resolve_image(&images, "a", &agent, "unused", &mut |_| {}).unwrap();
    std::fs::write(&agent, b"agent 2").unwrap();
    let kept = resolve_image(&images, "a", &agent, "unused", &mut |_| {}).unwrap();
    assert_eq!(images_of(&images, &a), {
        let mut ids = vec![made.id.clone(), kept.id.clone()];
        ids.sort();
        ids
    });
    for builtin in ["default", "minimal"] {
        let e = remove_image(&images, builtin, &|_| false).unwrap_err().to_string();
        assert!(e.contains("built-in"), "{e}");
    }
    let e = remove_image(&images, "nosuch", &|_| false).unwrap_err().to_string();
    assert!(e.contains("nosuch") && e.contains("image ls"), "{e}");
    // "b" still records the tree: only the name goes.
    let gone = remove_image(&images, "a", &|_| false).unwrap();
    assert!(!gone.tree_removed && gone.images_removed.is_empty(), "{gone:?}");
    assert!(imported_image(&images, "a").unwrap().is_none());
    assert!(images.join(&a.tree).is_dir() && made.rootfs.is_dir());
    assert_eq!(image_names(&images).unwrap(), ["default", "minimal", "b"]);
    // The last name takes the tree and the images nothing holds on to.
    let gone = remove_image(&images, "b", &|id| id == kept.id).unwrap();
    assert!(gone.tree_removed, "{gone:?}");
    assert_eq!(gone.images_removed, vec![made.id.clone()]);
    assert!(!images.join(&a.tree).exists() && !images.join(&made.id).exists());
    assert!(kept.rootfs.is_dir(), "an image a sandbox or snapshot uses stays");
    assert_eq!(image_names(&images).unwrap(), ["default", "minimal"]);
    no_temporaries(&images);
}
