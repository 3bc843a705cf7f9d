//! Restore shells: gvisor sandboxes created ahead of time with nothing in them, so that a fork
//! only loads each child's state into one instead of starting a sandbox process and its gofer
//! first (docs/architecture.md, "Restore shells"). Their markers and claims; the backend's
//! [`branchbox_model::RestoreShells`] (`crate::backend::GvisorShells`) starts and reaps them.
//!
//! A shell is made for one kind of sandbox (its image's root filesystem and its limits, the
//! key) and already has the id and runtime directory (`sandboxes/<id>`) of the child it will
//! become. `shells/<key>/<id>.starting` says one is being created; its shim renames that to
//! `shells/<key>/<id>` once the container exists. A claim renames the marker into the
//! sandbox's directory (`shell-claimed`): rename is atomic, so two processes forking at once
//! never get the same shell, and a shell that expires takes its marker the same way first.
//! An unrecorded sandbox directory that a marker names is a shell, not debris.

use crate::shim::{Shell, SHELL_CLAIMED, SHELL_STARTING as STARTING};
use branchbox_model::{Error, Limits, Result, SandboxId, SandboxPlan, ShellInfo, ShellsToEnd};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// A shell still not ready after this long (its shim gone or stuck) is stale.
const START_GRACE: Duration = Duration::from_secs(120);

/// Where restore shells are kept: markers under `root` (`<data>/shells`), each shell's runtime
/// directory under `sandboxes` (`<data>/sandboxes`, where the child's will be).
#[derive(Debug, Clone)]
pub(crate) struct ShellStore {
    root: PathBuf,
    sandboxes: PathBuf,
}

impl ShellStore {
    pub(crate) fn new(root: PathBuf, sandboxes: PathBuf) -> Self {
        ShellStore { root, sandboxes }
    }

    fn sandbox_dir(&self, id: &SandboxId) -> PathBuf {
        self.sandboxes.join(id.as_str())
    }
}

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

fn age(path: &Path) -> Option<Duration> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok())
}

impl ShellStore {
    /// Makes the starting marker of a shell of `key` for `plan` and has `spawn` start it with
    /// its ready marker's path; on failure removes the marker and the plan's directory.
    pub(crate) fn start(
        &self,
        key: &str,
        plan: &SandboxPlan,
        spawn: impl FnOnce(&Path) -> Result<()>,
    ) -> Result<()> {
        let dir = self.root.join(key);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        let marker = dir.join(plan.id.as_str());
        let starting = Shell::starting(&marker);
        let started =
            std::fs::write(&starting, b"").map_err(|e| Error::io(&starting, e)).and_then(|()| spawn(&marker));
        if started.is_err() {
            let _ = std::fs::remove_file(&starting);
            let _ = std::fs::remove_dir_all(&plan.dir);
        }
        started
    }

