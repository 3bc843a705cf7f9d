//! The microvm backend's snapshot family: snapshot (pause, the VMM writes the guest's state,
//! memory and frozen disk into the snapshot directory, resume), restore (a new VMM process
//! restores it with the sandbox's own disk store, then the agent's after-fork hook runs),
//! and fork (a snapshot, then one restore per child, in parallel).
//!
//! A restored guest starts a new VMGenID generation (the VMM writes a new id and raises the
//! notification), and its vsock device drops the connections the snapshot had while the
//! guest keeps its listeners (the device sends the transport-reset event): the agent is
//! reached by a new connection, which then carries the after-fork hook (sandbox id, host
//! name, machine id, wall clock, entropy). A snapshot of a networked guest carries its policy
//! record; each restore gets a network of its own with that policy, and its guest keeps the
//! source's address and MAC (docs/network.md).

use crate::backend::{vmm_err, MicrovmBackend};
use crate::files;
use branchbox_model::{ChildResult, Error, Result, SandboxPlan};
use branchbox_protocol::{AfterFork, HookReport};
use branchbox_vmm::linux::state::{self as linux_state, LINUX_STATE_FILE};
use branchbox_vmm::process::protocol::{RestoreLinux, VmState};
use branchbox_vmm::process::{spawn_listening, VmmProcess};
use branchbox_vmm::VmConfig;
use std::path::Path;

/// Children restored at once by a fork: each restore waits mostly for its guest's agent.
const RESTORE_PARALLELISM: usize = 8;

/// Bytes a directory tree takes on disk (a memory file is sparse: its holes take nothing).
fn allocated_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => allocated_bytes(&e.path()),
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

impl MicrovmBackend {
    /// Pauses the sandbox's guest if it runs, snapshots it into `dest`, and lets it run
    /// again (also when the snapshot failed).
    pub(crate) fn snapshot_guest(&self, dir: &Path, dest: &Path) -> Result<u64> {
        let dest = std::path::absolute(dest).map_err(|e| Error::io(dest, e))?;
        let mut vmm = VmmProcess::connect(&files::control(dir)).map_err(vmm_err)?;
        let running = vmm.status().map_err(vmm_err)?.state == VmState::Running;
        if running {
            vmm.pause().map_err(vmm_err)?;
        }
        let taken = vmm.snapshot(&dest).map_err(vmm_err).and_then(|_| crate::network::carry(dir, &dest));
        if running {
            vmm.resume().map_err(vmm_err)?;
        }
        taken?;
        Ok(allocated_bytes(&dest))
    }

    /// Starts a new sandbox in `plan.dir` from the snapshot in `src` and runs the agent's
    /// after-fork hook in it. On failure no VMM is left running.
    pub(crate) fn restore_guest(&self, src: &Path, plan: &SandboxPlan) -> Result<HookReport> {
        let dir = self.sandbox_dir(plan)?;
        let src = std::path::absolute(src).map_err(|e| Error::io(src, e))?;
        let state = linux_state::read(&src.join(LINUX_STATE_FILE))
            .map_err(|e| Error::InvalidInput(format!("{} is not a microvm snapshot: {e}", src.display())))?;
        // The shell the VMM starts with is dropped for the restored guest: only its shape is
        // reported by `status`.
        let config = VmConfig { mem_size: state.memory.size, vcpus: state.vcpus, irqchip: false };
        let net = crate::network::attach_restored(plan.id.as_str(), &dir, &src)?;
        let networked = net.is_some();
        let started = (|| {
            let pid = spawn_listening(
                &self.config().vmm,
                config,
                &files::control(&dir),
                &files::vmm_log(&dir),
                crate::backend::LISTEN_TIMEOUT,
            )
            .map_err(|e| Error::Unavailable(e.to_string()))?;
            let pid_path = files::pid_file(&dir);
            std::fs::write(&pid_path, pid.to_string()).map_err(|e| Error::io(&pid_path, e))?;
            let mut vmm = VmmProcess::connect(&files::control(&dir)).map_err(vmm_err)?;
            vmm.restore_linux(RestoreLinux {
                dir: src.clone(),
                serial_log: files::serial_log(&dir),
                vsock_socket: files::vsock(&dir),
                disk_store: files::disk_store(&dir),
                disk_chain: files::DISK_CHAIN.into(),
                resume: true,
                net,
            })
            .map_err(vmm_err)?;
            // The listening VMM serves one connection at a time: `connect` asks it for the
            // guest's status while it waits for the agent.
            drop(vmm);
            self.thaw_child(plan, &dir)
        })();
        if started.is_err() {
            self.stop_vmm(&dir);
            if networked {
                let _ = crate::network::detach(plan.id.as_str());
            }
        }
        started
    }

    /// Snapshots the sandbox in `dir` into `dest` and restores one child per plan from it.
    pub(crate) fn fork_guest(
        &self,
        dir: &Path,
        dest: &Path,
        children: &[SandboxPlan],
    ) -> Result<(u64, Vec<ChildResult>)> {
        let size = self.snapshot_guest(dir, dest)?;
        let mut results = Vec::with_capacity(children.len());
        for batch in children.chunks(RESTORE_PARALLELISM) {
            std::thread::scope(|s| {
                let handles: Vec<_> =
                    batch.iter().map(|plan| s.spawn(move || self.restore_guest(dest, plan))).collect();
                for h in handles {
                    results.push(
                        h.join().unwrap_or_else(|_| Err(Error::Backend("a restore thread panicked".into()))),
                    );
                }
            });
        }
        Ok((size, results))
    }

    /// The agent's after-fork hook with a new identity, through a new connection (the
    /// snapshot's were reset).
    fn thaw_child(&self, plan: &SandboxPlan, dir: &Path) -> Result<HookReport> {
        let (identity, entropy) = AfterFork::fresh(plan.id.as_str(), &plan.hostname)
            .map_err(|e| Error::Backend(format!("the host's random source failed: {e}")))?;
        self.thaw(dir, &files::serial_log(dir), identity, entropy)
    }

    /// Runs the agent's after-fork hook with `identity` and `entropy`; errors quote the
    /// guest's serial log at `serial`.
    pub(crate) fn thaw(
        &self,
        dir: &Path,
        serial: &Path,
        identity: AfterFork,
        entropy: Vec<u8>,
    ) -> Result<HookReport> {
        let mut conn = self.agent(dir, serial)?;
        conn.apply_identity(identity, entropy).map_err(|e| {
            Error::Backend(format!(
                "the restored sandbox's agent did not run its after-fork hook: {e}; {}",
                files::serial_tail(serial)
            ))
        })
    }
}
