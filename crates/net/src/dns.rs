//! The sandbox's resolver: a DNS forwarder on the router's guest-side address (the guest's
//! gateway, port 53, UDP and TCP), one per networked sandbox, run by its shim. A query that
//! comes over TCP (the guest's resolver retries there when a UDP answer was truncated) is
//! asked upstream over TCP too, so large answers arrive whole.
//!
//! It asks the upstream resolvers ([`NetConfig::upstreams`]) from the host's namespace (or the
//! uplink namespace), so a host resolver on loopback works and the guest never talks to a
//! resolver itself. What it passes on follows the sandbox's policy, read again for each query
//! so a change at runtime applies at once:
//! - `internet`: every query;
//! - `deny-all`: none (REFUSED): a resolver that asks for any name is a way out;
//! - `allow-list`: only the listed host names; each public IPv4 address of an answer is added
//!   to the router's `resolved` set, for the record's lifetime (within [`MIN_ALLOW_S`] and
//!   [`MAX_ALLOW_S`]), before the guest sees the answer. Private addresses in answers are
//!   passed on but never allowed: a listed name that resolves to the metadata address opens
//!   nothing (list the network itself to reach a private address). The set is updated in
//!   batches, at most one `nft` per [`crate::learned::BATCH_INTERVAL`], and holds at most
//!   [`MAX_LEARNED`] addresses: an answer that would take it past that is REFUSED
//!   ([`crate::learned`]).
//!
//! Everything from the guest is parsed (hickory-proto) before anything is done with it; one
//! question per query, answers only to queries, and the upstream's answer must carry the id we
//! gave it and the question asked.

use crate::exec::in_netns;
use crate::learned::{Learned, Refusal, Sink, BATCH_INTERVAL, MAX_LEARNED};
use crate::policy::{is_private, Egress};
use crate::sandbox::GATEWAY;
use crate::{Error, Names, NetConfig, Result};
use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::RData;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The largest DNS message over UDP taken or passed on (the usual EDNS buffer size).
const MAX_MESSAGE: usize = 4096;
/// How long one upstream resolver gets to answer before the next one is asked.
const UPSTREAM_WAIT: Duration = Duration::from_secs(2);
/// Queries worked on at once; more are dropped, and the guest's resolver asks again.
const MAX_IN_FLIGHT: usize = 32;
/// TCP connections from the guest served at once; more are closed at once.
const MAX_TCP_CONNECTIONS: usize = 8;
/// How long a guest's TCP connection may stay silent, before or between queries.
const TCP_IDLE: Duration = Duration::from_secs(10);
/// The shortest time a resolved address stays allowed: records with a TTL of seconds would
/// expire between the answer and the connection.
pub const MIN_ALLOW_S: u32 = 60;
/// The longest time a resolved address stays allowed without being resolved again.
pub const MAX_ALLOW_S: u32 = 86_400;

/// What to do with a query for one name under a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Ask upstream; with `learn`, allow the answer's addresses.
    Forward { learn: bool },
    /// Answer REFUSED.
    Refuse,
}

fn verdict(egress: Option<&Egress>, name: &str) -> Verdict {
    match egress {
        Some(Egress::Internet) => Verdict::Forward { learn: false },
        Some(Egress::AllowList(list)) if list.allows_name(name) => Verdict::Forward { learn: true },
        _ => Verdict::Refuse,
    }
}

/// The policy as it is now, or `None` when it cannot be read (then nothing is forwarded).
pub type Policy = Box<dyn Fn() -> Option<Egress> + Send + Sync>;

struct Forwarder {
    cfg: NetConfig,
    upstreams: Vec<SocketAddr>,
    policy: Policy,
    in_flight: AtomicUsize,
    tcp_connections: AtomicUsize,
    /// The addresses learned for the allow-list's names, on their way into the router's set.
    learned: Arc<Learned>,
    /// The policy the last query was answered under: when it changes, the router's set was
    /// flushed with it, and what was learned takes no room any more.
    last_policy: Mutex<Option<Egress>>,
    /// Answers refused at the bound, for the log (the first, then every hundredth).
    full: AtomicUsize,
}

