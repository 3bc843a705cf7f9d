//! Copy-on-write disks under a real Linux kernel: QEMU (software emulation) boots the project's
//! guest on a layered disk (branchbox-disk) served by our vhost-user block server. The guest
//! writes a file; the host freezes the disk and forks two tops; each child boot sees the
//! parent's file and only its own later writes.
//!
//! Needs `qemu-system-x86_64` and the built guest kernel and disk, like qemu_e2e.rs; fails,
//! naming the command to run, when either is missing.

use std::path::Path;
use std::time::Duration;

use branchbox_disk::{LayeredBackend, Store};
use branchbox_guest_tests::artifacts::{guest_files, GuestFiles};
use branchbox_guest_tests::qemu::{agent, one_guest_at_a_time, sh, Devices, Qemu};

/// Boots `files` on `disk`, runs `check` with the agent, powers the guest off and waits for
/// every server session to end (the backend is dropped, its top closed).
fn boot_on(
    files: &GuestFiles,
    dir: &Path,
    name: &str,
    disk: LayeredBackend,
    check: impl FnOnce(&mut branchbox_protocol::client::AgentClient<std::os::unix::net::UnixStream>),
) {
    let devices = Devices::with_disk(dir, Box::new(disk));
    let mut qemu = Qemu::boot(files, &devices, &dir.join(format!("console-{name}.log")));
    let (mut guest, answered) = agent(&mut qemu, &devices.vsock_host_socket);
    eprintln!("{name}: boot to the agent's first answer on a layered disk: {} ms", answered.as_millis());
    check(&mut guest);
    guest.shutdown(false).expect("ask the agent to power off");
    let status = qemu.wait_exit(Duration::from_secs(60));
    assert!(status.success(), "QEMU ended with {status} on {name}'s power-off");
    assert_eq!(devices.blk.rejected(0), 0, "the real driver's requests were refused");
    devices.finish();
}

fn layer_bytes(store: &Store, id: u64) -> Vec<u8> {
    std::fs::read(store.root().join(format!("layers/{id:016x}.layer"))).expect("read a layer file")
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[test]
fn a_frozen_disk_forks_into_children_that_see_the_parent_and_only_their_own_writes() {
    let _one = one_guest_at_a_time();
    let files = guest_files();
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(&dir.path().join("store")).expect("layer store");
    let base_len = std::fs::metadata(&files.rootfs).expect("stat the cached rootfs").len();

    // The parent writes a file through our block server into its top layer.
    let marker = format!("branchbox-layers-parent-{}", std::process::id());
    let parent = LayeredBackend::create(&store, "parent", &files.rootfs).expect("create the parent's chain");
    boot_on(&files, dir.path(), "parent", parent, |guest| {
        sh(guest, &format!("echo {marker} > /root/parent && sync"));
    });

    // The host freezes the parent's disk (the guest is off: nothing in flight) and forks.
    let mut parent = LayeredBackend::open(&store, "parent").expect("reopen the parent");
    let frozen = parent.freeze().expect("freeze");
    let parent_top = parent.top_id();
    drop(parent);
    let children = LayeredBackend::fork(&store, &frozen, &["a", "b"]).expect("fork two tops");
    let tops: Vec<u64> = children.iter().map(LayeredBackend::top_id).collect();

    for (child, name) in children.into_iter().zip(["a", "b"]) {
        boot_on(&files, dir.path(), name, child, |guest| {
            assert_eq!(
                sh(guest, "cat /root/parent"),
                format!("{marker}\n"),
                "child {name} lost the parent's file"
            );
            let others = sh(guest, "ls /root | grep '^child-' || true");
            assert_eq!(others, "", "child {name} sees another child's files");
            sh(guest, &format!("echo {name}-{marker} > /root/child-{name} && sync"));
        });
    }

    // Each child's write is in its own top and nowhere else.
    let (a, b) = (layer_bytes(&store, tops[0]), layer_bytes(&store, tops[1]));
    assert!(contains(&a, &format!("a-{marker}")) && !contains(&a, &format!("b-{marker}")));
    assert!(contains(&b, &format!("b-{marker}")) && !contains(&b, &format!("a-{marker}")));
    for id in frozen.layer_ids().into_iter().chain([parent_top]) {
        let parent_layer = layer_bytes(&store, id);
        assert!(
            !contains(&parent_layer, &format!("a-{marker}"))
                && !contains(&parent_layer, &format!("b-{marker}"))
        );
    }
    assert_eq!(std::fs::metadata(&files.rootfs).expect("stat").len(), base_len, "the cached rootfs changed");
}
