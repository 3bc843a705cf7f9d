//! Fuzz target: the guest's `/proc/net/tcp` text, read before a networked sandbox is
//! checkpointed (`branchbox_net::conns`). Any bytes must parse without panicking into at most
//! `MAX_LINES` connections, each open and leaving the guest.
#![no_main]

use branchbox_net::conns::{leaving, MAX_LINES};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let found = leaving(&String::from_utf8_lossy(data));
    assert!(found.len() <= MAX_LINES);
    for c in &found {
        assert!(!c.remote.ip().is_loopback() && !c.remote.ip().is_unspecified(), "{c}");
        assert_ne!(c.state, "", "{c}");
    }
});
