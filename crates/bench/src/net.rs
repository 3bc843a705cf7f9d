//! The network benchmark (`branchbox bench net`, gvisor): what a network adds to create and
//! fork, and what the sandbox's own network stack costs over its link, next to the same
//! client run in its router namespace over the same uplink veth (the floor: the host's
//! kernel, without runsc's netstack or the guest veth).
//!
//! The uplinks end in a namespace the benchmark makes itself (the stand-in internet of
//! `branchbox_net::testing`, documentation-range addresses with servers on them), so nothing
//! it sends leaves this machine.

use crate::report::{Report, Stats};
use crate::sandbox::{host_facts, stats, Cleanup};
use branchbox_core::engine::{BackendChoice, Engine};
use branchbox_core::DEFAULT_IMAGE;
use branchbox_model::{BackendKind, Error, Result, SandboxId};
use branchbox_net::testing::{Internet, PUBLIC};
use branchbox_net::{Egress, Names};
use branchbox_protocol::{Command, ExecSpec};
use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The bulk server's port in the stand-in internet.
const BULK_PORT: u16 = 9000;

/// Serves, on every connection, as many zero bytes as the client's first line asks for.
const BULK_SERVER: &str = "import socket, sys, threading\n\
s = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
s.bind((sys.argv[1], int(sys.argv[2])))\ns.listen(128)\nbuf = bytes(1 << 16)\n\
def serve(c):\n    n = int(c.makefile().readline() or 0)\n    while n > 0:\n        n -= c.send(buf[:min(n, len(buf))])\n    c.close()\n\
while True:\n    c, _ = s.accept()\n    threading.Thread(target=serve, args=(c,), daemon=True).start()\n";

/// Asks the bulk server for `argv[3]` bytes and prints the seconds from connect to the last byte.
const BULK_CLIENT: &str = "import socket, sys, time\n\
n = int(sys.argv[3])\nt = time.perf_counter()\nc = socket.create_connection((sys.argv[1], int(sys.argv[2])))\n\
c.sendall(b'%d\\n' % n)\ngot = 0\nwhile True:\n    d = c.recv(1 << 20)\n    if not d:\n        break\n    got += len(d)\n\
assert got == n, (got, n)\nprint(time.perf_counter() - t)\n";

/// Opens and closes `argv[3]` connections, printing each connect's microseconds. Aimed at the
/// bulk server (backlog 128, a thread per connection): Python's http.server, with a backlog of
/// 5, dropped SYNs under load and put 1 s retransmits into both sides' figures.
const CONNECT_CLIENT: &str = "import socket, sys, time\nfor _ in range(int(sys.argv[3])):\n    \
t = time.perf_counter()\n    c = socket.create_connection((sys.argv[1], int(sys.argv[2])))\n    \
print((time.perf_counter() - t) * 1e6)\n    c.close()\n";

/// What to measure.
#[derive(Debug, Clone)]
pub struct NetBenchOptions {
    /// Creates and forks of each kind, interleaved.
    pub runs: usize,
    /// Connections timed from each side.
    pub connects: usize,
    /// Bytes of each bulk transfer, MiB.
    pub mib: u64,
    /// Bulk transfers from each side.
    pub transfers: usize,
}

impl Default for NetBenchOptions {
    fn default() -> Self {
        NetBenchOptions { runs: 5, connects: 50, mib: 256, transfers: 3 }
    }
}

impl NetBenchOptions {
    /// A short version for CI.
    pub fn short() -> Self {
        NetBenchOptions { runs: 2, connects: 10, mib: 16, transfers: 1 }
    }
}

