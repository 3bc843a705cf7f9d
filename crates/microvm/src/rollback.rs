//! Rollback in place: the sandbox keeps its id, its directory and the paths of its sockets,
//! and its guest, memory and disk, becomes the snapshot's.
//!
//! A VMM restores a snapshot into a VM it builds, not into the one it runs, so a rollback
//! starts a second VMM and hands it the sandbox's sockets:
//!
//! 1. The running VMM is paused (if its guest runs) and a connection to it is kept.
//! 2. Its control and vsock sockets get a second name (`*.prev`, hard links: the same
//!    listening sockets), and the new VMM binds the sandbox's own paths; until step 5 the old
//!    one is reached through the kept connection and the second names.
//! 3. The new VMM restores the snapshot, its serial log and stderr beside the old ones
//!    (`*.next`), its disk a new chain (`root-N`) forked from the snapshot's frozen disk in
//!    the sandbox's own store (the old chain stays whole).
//! 4. Its agent answers and runs the after-fork hook with the sandbox's own identity (id, host
//!    name and machine id as the restored guest has them; the snapshot was taken of this
//!    sandbox) and the host's wall clock, which is what a rollback must correct.
//! 5. Commit: the pid file and the chain record name the new VMM and chain, the logs take the
//!    sandbox's names, the old VMM is shut down, its chain removed.
//!
//! A failure in steps 2 to 4, or in writing step 5's two records, stops the new VMM, gives the second names back to the old sockets,
//! removes the new chain and the staged logs, and lets the old guest run again: the sandbox is
//! as it was. A crash of the caller between steps 2 and 5 leaves two VMMs (the old one paused);
//! `destroy` ends the one the pid file names, and the staged files go with the directory.

use crate::backend::{end_vmm, vmm_err, MicrovmBackend, LISTEN_TIMEOUT};
use crate::files;
use branchbox_model::{Error, Result};
use branchbox_protocol::AfterFork;
use branchbox_vmm::linux::state::{self as linux_state, LinuxState, LINUX_STATE_FILE};
use branchbox_vmm::process::protocol::{RestoreLinux, VmState};
use branchbox_vmm::process::{spawn_listening, VmmProcess};
use branchbox_vmm::VmConfig;
use std::path::{Path, PathBuf};

/// Longest machine id file read back from the guest (32 hex digits and a newline).
const MACHINE_ID_MAX: u64 = 64;

/// The files a rollback writes beside the sandbox's own until it commits.
struct Staged {
    control_prev: PathBuf,
    vsock_prev: PathBuf,
    serial: PathBuf,
    vmm_log: PathBuf,
}

impl Staged {
    fn new(dir: &Path) -> Staged {
        let beside = |p: PathBuf, ext: &str| {
            let mut name = p.into_os_string();
            name.push(ext);
            PathBuf::from(name)
        };
        Staged {
            control_prev: beside(files::control(dir), ".prev"),
            vsock_prev: beside(files::vsock(dir), ".prev"),
            serial: beside(files::serial_log(dir), ".next"),
            vmm_log: beside(files::vmm_log(dir), ".next"),
        }
    }

    /// Gives the old VMM's sockets their second names (left over ones first removed).
    fn link(&self, dir: &Path) -> Result<()> {
        for (from, to) in [(files::control(dir), &self.control_prev), (files::vsock(dir), &self.vsock_prev)] {
            let _ = std::fs::remove_file(to);
            std::fs::hard_link(&from, to).map_err(|e| Error::io(&from, e))?;
        }
        Ok(())
    }

    /// Puts the old VMM's sockets back under the sandbox's names and removes what the new
    /// VMM wrote. Each step is tried: the sandbox's sockets matter most.
    fn undo(&self, dir: &Path) -> Result<()> {
        let mut first = None;
        for (from, to) in [(&self.control_prev, files::control(dir)), (&self.vsock_prev, files::vsock(dir))] {
            if let Err(e) = std::fs::rename(from, &to) {
                first.get_or_insert(Error::io(&to, e));
            }
        }
        for p in [&self.serial, &self.vmm_log] {
            let _ = std::fs::remove_file(p);
        }
        first.map_or(Ok(()), Err)
    }

