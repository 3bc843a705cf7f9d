//! Restore shells as the engine uses them: which sandboxes' forks take them, how many are kept
//! ready, and when they end. The shells themselves are a backend's optional capability
//! ([`RestoreShells`]; the gvisor backend has them, docs/architecture.md "Restore shells").

use super::Engine;
use branchbox_model::{
    Limits, RestoreShells, Result, Sandbox, SandboxId, SandboxState, ShellInfo, ShellsToEnd,
};
use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

impl Engine {
    /// The restore shells of every backend in use that has them.
    fn shell_owners(&self) -> Vec<&dyn RestoreShells> {
        let microvm =
            self.microvm.get().and_then(|m| m.as_ref().ok()).map(|b| b as &dyn branchbox_model::Backend);
        [Some(&self.gvisor as &dyn branchbox_model::Backend), microvm]
            .into_iter()
            .flatten()
            .filter_map(|b| b.shells())
            .collect()
    }

    /// The shells that can take children of `s` (whose image's root filesystem is `rootfs`)
    /// and their key, or `None` when its forks take no shells: shells are off, its backend
    /// has none, or it has a network (a shell's namespace would not be the child's).
    pub(crate) fn shell_key(
        &self,
        s: &Sandbox,
        rootfs: &Path,
    ) -> Result<Option<(&dyn RestoreShells, String)>> {
        if self.cfg.fork_shells == 0 {
            return Ok(None);
        }
        let Some(shells) = self.backend(s.backend)?.shells() else { return Ok(None) };
        Ok(branchbox_net::record::recorded(&self.sandbox_dir(&s.id))
            .map_err(super::network::net_error)?
            .is_none()
            .then(|| (shells, shells.key(rootfs, &s.limits))))
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
        let Some((shells, key)) = self.shell_key(&s, &rootfs)? else { return Ok(Vec::new()) };
        self.refill_shells(shells, &key, &rootfs, s.limits, n);
        let want = n.min(self.cfg.fork_shells);
        let deadline = Instant::now() + wait;
        loop {
            let all: Vec<ShellInfo> = shells.list().into_iter().filter(|i| i.key == key).collect();
            let ready: Vec<SandboxId> = all.iter().filter(|i| i.ready).map(|i| i.id.clone()).collect();
            if ready.len() >= want || all.len() == ready.len() || Instant::now() >= deadline {
                return Ok(ready
                    .into_iter()
                    .map(|id| {
                        let bytes = shells.memory_bytes(&id);
                        (id, bytes)
                    })
                    .collect());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Starts shells of `key` until it has `want` (at most the configured number) ready or
    /// starting; returns without waiting for them. A shell that cannot be started is reported
    /// on stderr and the rest are not tried: forks work without shells.
    pub(crate) fn refill_shells(
        &self,
        shells: &dyn RestoreShells,
        key: &str,
        rootfs: &Path,
        limits: Limits,
        want: usize,
    ) {
        let have = shells.list().iter().filter(|i| i.key == key).count();
        for _ in have..want.min(self.cfg.fork_shells) {
            let plan = self.plan(SandboxId::generate(), rootfs.to_path_buf(), limits);
            if let Err(e) = shells.start(key, &plan, self.cfg.shell_idle) {
                eprintln!("branchbox: cannot start a restore shell: {e}");
                return;
            }
        }
    }

    /// Ids of every shell, ready or starting: their sandbox directories are not debris.
    pub(crate) fn shell_ids(&self) -> BTreeSet<String> {
        self.shells().into_iter().map(|i| i.id.to_string()).collect()
    }

    /// Every shell, ready or starting, with the kind (key) of sandbox it is for.
    pub fn shells(&self) -> Vec<ShellInfo> {
        self.shell_owners().into_iter().flat_map(|s| s.list()).collect()
    }

    /// Ends shells: every one when `all`, else only those whose shim no longer answers or that
    /// never became ready. Each is claimed first, so no fork can take it meanwhile. Returns
    /// the ids ended.
    pub fn end_shells(&self, all: bool) -> Vec<SandboxId> {
        let which = if all { ShellsToEnd::All } else { ShellsToEnd::Stale };
        self.end_shells_of(which)
    }

    /// Ends, besides the stale ones, every shell of a kind that no sandbox in `live` has been
    /// of for the configured idle time: a kill of the last sandbox of a kind leaves its shells
    /// at most that long.
    pub(crate) fn end_unneeded_shells(&self, live: &[Sandbox]) -> Vec<SandboxId> {
        let needed: BTreeSet<String> = live
            .iter()
            .filter(|s| s.state != SandboxState::Lost)
            .filter_map(|s| {
                let rootfs = self.image_rootfs(&s.image).ok()?;
                self.shell_key(s, &rootfs).ok().flatten().map(|(_, key)| key)
            })
            .collect();
        self.end_shells_of(ShellsToEnd::Unneeded { needed: &needed, idle: self.cfg.shell_idle })
    }

    fn end_shells_of(&self, which: ShellsToEnd<'_>) -> Vec<SandboxId> {
        let reap = |id: &SandboxId| self.reap(id);
        self.shell_owners().into_iter().flat_map(|s| s.end(which, &reap)).collect()
    }
}
