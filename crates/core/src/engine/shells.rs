//! Restore shells: gvisor sandboxes created ahead of time with nothing in them, so that a fork
//! only loads each child's state into one instead of starting a sandbox process and its gofer
//! first (docs/architecture.md, "Restore shells").
//!
//! A shell is made for one kind of sandbox (its image's root filesystem and its limits, the
//! key) and already has the id and runtime directory (`sandboxes/<id>`) of the child it will
//! become. `shells/<key>/<id>.starting` says one is being created; its shim renames that to
//! `shells/<key>/<id>` once the container exists. A claim renames the marker into the
//! sandbox's directory (`shell-claimed`): rename is atomic, so two processes forking at once
//! never get the same shell, and a shell that expires takes its marker the same way first.
//! An unrecorded sandbox directory that a marker names is a shell, not debris.

use super::Engine;
use branchbox_gvisor::shim::{Shell, SHELL_CLAIMED, SHELL_STARTING as STARTING};
use branchbox_model::{Backend, BackendKind, Limits, Result, Sandbox, SandboxId, SandboxState};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// A shell still not ready after this long (its shim gone or stuck) is ended by the next
/// reconciliation.
const START_GRACE_MS: u64 = 120_000;

/// The key of the shells that can take children of sandboxes with `rootfs` and `limits`.
pub(crate) fn key(rootfs: &Path, limits: &Limits) -> String {
    let mut h = Sha256::new();
    h.update(rootfs.as_os_str().as_encoded_bytes());
    h.update([0]);
    h.update(format!("{}/{}/{}", limits.memory_mib, limits.cpus, limits.pids));
    hex::encode(&h.finalize()[..8])
}

/// A shell's marker, as found in `shells/<key>/`.
struct Marker {
    id: SandboxId,
    path: PathBuf,
    ready: bool,
}

fn markers(dir: &Path) -> Vec<Marker> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let (id, ready) = match name.strip_suffix(STARTING) {
                Some(id) => (id.to_string(), false),
                None => (name, true),
            };
            Some(Marker { id: SandboxId::parse(&id).ok()?, path: e.path(), ready })
        })
        .collect()
}

impl Engine {
    fn shells_root(&self) -> PathBuf {
        self.cfg.data_dir.join("shells")
    }

    /// The key of the shells that can take children of `s` (whose image's root filesystem is
    /// `rootfs`), or `None` when its forks take no shells: shells are off, it is not a gvisor
    /// sandbox, or it has a network (a shell's namespace would not be the child's).
    pub(crate) fn shell_key(&self, s: &Sandbox, rootfs: &Path) -> Result<Option<String>> {
        if s.backend != BackendKind::Gvisor || self.cfg.fork_shells == 0 {
            return Ok(None);
        }
        Ok(branchbox_net::record::recorded(&self.sandbox_dir(&s.id))
            .map_err(super::network::net_error)?
            .is_none()
            .then(|| key(rootfs, &s.limits)))
    }

