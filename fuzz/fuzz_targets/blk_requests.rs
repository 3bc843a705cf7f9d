//! Fuzz target: see `branchbox_virtio::fuzz::blk_requests`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    branchbox_virtio::fuzz::blk_requests(data);
});
