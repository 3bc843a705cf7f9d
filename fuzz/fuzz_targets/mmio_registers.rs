//! Fuzz target: see `branchbox_virtio::fuzz::mmio_registers`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    branchbox_virtio::fuzz::mmio_registers(data);
});