    /// The new VMM's logs take the sandbox's names; the second names go.
    fn commit(&self, dir: &Path) {
        let _ = std::fs::rename(&self.serial, files::serial_log(dir));
        let _ = std::fs::rename(&self.vmm_log, files::vmm_log(dir));
        let _ = std::fs::remove_file(&self.control_prev);
        let _ = std::fs::remove_file(&self.vsock_prev);
    }
}

/// Step 5's records: the chain record names `next` and the pid file `pid`, or, when either
/// write fails, both stay as they were, so the failure path can stop the new VMM and resume
/// the old one.
fn name_the_new_vmm(dir: &Path, current: &str, next: &str, pid: i32) -> Result<()> {
    files::record_chain(dir, next)?;
    files::write_atomic(&files::pid_file(dir), pid.to_string().as_bytes()).inspect_err(|_| {
        let _ = files::record_chain(dir, current);
    })
}

impl MicrovmBackend {
    /// Returns the sandbox in `dir` to the snapshot in `src` (see the module's comment). On
    /// failure the sandbox runs on as it was.
    pub(crate) fn rollback_guest(&self, dir: &Path, src: &Path) -> Result<()> {
        let dir = std::path::absolute(dir).map_err(|e| Error::io(dir, e))?;
        let src = std::path::absolute(src).map_err(|e| Error::io(src, e))?;
        if crate::network::is_networked(&dir)? {
            // The new VMM restores while the old one still holds the guest namespace's tap,
            // which takes one VMM at a time.
            return Err(Error::Unavailable(
                "rollback in place of a networked microvm sandbox is not built yet; restore the snapshot into a new sandbox (`branchbox restore`) instead".into(),
            ));
        }
        let state = linux_state::read(&src.join(LINUX_STATE_FILE))
            .map_err(|e| Error::InvalidInput(format!("{} is not a microvm snapshot: {e}", src.display())))?;
        let old_pid = files::our_vmm(&dir).ok_or_else(|| {
            Error::Backend(format!("the sandbox in {} has no running VMM to roll back", dir.display()))
        })?;
        // Everything that can refuse the rollback is read before the old guest is paused.
        let current = files::current_chain(&dir)?;
        let next = files::next_chain(&current)?;
        let mut old = VmmProcess::connect(&files::control(&dir)).map_err(vmm_err)?;
        let ran = old.status().map_err(vmm_err)?.state == VmState::Running;
        if ran {
            old.pause().map_err(vmm_err)?;
        }
        let staged = Staged::new(&dir);
        let mut new_pid = None;
        let started = staged
            .link(&dir)
            .and_then(|()| self.start_rolled_back(&dir, &src, &state, &next, &staged, &mut new_pid))
            .and_then(|()| name_the_new_vmm(&dir, &current, &next, new_pid.unwrap_or_default()));
        let store = branchbox_disk::Store::open(&files::disk_store(&dir));
        if let Some(frozen) = state.disk.as_ref().map(|d| &d.frozen) {
            // The restore recorded the snapshot's frozen disk in this store to fork from it;
            // the new chain names its layers itself, and a later rollback to the same
            // snapshot records it again.
            if let Ok(store) = &store {
                let _ = store.remove_chain(frozen);
            }
        }
        match started {
            Ok(()) => {
                staged.commit(&dir);
                end_vmm(&dir, old_pid, Some(old));
                if let Ok(store) = &store {
                    // The old guest's chain: its top goes, its deltas stay while a snapshot
                    // names them.
                    let _ = store.remove_chain(&current);
                }
                Ok(())
            }
            Err(e) => {
                if let Some(pid) = new_pid {
                    end_vmm(&dir, pid, VmmProcess::connect(&files::control(&dir)).ok());
                }
                let undone = staged.undo(&dir);
                if let Ok(store) = &store {
                    let _ = store.remove_chain(&next);
                }
                let resumed = if ran { old.resume().map_err(vmm_err) } else { Ok(()) };
                match (undone, resumed) {
                    (Ok(()), Ok(())) => Err(Error::Backend(format!(
                        "the rollback failed and the sandbox runs on as it was: {e}"
                    ))),
                    (Err(u), _) | (_, Err(u)) => Err(Error::Backend(format!(
                        "the rollback failed ({e}) and the sandbox could not be put back as it was: {u}"
                    ))),
                }
            }
        }
    }

