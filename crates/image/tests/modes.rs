//! Under the CLI's umask 077, what an image gains (the agent, the compat library, directories an
//! import makes) stays usable by a sandbox's non-root users. Its own test binary: umask is
//! process-wide.

#[path = "support/oci_writer.rs"]
mod oci_writer;

use branchbox_image::{import_image, resolve_image, ImportLimits, STATX_COMPAT_IN_IMAGE};
use oci_writer::{layer, write_dir, Entry, Image};
use std::os::unix::fs::PermissionsExt;

#[test]
fn the_agent_the_compat_library_and_made_directories_are_readable_by_everyone() {
    // SAFETY: umask has no preconditions.
    unsafe { libc::umask(0o077) };
    let d = tempfile::tempdir().unwrap();
    let (images, src) = (d.path().join("images"), d.path().join("layout"));
    // No directory entries: usr/, usr/lib64/ and bin/ are made as parents.
    let base = layer(&[
        Entry::File("usr/lib64/ld-linux-x86-64.so.2".into(), b"loader".to_vec(), 0o755),
        Entry::Symlink("lib64", "usr/lib64"),
        Entry::File("bin/tool".into(), b"tool".to_vec(), 0o755),
    ]);
    write_dir(&src, &Image { layers: vec![(base, false)], env: vec![], workdir: None }.oci_files());
    import_image(&images, "modes", &src, ImportLimits::default(), &mut |_| {}).unwrap();
    let agent = d.path().join("agent");
    std::fs::write(&agent, b"agent").unwrap();
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o700)).unwrap();
    let img = resolve_image(&images, "modes", &agent, "unused", &mut |_| {}).unwrap();
    let mode = |p: &str| std::fs::metadata(img.rootfs.join(p)).unwrap().permissions().mode() & 0o7777;
    let compat = STATX_COMPAT_IN_IMAGE.trim_start_matches('/');
    assert_eq!(mode(compat), 0o644);
    assert_eq!(mode(compat.rsplit_once('/').unwrap().0), 0o755);
    assert_eq!(mode("usr/local/bin/branchbox-agent"), 0o755);
    for dir in ["usr", "usr/lib64", "bin", "usr/local"] {
        assert_eq!(mode(dir), 0o755, "{dir}");
    }
    assert_eq!(mode("tmp"), 0o1777);
}
