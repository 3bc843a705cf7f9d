//! The root disk built end to end from a small image tree: mkfs.ext4 -d, the init links, the
//! cache. The agent here is a static C program (a static agent needs no libraries from the
//! image, so the tree needs no libc); the real image and agent are built by
//! `scripts/test.sh` through `branchbox guest disk`.

use branchbox_image::{cached_disk, ensure_disk, Image};
use std::path::Path;
use std::process::Command;

fn debugfs(disk: &Path, request: &str) -> String {
    let out = Command::new("debugfs").arg("-R").arg(request).arg(disk).output().unwrap();
    assert!(out.status.success(), "debugfs {request}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn an_image_tree_becomes_an_ext4_disk_with_the_agent_as_init() {
    let d = tempfile::tempdir().unwrap();
    let rootfs = d.path().join("img/rootfs");
    for dir in ["usr/sbin", "usr/local/bin", "etc", "proc", "dev"] {
        std::fs::create_dir_all(rootfs.join(dir)).unwrap();
    }
    std::os::unix::fs::symlink("usr/sbin", rootfs.join("sbin")).unwrap();
    std::fs::write(rootfs.join("etc/motd"), b"hello from the image\n").unwrap();
    let src = d.path().join("agent.c");
    std::fs::write(&src, "int main(void) { return 0; }\n").unwrap();
    let agent = d.path().join("agent");
    let cc = Command::new("cc").arg("-static").arg("-o").arg(&agent).arg(&src).status().unwrap();
    assert!(cc.success(), "cc -static failed: install libc6-dev");
    std::fs::copy(&agent, rootfs.join("usr/local/bin/branchbox-agent")).unwrap();
    let image = Image { id: "img-0000000000000001".into(), rootfs: rootfs.clone(), built: false };
    let cache = d.path().join("cache");

    assert_eq!(cached_disk(&cache, &image, &agent).unwrap(), None);
    let mut steps = Vec::new();
    let disk = ensure_disk(&cache, &image, &agent, &mut |m| steps.push(m.to_string())).unwrap();
    assert!(disk.built);
    assert!(disk.path.starts_with(cache.join("disk").join(&disk.hash)));
    assert_eq!(disk.path.file_name().unwrap(), "rootfs.ext4");
    assert_eq!(disk.bytes % (64 << 20), 0);
    assert!(disk.bytes >= 512 << 20, "no headroom: {} bytes", disk.bytes);

    let fsck = Command::new("e2fsck").arg("-fn").arg(&disk.path).output().unwrap();
    assert!(fsck.status.success(), "{}", String::from_utf8_lossy(&fsck.stdout));
    assert!(debugfs(&disk.path, "stat /usr/sbin/init")
        .contains("Fast link dest: \"/usr/local/bin/branchbox-agent\""));
    assert!(debugfs(&disk.path, "stat /init").contains("Fast link dest: \"/usr/local/bin/branchbox-agent\""));
    assert_eq!(debugfs(&disk.path, "cat /etc/motd"), "hello from the image\n");
    // The image tree itself was not changed.
    assert!(!rootfs.join("init").exists() && !rootfs.join("usr/sbin/init").exists());
    // Nothing but the finished disk is left in the cache directory.
    let left: Vec<String> = std::fs::read_dir(cache.join("disk"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != ".lock")
        .collect();
    assert_eq!(left, vec![disk.hash.clone()]);

    let again = ensure_disk(&cache, &image, &agent, &mut |m| panic!("a cache hit reported {m:?}")).unwrap();
    assert_eq!((again.path.clone(), again.built), (disk.path.clone(), false));
    assert_eq!(cached_disk(&cache, &image, &agent).unwrap(), Some(again));
}