/// The router's `resolved` set of one sandbox, updated with `nft` in its router namespace.
struct RouterSet {
    cfg: NetConfig,
    id: String,
}

impl Sink for RouterSet {
    fn add(&self, batch: &[(Ipv4Addr, u32)]) -> Result<()> {
        self.cfg.allow_resolved(&self.id, batch)
    }
}

/// How a query reached the forwarder, and so how it is asked upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Udp,
    Tcp,
}

/// Starts sandbox `id`'s forwarder: binds the guest's resolver address inside its router
/// namespace (an error when that fails, so the sandbox does not start without a resolver) and
/// serves it from a thread of its own for as long as the process lives.
pub fn start(cfg: NetConfig, id: &str, policy: Policy) -> Result<()> {
    let names = Names::of(id)?;
    let cannot = |e: std::io::Error| {
        Error::Command(format!("cannot serve DNS on {GATEWAY}:53 in the namespace {}: {e}", names.router_ns))
    };
    let socket = in_netns(&names.router_ns, || UdpSocket::bind((GATEWAY, 53)))?.map_err(cannot)?;
    let listener = in_netns(&names.router_ns, || TcpListener::bind((GATEWAY, 53)))?.map_err(cannot)?;
    let upstreams: Vec<SocketAddr> = cfg.upstreams().into_iter().map(|a| SocketAddr::from((a, 53))).collect();
    if upstreams.is_empty() {
        eprintln!(
            "branchbox-dns: no upstream resolver (BRANCHBOX_NET_RESOLVERS is unset and /etc/resolv.conf names no IPv4 nameserver); every query will fail"
        );
    }
    let learned =
        Arc::new(Learned::new(Box::new(RouterSet { cfg: cfg.clone(), id: id.to_string() }), MAX_LEARNED));
    let fwd = Arc::new(Forwarder::new(cfg, upstreams, policy, Arc::clone(&learned)));
    std::thread::spawn(move || learned.run(BATCH_INTERVAL));
    let tcp = Arc::clone(&fwd);
    std::thread::spawn(move || serve_tcp(listener, tcp));
    std::thread::spawn(move || serve(Arc::new(socket), fwd));
    Ok(())
}

