//! A stand-in internet for tests: a network namespace of the test's own, holding addresses of
//! the documentation range (and private and metadata addresses, to show they are refused)
//! with an HTTP server on each. Sandboxes' uplinks end in it (`Uplink::Netns`), so no test
//! traffic can reach the host's real interface. Dropping it stops the server and removes the
//! namespace, also when the test fails.

use crate::exec::{in_netns, run};
use crate::{Error, Result};
use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::{rdata::A, RData, Record, RecordType};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

/// The "public" test server's address (TEST-NET-3).
pub const PUBLIC: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
/// A second public address, for allow-lists that name only one of the two.
pub const OTHER_PUBLIC: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 20);
/// A private address the default policy refuses.
pub const PRIVATE: Ipv4Addr = Ipv4Addr::new(10, 9, 9, 9);
/// The cloud metadata address.
pub const METADATA: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);
/// The port every test server listens on.
pub const PORT: u16 = 8000;
/// The test resolver's address ([`Dns`]).
pub const DNS_SERVER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 53);

/// The test's internet namespace and its HTTP server.
pub struct Internet {
    /// The namespace's name (give it to `Uplink::Netns`).
    pub netns: String,
    server: Option<Child>,
}

impl Internet {
    /// Creates namespace `netns` (removed first if a failed run left it) with the test
    /// addresses on its loopback and an HTTP server on all of them; returns once it answers.
    pub fn start(netns: &str) -> Result<Internet> {
        if std::path::Path::new(crate::exec::NETNS_DIR).join(netns).exists() {
            run("ip", &["netns", "del", netns], "", None, "remove a stale test namespace")?;
        }
        run("ip", &["netns", "add", netns], "", None, "create the test internet")?;
        let mut me = Internet { netns: netns.to_string(), server: None };
        let addrs = format!(
            "link set lo up\naddr add {PUBLIC}/32 dev lo\naddr add {OTHER_PUBLIC}/32 dev lo\naddr add {PRIVATE}/32 dev lo\naddr add {METADATA}/32 dev lo\naddr add {DNS_SERVER}/32 dev lo\n"
        );
        run("ip", &["-n", netns, "-batch", "-"], &addrs, None, "address the test internet")?;
        let server = Command::new("ip")
            .args(["netns", "exec", netns, "python3", "-m", "http.server", "--bind", "0.0.0.0"])
            .arg(PORT.to_string())
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                Error::Command(format!("cannot start python3's http.server: {e}; install python3"))
            })?;
        me.server = Some(server);
        for _ in 0..500 {
            if me.fetch_from_inside(PUBLIC).is_ok() {
                return Ok(me);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Err(Error::Command("the test HTTP server did not answer within 10 s".into()))
    }

    fn fetch_from_inside(&self, addr: Ipv4Addr) -> Result<String> {
        curl_in(&self.netns, addr)
    }
}

/// `curl` of `http://addr:PORT/` from inside namespace `netns`: the HTTP status on success,
/// else curl's exit code in the error (7: refused, 28: timed out).
pub fn curl_in(netns: &str, addr: Ipv4Addr) -> Result<String> {
    let out = Command::new("ip")
        .args(["netns", "exec", netns, "curl", "-s", "-o", "/dev/null", "-m", "10", "-w", "%{http_code}"])
        .arg(format!("http://{addr}:{PORT}/"))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::Command(format!("cannot run curl: {e}")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::Command(format!("curl exit {}", out.status.code().unwrap_or(-1))))
    }
}

impl Drop for Internet {
    fn drop(&mut self) {
        if let Some(mut s) = self.server.take() {
            let _ = s.kill();
            let _ = s.wait();
        }
        let _ = run("ip", &["netns", "del", &self.netns], "", None, "remove the test internet");
    }
}