    /// Steps 2 to 4 of the module's comment: the new VMM, its restore and its agent's hook.
    fn start_rolled_back(
        &self,
        dir: &Path,
        src: &Path,
        state: &LinuxState,
        chain: &str,
        staged: &Staged,
        pid: &mut Option<i32>,
    ) -> Result<()> {
        let config = VmConfig { mem_size: state.memory.size, vcpus: state.vcpus, irqchip: false };
        let spawned = spawn_listening(
            &self.config().vmm,
            config,
            &files::control(dir),
            &staged.vmm_log,
            LISTEN_TIMEOUT,
        )
        .map_err(|e| Error::Unavailable(e.to_string()))?;
        *pid = i32::try_from(spawned).ok();
        let mut vmm = VmmProcess::connect(&files::control(dir)).map_err(vmm_err)?;
        vmm.restore_linux(RestoreLinux {
            dir: src.to_owned(),
            serial_log: staged.serial.clone(),
            vsock_socket: files::vsock(dir),
            disk_store: files::disk_store(dir),
            disk_chain: chain.into(),
            resume: true,
            net: None,
        })
        .map_err(vmm_err)?;
        // The listening VMM serves one connection at a time: `connect` asks it for the
        // guest's status while it waits for the agent.
        drop(vmm);
        self.thaw_in_place(dir, &staged.serial)
    }

    /// The after-fork hook with the restored guest's own identity and the host's clock.
    fn thaw_in_place(&self, dir: &Path, serial: &Path) -> Result<()> {
        let mut conn = self.agent(dir, serial)?;
        let agent = |e| Error::Backend(format!("the restored guest's agent: {e}"));
        let info = conn.info().map_err(agent)?;
        let machine_id = conn
            .read_file_bytes("/etc/machine-id", MACHINE_ID_MAX)
            .ok()
            .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
            .filter(|id| id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()));
        let sandbox_id = match info.sandbox_id {
            id if id.is_empty() => {
                dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
            }
            id => id,
        };
        let (mut identity, entropy) = AfterFork::fresh(&sandbox_id, &info.hostname)
            .map_err(|e| Error::Backend(format!("the host's random source failed: {e}")))?;
        if let Some(id) = machine_id {
            identity.machine_id = id;
        }
        drop(conn);
        self.thaw(dir, serial, identity, entropy).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_pid_file_write_leaves_the_chain_record_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        files::record_chain(dir.path(), "root-1").unwrap();
        std::fs::write(files::pid_file(dir.path()), "41").unwrap();
        // The pid file's temporary name is taken by a directory: its write fails.
        std::fs::create_dir(files::pid_file(dir.path()).with_extension("tmp")).unwrap();
        assert!(name_the_new_vmm(dir.path(), "root-1", "root-2", 42).is_err());
        assert_eq!(files::current_chain(dir.path()).unwrap(), "root-1");
        assert_eq!(std::fs::read_to_string(files::pid_file(dir.path())).unwrap(), "41");

        std::fs::remove_dir(files::pid_file(dir.path()).with_extension("tmp")).unwrap();
        name_the_new_vmm(dir.path(), "root-1", "root-2", 42).unwrap();
        assert_eq!(files::current_chain(dir.path()).unwrap(), "root-2");
        assert_eq!(std::fs::read_to_string(files::pid_file(dir.path())).unwrap(), "42");
    }
}