/// The stand-in internet with the bulk server, and the environment that sends uplinks there;
/// restores the environment and removes the namespace when dropped.
struct Lab {
    inet: Internet,
    bulk: std::process::Child,
    saved: Vec<(&'static str, Option<std::ffi::OsString>)>,
}

impl Lab {
    fn start(engine: &Engine) -> Result<Lab> {
        let fail = |e: branchbox_net::Error| Error::Backend(format!("the benchmark's network: {e}"));
        let inet = Internet::start(&format!("bbb-net-{}", std::process::id())).map_err(fail)?;
        let bulk = std::process::Command::new("ip")
            .args(["netns", "exec", &inet.netns, "python3", "-c", BULK_SERVER, &PUBLIC.to_string()])
            .arg(BULK_PORT.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| Error::Backend(format!("cannot start the bulk server: {e}")))?;
        let state = engine.config().data_dir.join("bench-net-state");
        let mut lab = Lab { inet, bulk, saved: Vec::new() };
        // This process's own settings for the sandboxes it creates (the CLI is one thread
        // here); BRANCHBOX_NET_RESOLVERS is cleared so no resolver outside is named.
        let netns = lab.inet.netns.clone();
        for (k, v) in [
            ("BRANCHBOX_NET_UPLINK_NETNS", Some(netns.as_str().into())),
            ("BRANCHBOX_NET_STATE", Some(state.into_os_string())),
            ("BRANCHBOX_NET_RESOLVERS", None),
        ] {
            lab.saved.push((k, std::env::var_os(k)));
            match v {
                Some(v) => std::env::set_var(k, v),
                None => std::env::remove_var(k),
            }
        }
        Ok(lab)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self.bulk.kill();
        let _ = self.bulk.wait();
        for (k, v) in self.saved.drain(..) {
            match v {
                Some(v) => std::env::set_var(k, v),
                None => std::env::remove_var(k),
            }
        }
    }
}

/// Runs one of the Python clients in sandbox `id`; its stdout lines as numbers.
fn in_sandbox(engine: &Engine, id: &SandboxId, code: &str, args: &[String]) -> Result<Vec<f64>> {
    let mut argv = vec!["python3".to_string(), "-c".to_string(), code.to_string()];
    argv.extend_from_slice(args);
    let mut spec = ExecSpec::new(Command::Argv(argv));
    spec.timeout_ms = Some(600_000);
    let mut out = Vec::new();
    let (status, _) = engine.exec(id, spec, None, &mut |_, d| out.extend_from_slice(d))?;
    numbers(status.code == Some(0), &out, "in the sandbox")
}

/// Runs one of the Python clients in namespace `netns`; its stdout lines as numbers.
fn in_netns(netns: &str, code: &str, args: &[String]) -> Result<Vec<f64>> {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", netns, "python3", "-c", code])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::Backend(format!("cannot run python3 in {netns}: {e}")))?;
    let mut text = out.stdout;
    text.extend_from_slice(&out.stderr);
    numbers(out.status.success(), &text, &format!("in {netns}"))
}

fn numbers(ok: bool, out: &[u8], where_: &str) -> Result<Vec<f64>> {
    let text = String::from_utf8_lossy(out);
    let parsed: Option<Vec<f64>> = text.lines().map(|l| l.trim().parse().ok()).collect();
    match parsed {
        Some(v) if ok && !v.is_empty() => Ok(v),
        _ => Err(Error::Backend(format!("the benchmark's client failed {where_}: {}", text.trim()))),
    }
}

/// Creates and forks with and without a network, then connection setup and bulk throughput
/// from inside a sandbox against its router namespace.
pub fn net(engine: &Engine, o: &NetBenchOptions) -> Result<Report> {
    if o.runs == 0 || o.connects == 0 || o.transfers == 0 || o.mib == 0 {
        return Err(Error::InvalidInput("runs, connects, transfers and MiB must be at least 1".into()));
    }
    let lab = Lab::start(engine)?;
    let mut held = Cleanup { engine, ids: Vec::new() };
    let gvisor = || BackendChoice::Exactly(BackendKind::Gvisor);
    let (mut create_off, mut create_on, mut fork_off, mut fork_on) = (vec![], vec![], vec![], vec![]);
    for _ in 0..o.runs {
        for (network, creates, forks) in
            [(None, &mut create_off, &mut fork_off), (Some(Egress::Internet), &mut create_on, &mut fork_on)]
        {
            let t = Instant::now();
            let s = engine.create_networked(gvisor(), None, DEFAULT_IMAGE, network, &mut |_| {})?;
            creates.push(t.elapsed());
            held.ids.push(s.id.clone());
            // Forked before it makes any connection: runsc 20240729 cannot checkpoint a
            // sandbox holding one, or one just closed (docs/network.md).
            let t = Instant::now();
            let out = engine.fork(&s.id, 1)?;
            forks.push(t.elapsed());
            for c in out.children {
                let c = c?;
                held.kill(&c.sandbox.id)?;
            }
            held.kill(&s.id)?;
        }
    }
    let s = engine.create_networked(gvisor(), None, DEFAULT_IMAGE, Some(Egress::Internet), &mut |_| {})?;
    held.ids.push(s.id.clone());
    let router = Names::of(s.id.as_str()).map_err(|e| Error::Backend(e.to_string()))?.router_ns;
    let addr = PUBLIC.to_string();
    let connect_args = [addr.clone(), BULK_PORT.to_string(), o.connects.to_string()];
    let us = |v: Vec<f64>| v.into_iter().map(|u| Duration::from_secs_f64(u / 1e6)).collect::<Vec<_>>();
    let connect_in = us(in_sandbox(engine, &s.id, CONNECT_CLIENT, &connect_args)?);
    let connect_floor = us(in_netns(&router, CONNECT_CLIENT, &connect_args)?);
    let bytes = o.mib << 20;
    let bulk_args = [addr, BULK_PORT.to_string(), bytes.to_string()];
    let (mut rate_in, mut rate_floor) = (Vec::new(), Vec::new());
    for _ in 0..o.transfers {
        for secs in in_sandbox(engine, &s.id, BULK_CLIENT, &bulk_args)? {
            rate_in.push(o.mib as f64 / secs);
        }
        for secs in in_netns(&router, BULK_CLIENT, &bulk_args)? {
            rate_floor.push(o.mib as f64 / secs);
        }
    }
    drop(held);
    drop(lab);

    let mut figures = BTreeMap::new();
    figures.insert("create_network_off".into(), stats(&create_off)?);
    figures.insert("create_network_on".into(), stats(&create_on)?);
    figures.insert("fork1_network_off".into(), stats(&fork_off)?);
    figures.insert("fork1_network_on".into(), stats(&fork_on)?);
    figures.insert("connect_in_sandbox".into(), stats(&connect_in)?);
    figures.insert("floor_connect_router_ns".into(), stats(&connect_floor)?);
    let rate =
        |v: &[f64]| Stats::from_samples("MiB/s", v).ok_or_else(|| Error::Backend("no transfer".into()));
    figures.insert("throughput_in_sandbox".into(), rate(&rate_in)?);
    figures.insert("floor_throughput_router_ns".into(), rate(&rate_floor)?);
    let p50 = |k: &str| figures[k].p50;
    let mut ratios = BTreeMap::new();
    ratios.insert("create_on_over_off".into(), p50("create_network_on") / p50("create_network_off"));
    ratios.insert("fork1_on_over_off".into(), p50("fork1_network_on") / p50("fork1_network_off"));
    ratios.insert("connect_over_floor".into(), p50("connect_in_sandbox") / p50("floor_connect_router_ns"));
    ratios.insert(
        "throughput_over_floor".into(),
        p50("throughput_in_sandbox") / p50("floor_throughput_router_ns"),
    );
    let summary = format!(
        "create {:.0} -> {:.0} ms and fork(1) {:.0} -> {:.0} ms with a network (p50); connect {:.2} ms in the \
         sandbox vs {:.2} ms from its router; {:.0} vs {:.0} MiB/s over the same uplink",
        p50("create_network_off"),
        p50("create_network_on"),
        p50("fork1_network_off"),
        p50("fork1_network_on"),
        p50("connect_in_sandbox"),
        p50("floor_connect_router_ns"),
        p50("throughput_in_sandbox"),
        p50("floor_throughput_router_ns"),
    );
    Ok(Report {
        bench: "net".into(),
        backend: "gvisor".into(),
        method: "create: the call until the agent answers; fork: one child until it answers, of a source that \
                 made no connection; each with and without a network, interleaved. connect: TCP connect() to the \
                 stand-in internet's bulk server by one Python client, in the sandbox (runsc netstack, guest veth, \
                 router, uplink veth) and in the sandbox's router namespace (floor: the same uplink veth, the host \
                 kernel's stack). throughput: one connection's bulk download, timed from connect to the last byte, \
                 from both places."
            .into(),
        inputs: serde_json::json!({"runs": o.runs, "connects": o.connects, "mib": o.mib, "transfers": o.transfers}),
        host: host_facts(engine),
        figures,
        ratios,
        summary,
    })
}
