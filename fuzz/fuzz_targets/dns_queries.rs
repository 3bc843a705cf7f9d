//! Fuzz target: what the sandbox's DNS forwarder does with a message from the guest before
//! anything leaves the sandbox, under each kind of policy. Any bytes must be ignored, answered
//! or forwarded, never panic; an answer must itself be a DNS message carrying the query's id,
//! and only a query for a listed name may be forwarded under an allow-list.
#![no_main]

use branchbox_net::dns::{screen, Screened};
use branchbox_net::{AllowList, Egress};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let list = Egress::AllowList(AllowList::parse(&["pypi.org", "*.github.com", "192.0.2.0/24"]).expect("a list"));
    for egress in [Some(Egress::Internet), Some(Egress::DenyAll), Some(list.clone()), None] {
        match screen(data, egress.as_ref()) {
            Screened::Ignore => {}
            Screened::Reply(reply) => {
                assert!(reply.len() >= 12, "an answer shorter than a DNS header");
                assert_eq!(reply[..2], data[..2], "an answer under another id");
            }
            Screened::Forward { name, learn, .. } => {
                assert!(matches!(egress, Some(Egress::Internet)) || learn, "{name} forwarded under {egress:?}");
                if let Some(Egress::AllowList(l)) = &egress {
                    assert!(l.allows_name(&name), "{name} is not on the list");
                }
            }
        }
    }
});
