//! The shim's client side: the connections on `agent.sock`, each request routed onto the
//! agent's one pipe under an id of the shim's own and each answer back to the connection that
//! asked (at most [`CLIENT_QUEUE`] frames queued per client), the shim's own requests to the
//! agent, and the cancelling of what a closed connection or a rollback left open.

use super::{lock, Container, Route, Shim, Writer};
use crate::control::{ShimRequest, ShimResponse};
use branchbox_protocol::frame::{encode_header, read_raw, write_raw, RawFrame};
use branchbox_protocol::Request;
use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::ChildStdout;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{sync_channel, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest the shim waits for the agent's answer to its own requests.
const AGENT_WAIT: Duration = Duration::from_secs(60);
/// Frames queued for one client before the agent's reader waits for it: at most this many
/// frames of at most 1 MiB each (256 KiB from an honest agent) per client.
const CLIENT_QUEUE: usize = 8;
/// Longest the agent's reader waits for room in one client's queue. One pipe carries every
/// answer, so while it waits every other client of the sandbox waits too; a client that
/// takes no frame for this long is disconnected and its requests are cancelled.
const CLIENT_STALL: Duration = Duration::from_secs(15);

fn header_fields(header: &[u8]) -> Option<(serde_json::Map<String, serde_json::Value>, u64)> {
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(header).ok()?;
    let id = map.get("id")?.as_u64()?;
    Some((map, id))
}

fn with_id(mut map: serde_json::Map<String, serde_json::Value>, id: u64) -> Vec<u8> {
    map.insert("id".into(), id.into());
    serde_json::to_vec(&map).unwrap_or_default()
}

fn encode(header: &[u8], body: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(8 + header.len() + body.len());
    let _ = write_raw(&mut buf, header, body);
    buf
}

impl Shim {
    pub(super) fn start_reader(self: &Arc<Self>, stdout: ChildStdout, generation: u64) {
        let me = Arc::clone(self);
        std::thread::spawn(move || me.read_agent(stdout, generation));
    }

    /// Routes every frame from the agent to the connection that asked for it.
    fn read_agent(&self, mut stdout: ChildStdout, generation: u64) {
        while let Ok(Some(raw)) = read_raw(&mut stdout) {
            let Some((map, gid)) = header_fields(&raw.header) else { continue };
            let terminal =
                !matches!(map.get("reply").and_then(|v| v.as_str()), Some("stdout" | "stderr" | "data"));
            let mut routes = lock(&self.routes);
            let route = if terminal { routes.by_gid.remove(&gid) } else { None };
            let (conn, orig) = match route.as_ref().or_else(|| routes.by_gid.get(&gid)) {
                Some(Route::Client { conn, orig }) => (*conn, *orig),
                Some(Route::Internal(tx)) => {
                    let _ = tx.try_send(raw);
                    continue;
                }
                None => continue,
            };
            if terminal {
                routes.by_client.remove(&(conn, orig));
            }
            drop(routes);
            self.deliver(conn, encode(&with_id(map, orig), &raw.body));
        }
        self.agent_pipe_closed(generation);
    }

    fn send_to_agent(&self, header: &[u8], body: &[u8]) -> std::io::Result<()> {
        let mut c = lock(&self.container);
        write_raw(&mut c.stdin, header, body).map_err(|e| std::io::Error::other(e.to_string()))
    }

    /// Sends a request of the shim's own to the current agent and waits for its terminal answer.
    pub(super) fn internal(&self, req: &Request, body: &[u8]) -> Result<RawFrame, String> {
        let gid = self.next_id.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = sync_channel(4);
        lock(&self.routes).by_gid.insert(gid, Route::Internal(tx));
        let r = self
            .send_to_agent(&encode_header(gid, req), body)
            .map_err(|e| format!("agent pipe: {e}"))
            .and_then(|()| rx.recv_timeout(AGENT_WAIT).map_err(|_| "the agent did not answer".to_string()));
        lock(&self.routes).by_gid.remove(&gid);
        r
    }

    /// Sends a request to a container that is not current yet and waits for the answer, giving
    /// up as soon as that container's runsc process exits (a bad image fails fast).
    pub(super) fn internal_to(&self, req: &Request, target: &mut Container) -> Result<RawFrame, String> {
        let gid = self.next_id.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = sync_channel(4);
        lock(&self.routes).by_gid.insert(gid, Route::Internal(tx));
        let result = (|| {
            write_raw(&mut target.stdin, &encode_header(gid, req), &[])
                .map_err(|e| format!("agent pipe: {e}"))?;
            let deadline = std::time::Instant::now() + AGENT_WAIT;
            loop {
                match rx.recv_timeout(Duration::from_millis(50)) {
                    Ok(frame) => return Ok(frame),
                    Err(_) if std::time::Instant::now() > deadline => {
                        return Err("the agent did not answer".into())
                    }
                    Err(_) => {
                        if let Some(Ok(Some(status))) = target.child.as_mut().map(|c| c.try_wait()) {
                            return Err(format!("runsc exited ({status}); see shim.log"));
                        }
                    }
                }
            }
        })();
        lock(&self.routes).by_gid.remove(&gid);
        result
    }

    pub(super) fn serve(self: &Arc<Self>, listener: UnixListener) {
        let mut next_conn = 0u64;
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            if let Err(why) = crate::control::peer_allowed(&conn) {
                eprintln!("branchbox-shim: refused a connection: {why}");
                continue;
            }
            next_conn += 1;
            let me = Arc::clone(self);
            let id = next_conn;
            std::thread::spawn(move || me.client(conn, id));
        }
    }

    /// Queues `frame` for client `conn`, waiting at most [`CLIENT_STALL`] for room; a client
    /// that stays full that long is disconnected (its reader then cancels its requests).
    fn deliver(&self, conn: u64, frame: Vec<u8>) {
        let Some(queue) = lock(&self.writers).get(&conn).map(|w| w.queue.clone()) else { return };
        let deadline = Instant::now() + CLIENT_STALL;
        let mut frame = frame;
        loop {
            match queue.try_send(frame) {
                Ok(()) | Err(TrySendError::Disconnected(_)) => return,
                Err(TrySendError::Full(back)) if Instant::now() < deadline => {
                    frame = back;
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(TrySendError::Full(_)) => break,
            }
        }
        if let Some(w) = lock(&self.writers).remove(&conn) {
            eprintln!(
                "branchbox-shim: client {conn} took nothing for {} s; disconnecting it and cancelling its requests",
                CLIENT_STALL.as_secs()
            );
            let _ = w.socket.shutdown(std::net::Shutdown::Both);
        }
    }

    fn client(self: &Arc<Self>, mut conn: UnixStream, conn_id: u64) {
        let (Ok(mut out), Ok(socket)) = (conn.try_clone(), conn.try_clone()) else { return };
        let (tx, rx) = sync_channel::<Vec<u8>>(CLIENT_QUEUE);
        lock(&self.writers).insert(conn_id, Writer { queue: tx, socket });
        std::thread::spawn(move || {
            while let Ok(buf) = rx.recv() {
                if out.write_all(&buf).is_err() {
                    let _ = out.shutdown(std::net::Shutdown::Both);
                    break;
                }
            }
        });
        while let Ok(Some(raw)) = read_raw(&mut conn) {
            let Some((map, orig)) = header_fields(&raw.header) else { break };
            let op = map.get("op").and_then(|v| v.as_str()).unwrap_or_default().to_string();
            if op.starts_with("shim_") {
                let reply = match serde_json::from_slice::<ShimRequest>(&raw.header) {
                    Ok(req) => self.control(req),
                    Err(e) => ShimResponse::ShimError { message: format!("bad shim request: {e}") },
                };
                self.deliver(conn_id, encode(&encode_header(orig, &reply), &[]));
                continue;
            }
            if !self.restored.load(Ordering::SeqCst) {
                let msg = branchbox_protocol::Response::Error {
                    code: branchbox_protocol::ErrorCode::Io,
                    message: "this sandbox is an empty shell: nothing was restored into it yet".into(),
                };
                self.deliver(conn_id, encode(&encode_header(orig, &msg), &[]));
                continue;
            }
            let gid = {
                let mut routes = lock(&self.routes);
                match routes.by_client.get(&(conn_id, orig)) {
                    Some(gid) => *gid,
                    None => {
                        let gid = self.next_id.fetch_add(1, Ordering::SeqCst);
                        routes.by_gid.insert(gid, Route::Client { conn: conn_id, orig });
                        routes.by_client.insert((conn_id, orig), gid);
                        gid
                    }
                }
            };
            let _open = self.gate.read().unwrap_or_else(|e| e.into_inner());
            if self.send_to_agent(&with_id(map, gid), &raw.body).is_err() {
                break;
            }
        }
        lock(&self.writers).remove(&conn_id);
        self.cancel_requests_of(conn_id);
    }

    /// Forgets the open requests of a closed connection and tells the agent to stop them, so
    /// nothing keeps streaming (or running) for a reader that is gone.
    fn cancel_requests_of(&self, conn_id: u64) {
        let gids: Vec<u64> = {
            let mut routes = lock(&self.routes);
            let keys: Vec<(u64, u64)> =
                routes.by_client.keys().filter(|(c, _)| *c == conn_id).copied().collect();
            let gids: Vec<u64> = keys.iter().filter_map(|k| routes.by_client.remove(k)).collect();
            for gid in &gids {
                routes.by_gid.remove(gid);
            }
            gids
        };
        let _open = self.gate.read().unwrap_or_else(|e| e.into_inner());
        for gid in gids {
            let _ = self.send_to_agent(&encode_header(gid, &Request::Cancel), &[]);
        }
    }

    /// Answers every client request still waiting on a retired container with an error.
    pub(super) fn abandon_client_requests(&self, why: &str) {
        let pending: Vec<(u64, u64)> = {
            let mut routes = lock(&self.routes);
            let clients: Vec<u64> = routes
                .by_gid
                .iter()
                .filter(|(_, r)| matches!(r, Route::Client { .. }))
                .map(|(gid, _)| *gid)
                .collect();
            let mut out = Vec::new();
            for gid in clients {
                if let Some(Route::Client { conn, orig }) = routes.by_gid.remove(&gid) {
                    routes.by_client.remove(&(conn, orig));
                    out.push((conn, orig));
                }
            }
            out
        };
        let msg = branchbox_protocol::Response::Error {
            code: branchbox_protocol::ErrorCode::Io,
            message: why.to_string(),
        };
        for (conn, orig) in pending {
            self.deliver(conn, encode(&encode_header(orig, &msg), &[]));
        }
    }
}
