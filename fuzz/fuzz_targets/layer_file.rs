//! Fuzz target: the layer-file parser (`branchbox_disk::format`) on arbitrary bytes, as a
//! top (valid prefix) and as a frozen delta (the first byte says how many slots a manifest
//! would claim). Layer files are untrusted input: any bytes must parse or be refused, never
//! panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = branchbox_disk::format::parse_layer(data, None);
    let claimed = data.first().map(|&b| u64::from(b));
    let _ = branchbox_disk::format::parse_layer(data, claimed);
});