    /// Every shell, ready or starting.
    pub(crate) fn list(&self) -> Vec<ShellInfo> {
        let Ok(keys) = std::fs::read_dir(&self.root) else { return Vec::new() };
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

    /// Claims up to `n` ready shells of `key` (renaming each marker into its sandbox directory).
    pub(crate) fn claim(&self, key: &str, n: usize) -> Vec<SandboxId> {
        let mut got = Vec::new();
        for m in markers(&self.root.join(key)).into_iter().filter(|m| m.ready) {
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

    /// Ends the shells `which` names and the stale ones (a ready one whose runtime directory
    /// `alive` says is dead, or one never ready after [`START_GRACE`]): takes each, then `reap`s it.
    pub(crate) fn end(
        &self,
        which: ShellsToEnd<'_>,
        alive: &dyn Fn(&Path) -> bool,
        reap: &dyn Fn(&SandboxId) -> Result<()>,
    ) -> Vec<SandboxId> {
        let mut ended = Vec::new();
        let Ok(keys) = std::fs::read_dir(&self.root) else { return ended };
        for key in keys.flatten() {
            let dir = key.path();
            let all = match which {
                ShellsToEnd::All => true,
                ShellsToEnd::Stale => false,
                ShellsToEnd::Unneeded { needed, idle } => {
                    if needed.contains(key.file_name().to_string_lossy().as_ref()) {
                        // A kind still in use: its directory's time says when it last was.
                        let _ = std::fs::File::open(&dir).and_then(|d| d.set_modified(SystemTime::now()));
                        false
                    } else {
                        age(&dir).is_some_and(|a| a >= idle)
                    }
                }
            };
            for m in markers(&dir) {
                let stale = if m.ready {
                    !alive(&self.sandbox_dir(&m.id))
                } else {
                    age(&m.path).is_some_and(|a| a > START_GRACE)
                };
                if !(all || stale) {
                    continue;
                }
                // A starting shell whose marker is gone cannot publish itself; it is reaped
                // all the same, so nothing of it is left when this returns.
                let taken = if m.ready {
                    std::fs::rename(&m.path, self.sandbox_dir(&m.id).join(SHELL_CLAIMED)).is_ok()
                } else {
                    std::fs::remove_file(&m.path).is_ok()
                };
                if taken {
                    if let Err(e) = reap(&m.id) {
                        eprintln!("branchbox: cannot end restore shell {}: {e}", m.id);
                    }
                    ended.push(m.id);
                }
            }
            let _ = std::fs::remove_dir(&dir);
        }
        ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

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

    /// Shells in a temporary data directory: `n` ready ones and one starting, of key `k`, each
    /// with its sandbox directory (no runtime runs).
    fn layout(n: usize) -> (tempfile::TempDir, ShellStore, Vec<SandboxId>, SandboxId) {
        let data = tempfile::tempdir().unwrap();
        let shells = ShellStore::new(data.path().join("shells"), data.path().join("sandboxes"));
        std::fs::create_dir_all(data.path().join("shells/k")).unwrap();
        let ready: Vec<SandboxId> = (0..n).map(|_| SandboxId::generate()).collect();
        let starting = SandboxId::generate();
        for id in ready.iter().chain([&starting]) {
            std::fs::create_dir_all(shells.sandbox_dir(id)).unwrap();
        }
        for id in &ready {
            std::fs::write(data.path().join("shells/k").join(id.as_str()), b"").unwrap();
        }
        std::fs::write(data.path().join("shells/k").join(format!("{starting}{STARTING}")), b"").unwrap();
        (data, shells, ready, starting)
    }

    #[test]
    fn a_claim_takes_ready_shells_once_and_never_a_starting_one() {
        let (_data, shells, ready, starting) = layout(3);
        assert_eq!(shells.list().len(), 4);
        let first = shells.claim("k", 2);
        assert_eq!(first.len(), 2);
        let second = shells.claim("k", 5);
        assert_eq!(second.len(), 1);
        assert!(shells.claim("k", 1).is_empty());
        assert!(shells.claim("other", 1).is_empty());
        let mut all: Vec<String> = first.iter().chain(&second).map(|i| i.to_string()).collect();
        all.sort();
        let mut want: Vec<String> = ready.iter().map(|i| i.to_string()).collect();
        want.sort();
        assert_eq!(all, want);
        for id in &ready {
            assert!(shells.sandbox_dir(id).join(SHELL_CLAIMED).is_file());
        }
        let left = shells.list();
        assert_eq!(left.len(), 1);
        assert_eq!((left[0].id.as_str(), left[0].ready), (starting.as_str(), false));
    }

    #[test]
    fn ending_reaps_dead_ready_shells_keeps_young_starting_ones_and_all_ends_every_one() {
        let (_data, shells, ready, starting) = layout(2);
        let reaped = RefCell::new(Vec::new());
        let dead = |_: &Path| false;
        let reap = |id: &SandboxId| {
            reaped.borrow_mut().push(id.to_string());
            Ok(())
        };
        // No runtime answers for the ready ones: they are stale; the starting one is young.
        let mut stale: Vec<String> =
            shells.end(ShellsToEnd::Stale, &dead, &reap).iter().map(|i| i.to_string()).collect();
        stale.sort();
        let mut want: Vec<String> = ready.iter().map(|i| i.to_string()).collect();
        want.sort();
        assert_eq!(stale, want);
        let mut got = reaped.borrow().clone();
        got.sort();
        assert_eq!(got, want, "each ended shell is reaped");
        assert_eq!(shells.list().len(), 1);
        let needed = std::collections::BTreeSet::from(["k".to_string()]);
        let unneeded = ShellsToEnd::Unneeded { needed: &needed, idle: Duration::ZERO };
        assert!(shells.end(unneeded, &dead, &reap).is_empty(), "a needed kind keeps its shells");
        let none = std::collections::BTreeSet::new();
        let unneeded = ShellsToEnd::Unneeded { needed: &none, idle: Duration::from_secs(3600) };
        assert!(shells.end(unneeded, &dead, &reap).is_empty(), "a kind needed just now keeps its shells");
        let ended = shells.end(ShellsToEnd::All, &dead, &reap);
        assert_eq!(ended.iter().map(|i| i.as_str()).collect::<Vec<_>>(), [starting.as_str()]);
        assert!(shells.list().is_empty());
        assert!(!shells.root.join("k").exists(), "an emptied key directory is removed");
    }
}
