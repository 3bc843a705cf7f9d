//! Who reaches a sandbox's exposed ports from its uplink's far side (issue 27, M4): root and
//! the service's user always, another local user only when the sandbox's ports were opened to
//! the host on purpose. Run for real (root): the uplink ends in the test's own internet
//! namespace, a listener in the guest namespace stands in for the guest's server, and the
//! other user is a child process that enters that namespace and drops to uid 65534.

use branchbox_net::testing::Internet;
use branchbox_net::{in_netns, Egress, NetConfig, Uplink};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The guest's server port.
const PORT: u16 = 9107;
/// The unprivileged user the other local account runs as (`nobody`).
const NOBODY: u32 = 65534;

/// Tears the sandboxes' networks down when the test ends, passed or failed.
struct Sandboxes<'a> {
    cfg: &'a NetConfig,
    ids: Vec<String>,
}

impl Drop for Sandboxes<'_> {
    fn drop(&mut self) {
        for id in &self.ids {
            let _ = self.cfg.teardown(id);
        }
        let _ = std::fs::remove_dir_all(&self.cfg.state_dir);
    }
}

fn id(n: u32) -> String {
    format!("sbx-{:08x}{:08x}", std::process::id(), n)
}

/// A server in sandbox `id`'s guest namespace on [`PORT`] that accepts for as long as the test
/// runs.
fn serve_in_guest(id: &str) {
    let guest = format!("bbg-{}", &id[4..]);
    let listener = in_netns(&guest, || TcpListener::bind((Ipv4Addr::UNSPECIFIED, PORT))).unwrap().unwrap();
    std::thread::spawn(move || for _conn in listener.incoming() {});
}

/// Whether a process of `uid`, inside namespace `netns`, completes a TCP connection to
/// `addr`:[`PORT`] within 5 s; the error says how it failed.
fn connects_as(uid: u32, netns: &str, addr: Ipv4Addr) -> Result<(), String> {
    let ns = std::fs::File::open(PathBuf::from("/run/netns").join(netns)).unwrap();
    let fd = ns.as_raw_fd();
    let script = format!(
        "import socket\ntry:\n    socket.create_connection(('{addr}', {PORT}), timeout=5).close()\nexcept OSError as e:\n    print(e)\n    raise SystemExit(1)\n"
    );
    let mut cmd = Command::new("python3");
    cmd.args(["-c", &script]).stdin(Stdio::null());
    // SAFETY: setns(2), setgroups(2), setgid(2) and setuid(2) only, between fork and exec; the
    // namespace's file stays open until the child has run.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if uid != 0
                && (libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(uid) != 0
                    || libc::setuid(uid) != 0)
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    drop(ns);
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }
}

#[test]
fn another_local_user_reaches_a_sandboxs_ports_only_when_they_were_opened_on_purpose() {
    let inet = Internet::start(&format!("bbt-ports-{}", std::process::id())).unwrap();
    let cfg = NetConfig {
        uplink: Uplink::Netns(inet.netns.clone()),
        pool: "100.127.0.0/16".parse().unwrap(),
        state_dir: PathBuf::from(format!("/tmp/bbnet-test-ports-{}", std::process::id())),
        resolvers: Vec::new(),
    };
    let (a, b) = (id(1), id(2));
    let guard = Sandboxes { cfg: &cfg, ids: vec![a.clone(), b.clone()] };
    let a_addr = cfg.setup(&a, &Egress::DenyAll, &cfg.state_dir).unwrap().egress_addr;
    let b_addr = cfg.setup(&b, &Egress::Internet, &cfg.state_dir).unwrap().egress_addr;
    serve_in_guest(&a);
    serve_in_guest(&b);

    connects_as(0, &inet.netns, a_addr).expect("root does not reach the sandbox's port");
    let e = connects_as(NOBODY, &inet.netns, a_addr).expect_err("another user reached a closed sandbox");
    assert!(e.contains("refused"), "not refused at once: {e}");

    cfg.open_ports(&a, true).unwrap();
    connects_as(NOBODY, &inet.netns, a_addr).expect("another user does not reach an opened sandbox");
    connects_as(NOBODY, &inet.netns, b_addr).expect_err("opening one sandbox opened another");
    cfg.open_ports(&a, false).unwrap();
    connects_as(NOBODY, &inet.netns, a_addr).expect_err("closed again, the port still answers");
    connects_as(0, &inet.netns, a_addr).expect("root lost the port");

    // A sandbox set up again at an opened sandbox's address starts closed.
    cfg.open_ports(&a, true).unwrap();
    cfg.teardown(&a).unwrap();
    let again = cfg.setup(&a, &Egress::DenyAll, &cfg.state_dir).unwrap().egress_addr;
    assert_eq!(again, a_addr, "the test expects the freed slot to be taken again");
    serve_in_guest(&a);
    connects_as(0, &inet.netns, again).expect("root does not reach the new sandbox");
    connects_as(NOBODY, &inet.netns, again).expect_err("the new sandbox inherited the old one's opening");
    drop(guard);
}