/// Serves DNS over TCP (RFC 7766): each message behind its two-byte length, answered in turn
/// on the same connection, which closes after [`TCP_IDLE`] of silence or on anything that
/// is not a whole message.
fn serve_tcp(listener: TcpListener, fwd: Arc<Forwarder>) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        if fwd.tcp_connections.fetch_add(1, Ordering::SeqCst) >= MAX_TCP_CONNECTIONS {
            fwd.tcp_connections.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let fwd = Arc::clone(&fwd);
        std::thread::spawn(move || {
            let _ =
                conn.set_read_timeout(Some(TCP_IDLE)).and_then(|()| conn.set_write_timeout(Some(TCP_IDLE)));
            let mut conn = conn;
            while let Some(query) = read_tcp_message(&mut conn) {
                if let Some(reply) = fwd.answer(&query, Transport::Tcp) {
                    if write_tcp_message(&mut conn, &reply).is_err() {
                        break;
                    }
                }
            }
            fwd.tcp_connections.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// One length-prefixed DNS message from `r`, or `None` at its end, on an error or timeout, or
/// for an empty message.
fn read_tcp_message(r: &mut impl Read) -> Option<Vec<u8>> {
    let mut len = [0u8; 2];
    r.read_exact(&mut len).ok()?;
    let len = usize::from(u16::from_be_bytes(len));
    if len == 0 {
        return None;
    }
    let mut msg = vec![0u8; len];
    r.read_exact(&mut msg).ok()?;
    Some(msg)
}

/// Writes `msg` behind its two-byte length (a DNS message over TCP is at most 65,535 bytes).
fn write_tcp_message(w: &mut impl Write, msg: &[u8]) -> std::io::Result<()> {
    let len =
        u16::try_from(msg.len()).map_err(|_| std::io::Error::other("a DNS message over 65,535 bytes"))?;
    let mut framed = Vec::with_capacity(msg.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(msg);
    w.write_all(&framed)
}

fn serve(socket: Arc<UdpSocket>, fwd: Arc<Forwarder>) {
    let mut buf = vec![0u8; MAX_MESSAGE];
    loop {
        let (n, from) = match socket.recv_from(&mut buf) {
            Ok(got) => got,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("branchbox-dns: receive failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        if fwd.in_flight.fetch_add(1, Ordering::SeqCst) >= MAX_IN_FLIGHT {
            fwd.in_flight.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let (query, socket, fwd) = (buf[..n].to_vec(), Arc::clone(&socket), Arc::clone(&fwd));
        std::thread::spawn(move || {
            if let Some(reply) = fwd.answer(&query, Transport::Udp) {
                let _ = socket.send_to(&reply, from);
            }
            fwd.in_flight.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// An answer with `code` and no records to `query` (its id, opcode and question kept).
fn refusal(query: &Message, code: ResponseCode) -> Option<Vec<u8>> {
    let mut m = Message::error_msg(query.id(), query.op_code(), code);
    m.add_queries(query.queries().iter().cloned());
    m.set_recursion_desired(query.recursion_desired());
    m.to_vec().ok()
}

/// What a message from the guest asks of the forwarder, decided before anything leaves it.
#[derive(Debug)]
pub enum Screened {
    /// Say nothing: not a query, or too short to answer.
    Ignore,
    /// Answer this at once (FORMERR, NOTIMP, REFUSED).
    Reply(Vec<u8>),
    /// Ask upstream; with `learn`, allow the answer's public addresses first.
    Forward {
        /// The parsed query.
        query: Box<Message>,
        /// Its name.
        name: String,
        /// True for a name of an allow-list.
        learn: bool,
    },
}

/// Screens the raw message `raw` from the guest under the policy `egress` (`None`: none could
/// be read, so nothing is forwarded). Pure: it is what the fuzz target `dns_queries` runs.
pub fn screen(raw: &[u8], egress: Option<&Egress>) -> Screened {
    let Ok(query) = Message::from_vec(raw) else {
        // Answer FORMERR to anything with a header; a runt gets nothing.
        let (Some(a), Some(b)) = (raw.first(), raw.get(1)) else { return Screened::Ignore };
        let id = u16::from_be_bytes([*a, *b]);
        return match Message::error_msg(id, OpCode::Query, ResponseCode::FormErr).to_vec() {
            Ok(reply) => Screened::Reply(reply),
            Err(_) => Screened::Ignore,
        };
    };
    if query.message_type() != MessageType::Query {
        return Screened::Ignore;
    }
    let code = if query.op_code() != OpCode::Query {
        ResponseCode::NotImp
    } else if let [question] = query.queries() {
        let name = question.name().to_ascii();
        match verdict(egress, &name) {
            Verdict::Forward { learn } => return Screened::Forward { query: Box::new(query), name, learn },
            Verdict::Refuse => ResponseCode::Refused,
        }
    } else {
        ResponseCode::FormErr
    };
    refusal(&query, code).map_or(Screened::Ignore, Screened::Reply)
}

impl Forwarder {
    fn new(cfg: NetConfig, upstreams: Vec<SocketAddr>, policy: Policy, learned: Arc<Learned>) -> Forwarder {
        Forwarder {
            cfg,
            upstreams,
            policy,
            in_flight: AtomicUsize::new(0),
            tcp_connections: AtomicUsize::new(0),
            learned,
            last_policy: Mutex::new(None),
            full: AtomicUsize::new(0),
        }
    }

    /// The policy now; what was learned under another one is forgotten.
    fn policy_now(&self) -> Option<Egress> {
        let now = (self.policy)();
        let mut last = self.last_policy.lock().unwrap_or_else(|e| e.into_inner());
        if *last != now {
            if last.is_some() {
                self.learned.forget();
            }
            last.clone_from(&now);
        }
        now
    }

    /// The answer to the raw message `raw` from the guest, which came `via`, or `None` to say
    /// nothing.
    fn answer(&self, raw: &[u8], via: Transport) -> Option<Vec<u8>> {
        let (query, name, learn) = match screen(raw, self.policy_now().as_ref()) {
            Screened::Ignore => return None,
            Screened::Reply(reply) => return Some(reply),
            Screened::Forward { query, name, learn } => (query, name, learn),
        };
        let Some(mut reply) = self.ask_upstream(raw, via) else {
            return refusal(&query, ResponseCode::ServFail);
        };
        let Ok(parsed) = Message::from_vec(&reply) else { return refusal(&query, ResponseCode::ServFail) };
        if parsed.message_type() != MessageType::Response || parsed.queries() != query.queries() {
            return refusal(&query, ResponseCode::ServFail);
        }
        if learn {
            let (addrs, ttl) = public_addresses(&parsed);
            match self.learned.learn(&addrs, ttl) {
                Ok(()) => {}
                Err(e @ Refusal::Full { .. }) => {
                    let n = self.full.fetch_add(1, Ordering::SeqCst);
                    if n.is_multiple_of(100) {
                        eprintln!(
                            "branchbox-dns: {name}: {e} (answers refused at the bound so far: {})",
                            n + 1
                        );
                    }
                    return refusal(&query, ResponseCode::Refused);
                }
                Err(e) => {
                    eprintln!("branchbox-dns: {name}: {e}");
                    return refusal(&query, ResponseCode::ServFail);
                }
            }
        }
        reply[..2].copy_from_slice(&query.id().to_be_bytes());
        Some(reply)
    }

    /// The raw answer of the first upstream resolver that answers `raw` (sent under an id of
    /// our own, which the answer must carry), asked over the transport the guest used.
    fn ask_upstream(&self, raw: &[u8], via: Transport) -> Option<Vec<u8>> {
        let mut query = raw.to_vec();
        let id = random_id();
        query[..2].copy_from_slice(&id.to_be_bytes());
        if via == Transport::Tcp {
            return self.upstreams.iter().find_map(|up| self.ask_upstream_tcp(*up, &query, id));
        }
        for up in &self.upstreams {
            let socket = match self.cfg.uplink_ns() {
                Some(ns) => in_netns(ns, || UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))).ok()?.ok()?,
                None => UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).ok()?,
            };
            if socket.connect(up).and_then(|()| socket.send(&query)).is_err() {
                continue;
            }
            let deadline = Instant::now() + UPSTREAM_WAIT;
            let mut buf = vec![0u8; MAX_MESSAGE];
            while let Some(left) = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
                let _ = socket.set_read_timeout(Some(left));
                match socket.recv(&mut buf) {
                    Ok(n) if n >= 2 && buf[..2] == id.to_be_bytes() => return Some(buf[..n].to_vec()),
                    Ok(_) => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                }
            }
        }
        None
    }

    /// `query` (under `id`) asked of `up` over TCP, within [`UPSTREAM_WAIT`] for the
    /// connection and for each read and write.
    fn ask_upstream_tcp(&self, up: SocketAddr, query: &[u8], id: u16) -> Option<Vec<u8>> {
        let connect = move || TcpStream::connect_timeout(&up, UPSTREAM_WAIT);
        let mut conn = match self.cfg.uplink_ns() {
            Some(ns) => in_netns(ns, connect).ok()?.ok()?,
            None => connect().ok()?,
        };
        conn.set_read_timeout(Some(UPSTREAM_WAIT)).ok()?;
        conn.set_write_timeout(Some(UPSTREAM_WAIT)).ok()?;
        write_tcp_message(&mut conn, query).ok()?;
        let reply = read_tcp_message(&mut conn)?;
        (reply.len() >= 2 && reply[..2] == id.to_be_bytes()).then_some(reply)
    }
}

/// The public IPv4 addresses among `reply`'s answers, and how long to allow them: the
/// shortest TTL among their records, within [`MIN_ALLOW_S`] and [`MAX_ALLOW_S`].
fn public_addresses(reply: &Message) -> (Vec<Ipv4Addr>, u32) {
    let mut addrs = Vec::new();
    let mut ttl = MAX_ALLOW_S;
    for r in reply.answers() {
        if let RData::A(a) = r.data() {
            if !is_private(a.0) && !addrs.contains(&a.0) {
                addrs.push(a.0);
                ttl = ttl.min(r.ttl());
            }
        }
    }
    (addrs, ttl.clamp(MIN_ALLOW_S, MAX_ALLOW_S))
}

fn random_id() -> u16 {
    let mut b = [0u8; 2];
    // SAFETY: getrandom(2) writes at most the two bytes of `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 2, 0) };
    if n != 2 {
        // Never seen on Linux; a clock-derived id still differs from the guest's.
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        return t.subsec_nanos() as u16;
    }
    u16::from_be_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learned::tests::Counting;
    use crate::policy::AllowList;
    use hickory_proto::op::Query;
    use hickory_proto::rr::{rdata::A, Name, Record, RecordType};
    use std::str::FromStr;

    fn query(name: &str) -> Message {
        let mut m = Message::new();
        m.set_id(0x1234).set_message_type(MessageType::Query).set_recursion_desired(true);
        m.add_query(Query::query(Name::from_str(name).unwrap(), RecordType::A));
        m
    }

    /// A forwarder under `egress` whose upstream is `upstream`, its learned addresses going to
    /// a counting set (flushed by a thread of its own, as in the product).
    fn forwarder(egress: Egress, upstream: SocketAddr) -> Forwarder {
        forwarder_into(egress, upstream, Arc::new(Counting::default()))
    }

    fn forwarder_into(egress: Egress, upstream: SocketAddr, set: Arc<Counting>) -> Forwarder {
        let learned = Arc::new(Learned::new(Box::new(set), MAX_LEARNED));
        let runner = Arc::clone(&learned);
        std::thread::spawn(move || runner.run(BATCH_INTERVAL));
        let policy: Policy = Box::new(move || Some(egress.clone()));
        Forwarder::new(NetConfig::default(), vec![upstream], policy, learned)
    }

    #[test]
    fn the_policy_decides_what_is_forwarded() {
        let list =
            Egress::AllowList(AllowList::parse(&["pypi.org", "*.github.com", "192.0.2.0/24"]).unwrap());
        assert_eq!(verdict(Some(&Egress::Internet), "anything.example."), Verdict::Forward { learn: false });
        assert_eq!(verdict(Some(&Egress::DenyAll), "pypi.org."), Verdict::Refuse);
        assert_eq!(verdict(Some(&list), "PyPI.org."), Verdict::Forward { learn: true });
        assert_eq!(verdict(Some(&list), "api.github.com."), Verdict::Forward { learn: true });
        assert_eq!(verdict(Some(&list), "exfil.attacker.example."), Verdict::Refuse);
        assert_eq!(verdict(None, "pypi.org."), Verdict::Refuse, "an unreadable policy forwards nothing");
    }

    /// A loopback "upstream" that answers one query with `answers` and hands back what it got.
    fn upstream(answers: Vec<([u8; 4], u32)>) -> (SocketAddr, std::thread::JoinHandle<Message>) {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            let (n, from) = socket.recv_from(&mut buf).unwrap();
            let got = Message::from_vec(&buf[..n]).unwrap();
            let mut reply = got.clone();
            reply.set_message_type(MessageType::Response);
            let name = got.queries()[0].name().clone();
            for (addr, ttl) in answers {
                reply.add_answer(Record::from_rdata(
                    name.clone(),
                    ttl,
                    RData::A(A::from(Ipv4Addr::from(addr))),
                ));
            }
            socket.send_to(&reply.to_vec().unwrap(), from).unwrap();
            got
        });
        (addr, server)
    }

    #[test]
    fn refused_names_and_bad_messages_never_reach_upstream() {
        // Nothing listens on this upstream: a query that went out would come back SERVFAIL
        // after UPSTREAM_WAIT instead of REFUSED.
        let f = forwarder(Egress::DenyAll, "127.0.0.1:9".parse().unwrap());
        let r = Message::from_vec(&f.answer(&query("pypi.org.").to_vec().unwrap(), Transport::Udp).unwrap())
            .unwrap();
        assert_eq!((r.id(), r.response_code(), r.queries().len()), (0x1234, ResponseCode::Refused, 1));
        let r = Message::from_vec(&f.answer(&[0xab, 0xcd, 0xff], Transport::Udp).unwrap()).unwrap();
        assert_eq!((r.id(), r.response_code()), (0xabcd, ResponseCode::FormErr));
        assert_eq!(f.answer(&[0x01], Transport::Udp), None, "a runt got an answer");
        let mut answer = query("pypi.org.");
        answer.set_message_type(MessageType::Response);
        assert_eq!(f.answer(&answer.to_vec().unwrap(), Transport::Udp), None, "an answer was answered");
        let mut two = query("a.example.");
        two.add_query(Query::query(Name::from_str("b.example.").unwrap(), RecordType::A));
        let r = Message::from_vec(&f.answer(&two.to_vec().unwrap(), Transport::Udp).unwrap()).unwrap();
        assert_eq!(r.response_code(), ResponseCode::FormErr);
    }

    #[test]
    fn an_answer_comes_back_under_the_guests_id() {
        let (addr, server) = upstream(vec![([203, 0, 113, 10], 300)]);
        let f = forwarder(Egress::Internet, addr);
        let reply = f.answer(&query("www.example.").to_vec().unwrap(), Transport::Udp).expect("an answer");
        let asked = server.join().unwrap();
        assert_eq!(asked.queries(), query("www.example.").queries(), "the question changed on the way");
        let reply = Message::from_vec(&reply).unwrap();
        assert_eq!((reply.id(), reply.response_code()), (0x1234, ResponseCode::NoError));
        assert_eq!(reply.answers().len(), 1);
    }

    #[test]
    fn a_query_over_tcp_is_asked_over_tcp_and_a_large_answer_comes_back_whole() {
        // 100 addresses: about 1.7 KB, past what a plain UDP answer may carry (512 bytes).
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let got = Message::from_vec(&read_tcp_message(&mut conn).unwrap()).unwrap();
            let mut reply = got.clone();
            reply.set_message_type(MessageType::Response);
            let name = got.queries()[0].name().clone();
            for i in 0..100u8 {
                reply.add_answer(Record::from_rdata(name.clone(), 300, RData::A(A::new(203, 0, 113, i))));
            }
            write_tcp_message(&mut conn, &reply.to_vec().unwrap()).unwrap();
            got
        });
        let f = forwarder(Egress::Internet, addr);
        let reply = f.answer(&query("big.example.").to_vec().unwrap(), Transport::Tcp).expect("an answer");
        assert_eq!(server.join().unwrap().queries(), query("big.example.").queries());
        assert!(reply.len() > 1500, "{} bytes", reply.len());
        let reply = Message::from_vec(&reply).unwrap();
        assert_eq!((reply.id(), reply.answers().len()), (0x1234, 100));
    }

    #[test]
    fn tcp_framing_takes_whole_messages_only() {
        let mut framed = Vec::new();
        write_tcp_message(&mut framed, b"abc").unwrap();
        assert_eq!(framed, [0, 3, b'a', b'b', b'c']);
        assert_eq!(read_tcp_message(&mut framed.as_slice()), Some(b"abc".to_vec()));
        assert_eq!(read_tcp_message(&mut &[0u8, 5, 1, 2][..]), None, "a short message was taken");
        assert_eq!(read_tcp_message(&mut &[0u8, 0][..]), None, "an empty message was taken");
        assert_eq!(read_tcp_message(&mut &[7u8][..]), None, "half a length was taken");
        assert!(write_tcp_message(&mut Vec::new(), &vec![0u8; 70_000]).is_err());
    }

    #[test]
    fn an_upstream_that_answers_another_question_is_not_believed() {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        let liar = std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            let (n, from) = socket.recv_from(&mut buf).unwrap();
            let got = Message::from_vec(&buf[..n]).unwrap();
            let mut reply = query("elsewhere.example.");
            reply.set_id(got.id()).set_message_type(MessageType::Response);
            socket.send_to(&reply.to_vec().unwrap(), from).unwrap();
        });
        let f = forwarder(Egress::Internet, addr);
        let reply =
            Message::from_vec(&f.answer(&query("www.example.").to_vec().unwrap(), Transport::Udp).unwrap())
                .unwrap();
        liar.join().unwrap();
        assert_eq!(reply.response_code(), ResponseCode::ServFail);
    }

    /// A loopback upstream that answers every query with 200 addresses never given before
    /// (values only: nothing is ever sent to them), until `stop` is set.
    fn generous_upstream(stop: Arc<std::sync::atomic::AtomicBool>) -> SocketAddr {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        let addr = socket.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut next = u32::from(Ipv4Addr::new(11, 0, 0, 0));
            let mut buf = [0u8; 512];
            while !stop.load(Ordering::SeqCst) {
                let Ok((n, from)) = socket.recv_from(&mut buf) else { continue };
                let got = Message::from_vec(&buf[..n]).unwrap();
                let mut reply = got.clone();
                reply.set_message_type(MessageType::Response);
                let name = got.queries()[0].name().clone();
                for _ in 0..200 {
                    reply.add_answer(Record::from_rdata(
                        name.clone(),
                        300,
                        RData::A(A::from(Ipv4Addr::from(next))),
                    ));
                    next += 1;
                }
                socket.send_to(&reply.to_vec().unwrap(), from).unwrap();
            }
        });
        addr
    }

    #[test]
    fn the_learned_set_stays_within_its_bound_under_an_upstream_answering_200_addresses() {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let up = generous_upstream(Arc::clone(&stop));
        let set = Arc::new(Counting::default());
        let list = Egress::AllowList(AllowList::parse(&["*.example.com"]).unwrap());
        let f = Arc::new(forwarder_into(list, up, Arc::clone(&set)));
        let askers: Vec<_> = (0..8)
            .map(|t| {
                let f = Arc::clone(&f);
                std::thread::spawn(move || {
                    let mut codes = Vec::new();
                    for i in 0..10 {
                        let q = query(&format!("n{t}-{i}.example.com.")).to_vec().unwrap();
                        let reply = f.answer(&q, Transport::Udp).expect("an answer");
                        codes.push(Message::from_vec(&reply).unwrap().response_code());
                    }
                    codes
                })
            })
            .collect();
        let codes: Vec<ResponseCode> = askers.into_iter().flat_map(|a| a.join().unwrap()).collect();
        stop.store(true, Ordering::SeqCst);
        let held = set.set.lock().unwrap().len();
        assert_eq!(held, 4000, "the set holds {held} addresses, the bound is {MAX_LEARNED}");
        let ok = codes.iter().filter(|c| **c == ResponseCode::NoError).count();
        let refused = codes.iter().filter(|c| **c == ResponseCode::Refused).count();
        assert_eq!((ok, refused), (20, 60), "{codes:?}");
        let updates = set.updates.load(Ordering::SeqCst);
        assert!(updates <= ok, "{updates} updates of the set for {ok} answers");
    }

    #[test]
    fn only_public_addresses_are_learned_for_their_shortest_lifetime() {
        let mut reply = query("www.example.");
        let name = reply.queries()[0].name().clone();
        for (addr, ttl) in [
            ([203, 0, 113, 10], 5000),
            ([169, 254, 169, 254], 30),
            ([198, 51, 100, 7], 600),
            ([203, 0, 113, 10], 900),
        ] {
            reply.add_answer(Record::from_rdata(name.clone(), ttl, RData::A(A::from(Ipv4Addr::from(addr)))));
        }
        let (addrs, ttl) = public_addresses(&reply);
        assert_eq!(addrs, vec![Ipv4Addr::new(203, 0, 113, 10), Ipv4Addr::new(198, 51, 100, 7)]);
        assert_eq!(ttl, 600);
        let mut short = query("www.example.");
        short.add_answer(Record::from_rdata(name, 5, RData::A(A::from(Ipv4Addr::new(203, 0, 113, 1)))));
        assert_eq!(public_addresses(&short).1, MIN_ALLOW_S, "a TTL of seconds is raised to the floor");
    }
}
