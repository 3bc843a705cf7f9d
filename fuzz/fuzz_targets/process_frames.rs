//! Fuzz target: see `branchbox_vmm::process::protocol::fuzz_frames`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    branchbox_vmm::process::protocol::fuzz_frames(data);
});
