//! Fuzz target: see `branchbox_virtio::fuzz::vsock_packets`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    branchbox_virtio::fuzz::vsock_packets(data);
});