    /// Starts restore shells for forks of sandbox `id` until `n` (at most the configured
    /// number) are ready or starting, then waits at most `wait` until they are ready. Returns
    /// the ids of the ready ones and the host memory each uses (`None` where the host's
    /// cgroups do not say), in no particular order; empty when its forks take no shells.
    pub fn prepare_shells(
        &self,
        id: &SandboxId,
        n: usize,
        wait: Duration,
    ) -> Result<Vec<(SandboxId, Option<u64>)>> {
        let s = self.store.sandbox(id)?;
        let rootfs = self.image_rootfs(&s.image)?;
        let Some(key) = self.shell_key(&s, &rootfs)? else { return Ok(Vec::new()) };
        self.refill_shells(&key, &rootfs, s.limits, n);
        let want = n.min(self.cfg.fork_shells);
        let deadline = Instant::now() + wait;
        loop {
            let all = markers(&self.shells_root().join(&key));
            let ready: Vec<SandboxId> = all.iter().filter(|m| m.ready).map(|m| m.id.clone()).collect();
            if ready.len() >= want || all.len() == ready.len() || Instant::now() >= deadline {
                return Ok(ready
                    .into_iter()
                    .map(|id| {
                        let bytes = branchbox_gvisor::hostcg::memory_bytes(&format!("{id}-g1"));
                        (id, bytes)
                    })
                    .collect());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Claims up to `n` ready shells of `key`; returns their ids (their directories now hold
    /// [`SHELL_CLAIMED`]).
    pub(crate) fn claim_shells(&self, key: &str, n: usize) -> Vec<SandboxId> {
        let mut got = Vec::new();
        for m in markers(&self.shells_root().join(key)).into_iter().filter(|m| m.ready) {
            if got.len() == n {
                break;
            }
            // Fails when another claim or the shell's own expiry took it first.
            if std::fs::rename(&m.path, self.sandbox_dir(&m.id).join(SHELL_CLAIMED)).is_ok() {
                got.push(m.id);
            }
        }
        got
    }

    /// Starts shells of `key` until it has `want` (at most the configured number) ready or
    /// starting; returns without waiting for them. A shell that cannot be started is reported
    /// on stderr and the rest are not tried: forks work without shells.
    pub(crate) fn refill_shells(&self, key: &str, rootfs: &Path, limits: Limits, want: usize) {
        let dir = self.shells_root().join(key);
        if let Err(e) = std::fs::create_dir_all(&dir) {
            eprintln!("branchbox: cannot keep restore shells in {}: {e}", dir.display());
            return;
        }
        let have = markers(&dir).len();
        for _ in have..want.min(self.cfg.fork_shells) {
            let plan = self.plan(SandboxId::generate(), rootfs.to_path_buf(), limits);
            let marker = dir.join(plan.id.as_str());
            let starting = Shell::starting(&marker);
            let started = std::fs::write(&starting, b"").map_err(|e| e.to_string()).and_then(|()| {
                self.gvisor.start_shell(&plan, &marker, self.cfg.shell_idle).map_err(|e| e.to_string())
            });
            if let Err(e) = started {
                eprintln!("branchbox: cannot start a restore shell: {e}");
                let _ = std::fs::remove_file(&starting);
                let _ = std::fs::remove_dir_all(&plan.dir);
                return;
            }
        }
    }

    /// Ids of every shell, ready or starting: their sandbox directories are not debris.
    pub(crate) fn shell_ids(&self) -> BTreeSet<String> {
        let Ok(keys) = std::fs::read_dir(self.shells_root()) else { return BTreeSet::new() };
        keys.flatten().flat_map(|k| markers(&k.path())).map(|m| m.id.to_string()).collect()
    }

    /// Every shell, ready or starting, with the kind (key) of sandbox it is for.
    pub fn shells(&self) -> Vec<ShellInfo> {
        let Ok(keys) = std::fs::read_dir(self.shells_root()) else { return Vec::new() };
        keys.flatten()
            .flat_map(|k| {
                let key = k.file_name().to_string_lossy().into_owned();
                markers(&k.path()).into_iter().map(move |m| ShellInfo {
                    id: m.id,
                    key: key.clone(),
                    ready: m.ready,
                })
            })
            .collect()
    }

    /// Ends shells: every one when `all`, else only those whose shim no longer answers or that
    /// never became ready. Each is claimed first, so no fork can take it meanwhile. Returns
    /// the ids ended.
    pub fn end_shells(&self, all: bool) -> Vec<SandboxId> {
        self.end_shells_where(|_| all)
    }

    /// Ends, besides the stale ones, every shell of a kind that no sandbox in `live` has been
    /// of for the configured idle time: a kill of the last sandbox of a kind leaves its shells
    /// at most that long. A kind still in use has its directory's time set to now.
    pub(crate) fn end_unneeded_shells(&self, live: &[Sandbox]) -> Vec<SandboxId> {
        let needed: BTreeSet<String> = live
            .iter()
            .filter(|s| s.state != SandboxState::Lost)
            .filter_map(|s| {
                let rootfs = self.image_rootfs(&s.image).ok()?;
                self.shell_key(s, &rootfs).ok().flatten()
            })
            .collect();
        let idle = self.cfg.shell_idle;
        self.end_shells_where(|dir| {
            if dir.file_name().is_some_and(|k| needed.contains(k.to_string_lossy().as_ref())) {
                let _ = std::fs::File::open(dir).and_then(|d| d.set_modified(SystemTime::now()));
                return false;
            }
            std::fs::metadata(dir)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= idle)
        })
    }

    /// Ends the stale shells, and every shell of each key directory for which `whole` says so.
    fn end_shells_where(&self, whole: impl Fn(&Path) -> bool) -> Vec<SandboxId> {
        let mut ended = Vec::new();
        let Ok(keys) = std::fs::read_dir(self.shells_root()) else { return ended };
        for key in keys.flatten() {
            let all = whole(&key.path());
            for m in markers(&key.path()) {
                let dir = self.sandbox_dir(&m.id);
                let stale = if m.ready {
                    !self.gvisor.is_alive(&dir)
                } else {
                    std::fs::metadata(&m.path)
                        .and_then(|md| md.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .is_some_and(|age| age.as_millis() > u128::from(START_GRACE_MS))
                };
                if !(all || stale) {
                    continue;
                }
                // A starting shell whose marker is gone cannot publish itself; it is reaped
                // all the same, so nothing of it is left when this returns.
                let taken = if m.ready {
                    std::fs::rename(&m.path, dir.join(SHELL_CLAIMED)).is_ok()
                } else {
                    std::fs::remove_file(&m.path).is_ok()
                };
                if taken {
                    if let Err(e) = self.reap(&m.id) {
                        eprintln!("branchbox: cannot end restore shell {}: {e}", m.id);
                    }
                    ended.push(m.id);
                }
            }
            let _ = std::fs::remove_dir(key.path());
        }
        ended
    }
}

/// A restore shell as [`Engine::shells`] lists it.
#[derive(Debug, Clone, Serialize)]
pub struct ShellInfo {
    /// The id of the child it will become.
    pub id: SandboxId,
    /// The kind of sandbox whose forks it takes (its image's root filesystem and limits).
    pub key: String,
    /// Whether it is ready to be claimed (else still starting).
    pub ready: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_follows_the_root_filesystem_and_every_limit() {
        let l = Limits { memory_mib: 512, cpus: 1, pids: 64 };
        let k = key(Path::new("/images/a/rootfs"), &l);
        assert_eq!(k.len(), 16);
        assert_eq!(k, key(Path::new("/images/a/rootfs"), &l));
        assert_ne!(k, key(Path::new("/images/b/rootfs"), &l));
        for other in [Limits { memory_mib: 1024, ..l }, Limits { cpus: 2, ..l }, Limits { pids: 128, ..l }] {
            assert_ne!(k, key(Path::new("/images/a/rootfs"), &other));
        }
    }

    #[test]
    fn markers_are_sandbox_ids_ready_or_starting_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (SandboxId::generate(), SandboxId::generate());
        std::fs::write(dir.path().join(a.as_str()), b"").unwrap();
        std::fs::write(dir.path().join(format!("{b}{STARTING}")), b"").unwrap();
        for junk in ["notes.txt", "sbx-xyz", ".starting"] {
            std::fs::write(dir.path().join(junk), b"").unwrap();
        }
        let mut found: Vec<(String, bool)> =
            markers(dir.path()).into_iter().map(|m| (m.id.to_string(), m.ready)).collect();
        found.sort();
        let mut want = vec![(a.to_string(), true), (b.to_string(), false)];
        want.sort();
        assert_eq!(found, want);
    }
}