/// A test resolver on [`DNS_SERVER`]:53 (UDP and TCP) inside a test internet's namespace:
/// answers A queries for its names (TTL 300; a name listed more than once gets every address),
/// NXDOMAIN for the rest, and remembers every name it was asked, so a test sees what reached
/// upstream. Over UDP it behaves as a resolver without EDNS: an answer past 512 bytes goes
/// out truncated (TC set, no records), and the asker must come back over TCP.
pub struct Dns {
    asked: Arc<Mutex<Vec<String>>>,
    asked_over_tcp: Arc<Mutex<Vec<String>>>,
}

/// The test resolver's answer to the raw query `raw`, and the name asked.
fn test_answer(names: &[(String, Ipv4Addr)], raw: &[u8]) -> Option<(Message, String)> {
    let q = Message::from_vec(raw).ok()?;
    let question = q.queries().first()?.clone();
    let name = question.name().to_ascii().trim_end_matches('.').to_ascii_lowercase();
    let mut reply = q.clone();
    reply.set_message_type(MessageType::Response).set_recursion_available(true);
    let mut known = false;
    for (_, addr) in names.iter().filter(|(n, _)| *n == name) {
        known = true;
        if question.query_type() == RecordType::A {
            reply.add_answer(Record::from_rdata(question.name().clone(), 300, RData::A(A::from(*addr))));
        }
    }
    if !known {
        reply.set_response_code(ResponseCode::NXDomain);
    }
    Some((reply, name))
}

impl Dns {
    /// Serves `names` (lowercase, without the trailing dot) in namespace `netns` from threads
    /// that live as long as the test process.
    pub fn start(netns: &str, names: &[(&str, Ipv4Addr)]) -> Result<Dns> {
        let socket = in_netns(netns, || UdpSocket::bind((DNS_SERVER, 53)))?
            .map_err(|e| Error::Command(format!("the test resolver cannot listen: {e}")))?;
        let listener = in_netns(netns, || TcpListener::bind((DNS_SERVER, 53)))?
            .map_err(|e| Error::Command(format!("the test resolver cannot listen over TCP: {e}")))?;
        let names: Arc<Vec<(String, Ipv4Addr)>> =
            Arc::new(names.iter().map(|(n, a)| (n.to_string(), *a)).collect());
        let dns = Dns { asked: Arc::default(), asked_over_tcp: Arc::default() };
        let (log, udp_names) = (Arc::clone(&dns.asked), Arc::clone(&names));
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok((n, from)) = socket.recv_from(&mut buf) {
                let Some((mut reply, name)) = test_answer(&udp_names, &buf[..n]) else { continue };
                log.lock().unwrap_or_else(|e| e.into_inner()).push(name);
                if reply.to_vec().map_or(0, |b| b.len()) > 512 {
                    reply.take_answers();
                    reply.set_truncated(true);
                }
                if let Ok(bytes) = reply.to_vec() {
                    let _ = socket.send_to(&bytes, from);
                }
            }
        });
        let (log, tcp_log) = (Arc::clone(&dns.asked), Arc::clone(&dns.asked_over_tcp));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let mut len = [0u8; 2];
                let mut msg = Vec::new();
                let read = conn.read_exact(&mut len).and_then(|()| {
                    msg.resize(usize::from(u16::from_be_bytes(len)), 0);
                    conn.read_exact(&mut msg)
                });
                let Some((reply, name)) = read.ok().and_then(|()| test_answer(&names, &msg)) else {
                    continue;
                };
                log.lock().unwrap_or_else(|e| e.into_inner()).push(name.clone());
                tcp_log.lock().unwrap_or_else(|e| e.into_inner()).push(name);
                if let Ok(bytes) = reply.to_vec() {
                    let mut framed = (bytes.len() as u16).to_be_bytes().to_vec();
                    framed.extend_from_slice(&bytes);
                    let _ = conn.write_all(&framed);
                }
            }
        });
        Ok(dns)
    }

    /// Every name asked over TCP so far, in order.
    pub fn asked_over_tcp(&self) -> Vec<String> {
        self.asked_over_tcp.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Every name asked so far, in order.
    pub fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
