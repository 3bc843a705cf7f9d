//! Fuzz target: see `branchbox_virtio::fuzz::rng_chains`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    branchbox_virtio::fuzz::rng_chains(data);
});
