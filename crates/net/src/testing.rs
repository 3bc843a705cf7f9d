//! A stand-in internet for tests: a network namespace of the test's own, holding addresses of
//! the documentation range (and private and metadata addresses, to show they are refused)
//! with an HTTP server on each. Sandboxes' uplinks end in it (`Uplink::Netns`), so no test
//! traffic can reach the host's real interface. Dropping it stops the server and removes the
//! namespace, also when the test fails.

use crate::exec::{in_netns, run};
use crate::{Error, Result};
use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::{rdata::A, RData, Record, RecordType};
use std::net::{Ipv4Addr, UdpSocket};
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
        if std::path::Path::new(crate::sandbox::NETNS_DIR).join(netns).exists() {
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

/// A test resolver on [`DNS_SERVER`]:53 (UDP) inside a test internet's namespace: answers A
/// queries for its names (TTL 300), NXDOMAIN for the rest, and remembers every name it was
/// asked, so a test sees what reached upstream.
pub struct Dns {
    asked: Arc<Mutex<Vec<String>>>,
}

impl Dns {
    /// Serves `names` (lowercase, without the trailing dot) in namespace `netns` from a thread
    /// that lives as long as the test process.
    pub fn start(netns: &str, names: &[(&str, Ipv4Addr)]) -> Result<Dns> {
        let socket = in_netns(netns, || UdpSocket::bind((DNS_SERVER, 53)))?
            .map_err(|e| Error::Command(format!("the test resolver cannot listen: {e}")))?;
        let names: Vec<(String, Ipv4Addr)> = names.iter().map(|(n, a)| (n.to_string(), *a)).collect();
        let asked = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&asked);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok((n, from)) = socket.recv_from(&mut buf) {
                let Ok(q) = Message::from_vec(&buf[..n]) else { continue };
                let Some(question) = q.queries().first() else { continue };
                let name = question.name().to_ascii().trim_end_matches('.').to_ascii_lowercase();
                log.lock().unwrap_or_else(|e| e.into_inner()).push(name.clone());
                let mut reply = q.clone();
                reply.set_message_type(MessageType::Response).set_recursion_available(true);
                match names.iter().find(|(n, _)| *n == name) {
                    Some((_, addr)) if question.query_type() == RecordType::A => {
                        reply.add_answer(Record::from_rdata(
                            question.name().clone(),
                            300,
                            RData::A(A::from(*addr)),
                        ));
                    }
                    Some(_) => {}
                    None => {
                        reply.set_response_code(ResponseCode::NXDomain);
                    }
                }
                if let Ok(bytes) = reply.to_vec() {
                    let _ = socket.send_to(&bytes, from);
                }
            }
        });
        Ok(Dns { asked })
    }

    /// Every name asked so far, in order.
    pub fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
