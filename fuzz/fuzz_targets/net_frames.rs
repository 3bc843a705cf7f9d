//! Fuzz target: see `branchbox_virtio::fuzz::net_frames`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    branchbox_virtio::fuzz::net_frames(data);
});
