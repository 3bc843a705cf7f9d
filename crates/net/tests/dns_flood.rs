//! A guest flooding its resolver under an allow-list, against an upstream that answers 200 new
//! addresses per name (issue 27, M2), run for real (root): the router's `resolved` set in the
//! kernel never holds more than the bound, answers past it are refused, and the `nft` work it
//! causes stays a small fraction of a core. The upstream lives in the test's own internet
//! namespace, the queries leave from the sandbox's guest namespace.

use branchbox_net::learned::MAX_LEARNED;
use branchbox_net::testing::{Internet, DNS_SERVER};
use branchbox_net::{in_netns, AllowList, Egress, NetConfig, Uplink, GATEWAY};
use hickory_proto::op::{Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::{rdata::A, Name, RData, Record, RecordType};
use std::net::{Ipv4Addr, UdpSocket};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the guest floods.
const FLOOD: Duration = Duration::from_secs(8);
/// Guest threads asking at once (the attack).
const ASKERS: usize = 32;

/// An upstream on [`DNS_SERVER`]:53 in `netns` answering each query with 200 addresses:
/// the same 200 each time, or 200 never given before while `fresh` is set (values only:
/// nothing is sent to them).
fn generous_upstream(netns: &str, fresh: Arc<AtomicBool>, stop: Arc<AtomicBool>) {
    let socket = in_netns(netns, || UdpSocket::bind((DNS_SERVER, 53))).unwrap().unwrap();
    socket.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    std::thread::spawn(move || {
        let same = u32::from(Ipv4Addr::new(11, 0, 0, 0));
        let mut next = same + 200;
        let mut buf = [0u8; 512];
        while !stop.load(Ordering::SeqCst) {
            let Ok((n, from)) = socket.recv_from(&mut buf) else { continue };
            let Ok(got) = Message::from_vec(&buf[..n]) else { continue };
            let mut reply = got.clone();
            reply.set_message_type(MessageType::Response);
            let name = got.queries()[0].name().clone();
            let first = if fresh.load(Ordering::SeqCst) {
                next += 200;
                next - 200
            } else {
                same
            };
            for a in first..first + 200 {
                reply.add_answer(Record::from_rdata(name.clone(), 300, RData::A(A::from(Ipv4Addr::from(a)))));
            }
            let _ = socket.send_to(&reply.to_vec().unwrap(), from);
        }
    });
}

/// The number of elements in the router's `resolved` set now.
fn set_size(router_ns: &str) -> usize {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", router_ns, "nft", "list", "set", "inet", "branchbox", "resolved"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).matches(" expires ").count()
}

/// CPU seconds (user and system) of the waited-for children of this process so far.
fn children_cpu() -> f64 {
    // SAFETY: getrusage(2) fills the zeroed struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) };
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    s(u.ru_utime) + s(u.ru_stime)
}

fn ask(socket: &UdpSocket, name: &str, id: u16) -> Option<ResponseCode> {
    let mut q = Message::new();
    q.set_id(id).set_message_type(MessageType::Query).set_recursion_desired(true);
    q.add_query(Query::query(Name::from_str(name).ok()?, RecordType::A));
    socket.send(&q.to_vec().ok()?).ok()?;
    let mut buf = vec![0u8; 8192];
    loop {
        let n = socket.recv(&mut buf).ok()?;
        let reply = Message::from_vec(&buf[..n]).ok()?;
        if reply.id() == id {
            return Some(reply.response_code());
        }
    }
}

#[test]
fn a_flood_of_allow_list_answers_keeps_the_learned_set_within_its_bound_and_nft_off_the_cpu() {
    let inet = Internet::start(&format!("bbt-dnsflood-{}", std::process::id())).unwrap();
    let cfg = NetConfig {
        uplink: Uplink::Netns(inet.netns.clone()),
        pool: "100.127.0.0/16".parse().unwrap(),
        state_dir: PathBuf::from(format!("/tmp/bbnet-test-dnsflood-{}", std::process::id())),
        resolvers: vec![DNS_SERVER],
    };
    let id = format!("sbx-{:08x}00000001", std::process::id());
    let names = branchbox_net::Names::of(&id).unwrap();
    let list = Egress::AllowList(AllowList::parse(&["*.example.com"]).unwrap());
    cfg.setup(&id, &list, &cfg.state_dir).unwrap();
    let (fresh, stop) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    generous_upstream(&inet.netns, Arc::clone(&fresh), Arc::clone(&stop));
    let policy = list.clone();
    branchbox_net::dns::start(cfg.clone(), &id, Box::new(move || Some(policy.clone()))).unwrap();

    // Every answer the same 200 addresses: each one used to cost an `nft`.
    let same = flood(&names);
    // Every answer 200 new addresses, past the bound.
    fresh.store(true, Ordering::SeqCst);
    let new = flood(&names);
    stop.store(true, Ordering::SeqCst);
    let last = set_size(&names.router_ns);
    let _ = cfg.teardown(&id);
    let _ = std::fs::remove_dir_all(&cfg.state_dir);
    // The issue measured 1.5 of this host's 2 cores; a quarter of one is a generous bound.
    for f in [&same, &new] {
        assert!(f.cpu < 0.25 * f.wall, "nft took {:.2} s of CPU in {:.1} s", f.cpu, f.wall);
    }
    assert!(same.answered > 100 && same.refused == 0, "{same:?}");
    let largest = same.largest.max(new.largest).max(last);
    assert!(largest <= MAX_LEARNED, "the set held {largest} addresses");
    assert_eq!(
        last, 4000,
        "the same 200, then 19 answers of 200 new ones fit under the bound of {MAX_LEARNED}"
    );
    assert_eq!(new.answered, 19, "{new:?}");
    assert!(new.refused > 0, "nothing was refused past the bound");
}

/// What one flood saw.
#[derive(Debug)]
struct Flood {
    answered: usize,
    refused: usize,
    /// The most addresses the set held when looked at.
    largest: usize,
    /// CPU seconds of this process's children (the forwarder's `nft`s) meanwhile.
    cpu: f64,
    wall: f64,
}

/// [`ASKERS`] threads of the guest asking for new names under `*.example.com` for [`FLOOD`].
fn flood(names: &branchbox_net::Names) -> Flood {
    let cpu_before = children_cpu();
    let started = Instant::now();
    let (answered, refused) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let askers: Vec<_> = (0..ASKERS)
        .map(|t| {
            let socket =
                in_netns(&names.guest_ns, || UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))).unwrap().unwrap();
            socket.connect((GATEWAY, 53)).unwrap();
            socket.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            let (answered, refused) = (Arc::clone(&answered), Arc::clone(&refused));
            std::thread::spawn(move || {
                let mut i = 0u32;
                while started.elapsed() < FLOOD {
                    i += 1;
                    match ask(&socket, &format!("n{t}-{i}.example.com."), i as u16) {
                        Some(ResponseCode::NoError) => answered.fetch_add(1, Ordering::SeqCst),
                        Some(ResponseCode::Refused) => refused.fetch_add(1, Ordering::SeqCst),
                        _ => 0,
                    };
                }
            })
        })
        .collect();
    let mut largest = 0;
    while started.elapsed() < FLOOD {
        largest = largest.max(set_size(&names.router_ns));
        std::thread::sleep(Duration::from_millis(500));
    }
    for a in askers {
        a.join().unwrap();
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu = children_cpu() - cpu_before;
    let (answered, refused) = (answered.load(Ordering::SeqCst), refused.load(Ordering::SeqCst));
    eprintln!(
        "{answered} answered, {refused} refused in {wall:.1} s; the set held at most {largest}; nft used {cpu:.2} s of CPU ({:.1}% of a core)",
        100.0 * cpu / wall
    );
    Flood { answered, refused, largest, cpu, wall }
}
