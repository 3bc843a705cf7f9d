//! envd's terminals (`process.Process/Start` with `pty`): an agent `exec` on a pseudo-terminal,
//! held by the service. Its reader thread hands the output to the stream of the moment (Start,
//! then any `Connect`) and ends with the command. The agent reports no pid for it, so the
//! service numbers terminals above Linux's largest pid (`PID_MAX_LIMIT`, 2^22): they never name
//! a process of the sandbox. `SendInput` types, `Update` resizes, `SendSignal` ends the session
//! (the agent kills the terminal's whole session). `follow.rs` serves their streams.

use super::connect::RpcError;
use super::envd::{api, lock, Ev};
use super::pb::{self, process_event};
use crate::state::AppState;
use crate::streams::Place;
use branchbox_model::SandboxId;
use branchbox_protocol::{ClientError, ExecSpec, ExitStatus, PtyEvent, PtyInput, PtyOutput, PtySize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// Linux's largest possible pid (`PID_MAX_LIMIT` on 64-bit); terminals are numbered above it.
pub const PID_MAX_LIMIT: u32 = 1 << 22;

/// One open terminal.
pub struct Terminal {
    sandbox: SandboxId,
    config: pb::ProcessConfig,
    input: Mutex<PtyInput>,
    reader: Mutex<Option<mpsc::Sender<Ev>>>,
    killed: AtomicBool,
    /// Its place under the terminals' bounds, held until the command ends.
    _place: Place,
}

impl Terminal {
    /// Makes the terminal's output go to a new reader from now on; the previous reader's
    /// stream ends.
    pub(super) fn follow(&self) -> mpsc::Receiver<Ev> {
        let (tx, rx) = mpsc::channel::<Ev>(64);
        *lock(&self.reader) = Some(tx);
        rx
    }

    /// Types `bytes` into the terminal.
    pub(super) async fn type_into(self: Arc<Self>, bytes: Vec<u8>) -> Result<(), RpcError> {
        tokio::task::spawn_blocking(move || lock(&self.input).write(&bytes))
            .await
            .map_err(|e| RpcError::new("internal", format!("a worker failed: {e}")))?
            .map_err(|e| RpcError::new("unavailable", format!("the terminal is gone: {e}")))
    }

    /// Gives the terminal a new size.
    pub(super) async fn resize(self: Arc<Self>, size: PtySize) -> Result<(), RpcError> {
        tokio::task::spawn_blocking(move || lock(&self.input).resize(size))
            .await
            .map_err(|e| RpcError::new("internal", format!("a worker failed: {e}")))?
            .map_err(|e| RpcError::new("unavailable", format!("the terminal is gone: {e}")))
    }
}

/// A terminal's size from envd's, checked.
pub(super) fn pty_size(size: pb::PtySize) -> Result<PtySize, RpcError> {
    u16::try_from(size.cols)
        .ok()
        .zip(u16::try_from(size.rows).ok())
        .ok_or_else(|| RpcError::invalid("pty.size is out of range"))
        .and_then(|(c, r)| PtySize::new(c, r).map_err(RpcError::invalid))
}

/// The terminals opened through envd's API, by pid: the E2B adapter's own state.
pub struct Terminals {
    open: Mutex<HashMap<u32, Arc<Terminal>>>,
    next_pid: AtomicU32,
}

impl Default for Terminals {
    fn default() -> Self {
        Terminals { open: Mutex::default(), next_pid: AtomicU32::new(PID_MAX_LIMIT + 1) }
    }
}

impl Terminals {
    /// The terminal `pid` of the sandbox, if it is one.
    pub(super) fn get(&self, sandbox: &SandboxId, pid: i32) -> Option<Arc<Terminal>> {
        let t = lock(&self.open).get(&(pid as u32)).cloned()?;
        (t.sandbox == *sandbox).then_some(t)
    }

    /// Starts `spec` on a new terminal of `size` in the sandbox (`config` is what `List` shows
    /// of it), holding `place` until it ends; returns its pid and its events.
    pub(super) async fn open(
        self: &Arc<Self>,
        st: &AppState,
        id: &SandboxId,
        spec: ExecSpec,
        size: PtySize,
        config: pb::ProcessConfig,
        place: Place,
    ) -> Result<(u32, mpsc::Receiver<Ev>), RpcError> {
        let sid = id.clone();
        let (input, output) = st
            .blocking(move |engine, _| Ok(engine.connect(&sid)?.open_pty(spec, size)?))
            .await
            .map_err(api)?;
        let pid = self.next_pid.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel::<Ev>(64);
        let term = Arc::new(Terminal {
            sandbox: id.clone(),
            config,
            input: Mutex::new(input),
            reader: Mutex::new(Some(tx)),
            killed: AtomicBool::new(false),
            _place: place,
        });
        lock(&self.open).insert(pid, term.clone());
        let all = self.clone();
        std::thread::spawn(move || {
            read_terminal(&term, output);
            lock(&all.open).remove(&pid);
        });
        Ok((pid, rx))
    }

    /// Ends a terminal when `pid` names one of the sandbox's (true), else leaves it to the agent.
    pub fn kill(&self, id: &SandboxId, pid: i32) -> bool {
        match self.get(id, pid) {
            Some(term) => {
                term.killed.store(true, Ordering::SeqCst);
                lock(&term.input).close();
                true
            }
            None => false,
        }
    }

    /// The sandbox's open terminals, for `List`.
    pub fn list(&self, id: &SandboxId) -> Vec<pb::ProcessInfo> {
        lock(&self.open)
            .iter()
            .filter(|(_, t)| t.sandbox == *id)
            .map(|(pid, t)| pb::ProcessInfo { config: Some(t.config.clone()), pid: *pid, tag: None })
            .collect()
    }
}

/// Hands a terminal's output to its reader of the moment until the command ends.
fn read_terminal(term: &Terminal, mut output: PtyOutput) {
    let end = loop {
        match output.recv() {
            Ok(PtyEvent::Output(bytes)) => {
                let reader = lock(&term.reader).clone();
                if let Some(r) = reader {
                    if r.blocking_send(Ev::Data(process_event::Output::Pty(bytes))).is_err() {
                        let mut slot = lock(&term.reader);
                        if slot.as_ref().is_some_and(|s| s.same_channel(&r)) {
                            *slot = None;
                        }
                    }
                }
            }
            Ok(PtyEvent::Exited(s)) => break Ok(s),
            Err(_) if term.killed.load(Ordering::SeqCst) => {
                break Ok(ExitStatus {
                    code: None,
                    signal: Some(9),
                    timed_out: false,
                    truncated: false,
                    duration_ms: 0,
                    oom_killed: false,
                })
            }
            Err(ClientError::Agent { message, .. }) => break Err(RpcError::new("internal", message)),
            Err(e) => break Err(RpcError::new("unavailable", format!("the terminal ended: {e}"))),
        }
    };
    let reader = lock(&term.reader).take();
    if let Some(r) = reader {
        let _ = r.blocking_send(Ev::End(end));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_pids_are_above_any_linux_pid() {
        let t = Terminals::default();
        assert!(t.next_pid.load(Ordering::Relaxed) > PID_MAX_LIMIT);
    }
}
