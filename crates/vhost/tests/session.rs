//! A vhost-user session over the server's socket, driven by rust-vmm's front-end side of the
//! protocol (what QEMU speaks): negotiation and config through the real messages, and a
//! session that ends when the front end goes away, after which the server serves the next.

use std::path::Path;
use std::thread::JoinHandle;

use branchbox_disk::OverlayBackend;
use branchbox_vhost::{Backend, ServeError, VhostServer};
use branchbox_virtio::blk::Block;
use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::VhostBackend;

fn block(dir: &Path) -> Block {
    let base = dir.join("base.img");
    if !base.exists() {
        std::fs::write(&base, vec![0u8; 1 << 20]).expect("base disk");
    }
    Block::new(Box::new(OverlayBackend::open(&base, &dir.join("overlay.img")).expect("disk")), "t")
}

fn session(mut server: VhostServer, dir: &Path) -> JoinHandle<(VhostServer, Result<(), ServeError>)> {
    let backend = Backend::new(block(dir));
    std::thread::spawn(move || {
        let result = server.serve(backend);
        (server, result)
    })
}

/// Negotiates like QEMU's vhost-user-blk and reads the capacity from the config space.
fn negotiate(socket: &Path) -> u64 {
    let mut frontend = Frontend::connect(socket, 1).expect("connect");
    let features = frontend.get_features().expect("features");
    assert_ne!(features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits(), 0);
    frontend.set_features(features).expect("set features");
    let protocol = frontend.get_protocol_features().expect("protocol features");
    assert!(protocol.contains(VhostUserProtocolFeatures::CONFIG | VhostUserProtocolFeatures::MQ));
    frontend.set_protocol_features(protocol).expect("set protocol features");
    assert_eq!(frontend.get_queue_num().expect("queue count"), 1);
    let (_, config) = frontend.get_config(0, 8, VhostUserConfigFlags::empty(), &[0u8; 8]).expect("config");
    u64::from_le_bytes(config.try_into().expect("8 bytes"))
}

#[test]
fn a_front_end_negotiates_over_the_socket_and_a_second_session_follows_the_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("blk.sock");
    let server = VhostServer::bind(&socket).expect("bind");

    let first = session(server, dir.path());
    assert_eq!(negotiate(&socket), (1 << 20) / 512);
    // The front end dropped its connection: the session ends without error.
    let (server, result) = first.join().expect("session thread");
    result.expect("a front end that leaves ends the session cleanly");

    let second = session(server, dir.path());
    assert_eq!(negotiate(&socket), (1 << 20) / 512);
    second.join().expect("session thread").1.expect("second session");
}

#[test]
fn a_socket_that_cannot_be_bound_is_named_in_the_error() {
    let path = Path::new("/nonexistent-dir-for-branchbox/blk.sock");
    let err = VhostServer::bind(path).err().expect("binding in a missing directory fails");
    assert!(err.to_string().contains("/nonexistent-dir-for-branchbox/blk.sock"), "{err}");
}

#[test]
fn the_features_qemu_7_2_vhost_user_rng_acks_are_accepted() {
    use branchbox_virtio::rng::Rng;
    use vhost::vhost_user::message::VhostUserHeaderFlag;

    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("rng.sock");
    let mut server = VhostServer::bind(&socket).expect("bind");
    let session = std::thread::spawn(move || server.serve(Backend::new(Rng::new())));

    let mut frontend = Frontend::connect(&socket, 1).expect("connect");
    frontend.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
    frontend.get_features().expect("features");
    let protocol = frontend.get_protocol_features().expect("protocol features");
    frontend.set_protocol_features(protocol).expect("set protocol features");
    // What QEMU 7.2's vhost-user-rng sent (seen on the socket): the guest's features passed
    // through unmasked, indirect descriptors included.
    let qemu_acks = 1 << 28 | 1 << 29 | 1 << 32 | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
    frontend.set_features(qemu_acks).expect("the back end refused QEMU's feature ack");
    assert_eq!(frontend.get_queue_num().expect("the session goes on"), 1);
    drop(frontend);
    session.join().expect("session thread").expect("session");
}
