//! Time-travel benchmarks on the gvisor backend: checkpoint, rollback, live branch and chain
//! spawn (see `docs/benchmarks.md`). gVisor snapshots are whole checkpoint images, so these
//! measure what a full-state runtime costs; the microVM figures come from `branchbox-vmm`.

use crate::report::Report;
use crate::sandbox::stats;
use branchbox_core::engine::{BackendChoice, Engine};
use branchbox_model::{BackendKind, Error, Result, SandboxId};
use std::collections::BTreeMap;
use std::time::Instant;

/// Which time-travel figure to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Travel {
    /// Checkpoint in place after dirtying 1, 10, 100 MiB.
    Checkpoint,
    /// Rollback in place after dirtying 1, 10, 100 MiB, state verified.
    Rollback,
    /// Ten one-child forks in a row from a live source.
    Branch,
    /// Restore from checkpoints at depth 0..3 of one lineage.
    Chain,
}

struct Source<'a> {
    engine: &'a Engine,
    id: SandboxId,
}

impl Drop for Source<'_> {
    fn drop(&mut self) {
        let _ = self.engine.kill(&self.id);
    }
}

fn sh(engine: &Engine, id: &SandboxId, line: &str) -> Result<()> {
    let spec = branchbox_protocol::ExecSpec::new(branchbox_protocol::Command::Shell(line.to_string()));
    let (status, _) = engine.exec(id, spec, None, &mut |_, _| {})?;
    if status.code != Some(0) {
        return Err(Error::Backend(format!("`{line}` failed: {status:?}")));
    }
    Ok(())
}

/// Dirties `mib` MiB of sandbox memory (a file in the in-memory /tmp).
fn dirty(engine: &Engine, id: &SandboxId, mib: u64, tag: &str) -> Result<()> {
    sh(engine, id, &format!("head -c {}M /dev/urandom > /tmp/dirty-{tag}", mib))
}

/// Runs one time-travel benchmark with `runs` samples per figure.
pub fn run(engine: &Engine, which: Travel, runs: usize, short: bool) -> Result<Report> {
    let created = engine.create(BackendChoice::Exactly(BackendKind::Gvisor), None, &mut |_| {})?;
    let src = Source { engine, id: created.id };
    let sizes: &[u64] = if short { &[1, 10] } else { &[1, 10, 100] };
    let mut figures = BTreeMap::new();
    let mut ratios = BTreeMap::new();
    let (method, reference) = match which {
        Travel::Checkpoint => {
            for &mib in sizes {
                let mut samples = Vec::new();
                for r in 0..runs {
                    dirty(engine, &src.id, mib, &format!("{mib}-{r}"))?;
                    let t = Instant::now();
                    engine.checkpoint(&src.id, None)?;
                    samples.push(t.elapsed());
                }
                figures.insert(format!("checkpoint_dirty_{mib}mib"), stats(&samples)?);
            }
            (
                "clock runs from the checkpoint call until the sandbox runs again (the shim has thawed it)",
                None,
            )
        }
        Travel::Rollback => {
            for &mib in sizes {
                let mut samples = Vec::new();
                for r in 0..runs {
                    let cp = engine.checkpoint(&src.id, None)?;
                    dirty(engine, &src.id, mib, &format!("rb-{mib}-{r}"))?;
                    let t = Instant::now();
                    engine.rollback(&src.id, cp.id.as_str())?;
                    sh(engine, &src.id, &format!("test ! -e /tmp/dirty-rb-{mib}-{r}"))?;
                    samples.push(t.elapsed());
                }
                figures.insert(format!("rollback_dirty_{mib}mib"), stats(&samples)?);
            }
            (
                "clock runs from the rollback call until a command in the rolled-back sandbox verified that \
              the dirtied file is gone",
                None,
            )
        }
        Travel::Branch => {
            dirty(engine, &src.id, 50, "branch")?;
            let (mut total, mut pause) = (Vec::new(), Vec::new());
            for _ in 0..10 {
                let t = Instant::now();
                let out = engine.fork(&src.id, 1)?;
                let child = match out.children.into_iter().next() {
                    Some(Ok(c)) => c.sandbox.id,
                    Some(Err(e)) => return Err(e),
                    None => return Err(Error::Backend("fork returned no child".into())),
                };
                engine.connect(&child)?.ping().map_err(|e| Error::Backend(e.to_string()))?;
                total.push(t.elapsed());
                engine.kill(&child)?;
                let t = Instant::now();
                engine.checkpoint(&src.id, None)?;
                pause.push(t.elapsed());
            }
            figures.insert("branch_child_answered".into(), stats(&total)?);
            figures.insert("ref_source_pause_window".into(), stats(&pause)?);
            ("ten one-child forks in a row from a live source holding 50 MiB; clock stops when the child's \
              agent answered; the source's pause window is the in-place checkpoint (freeze, checkpoint, \
              restore, thaw), measured separately after each branch", None)
        }
        Travel::Chain => {
            let mut chain = Vec::new();
            for depth in 0..4 {
                dirty(engine, &src.id, 1, &format!("chain-{depth}"))?;
                chain.push(engine.checkpoint(&src.id, None)?);
            }
            for (depth, cp) in chain.iter().enumerate() {
                let mut samples = Vec::new();
                for _ in 0..runs {
                    let t = Instant::now();
                    let child = engine.restore(cp.id.as_str())?;
                    engine.connect(&child.sandbox.id)?.ping().map_err(|e| Error::Backend(e.to_string()))?;
                    samples.push(t.elapsed());
                    engine.kill(&child.sandbox.id)?;
                }
                figures.insert(format!("spawn_depth_{depth}"), stats(&samples)?);
            }
            (
                "restore a child from the checkpoint at depth 0..3 of one lineage until its agent answered; \
              reference: depth 0",
                Some("spawn_depth_0"),
            )
        }
    };
    if let Some(r) = reference {
        let base = figures[r].p50.max(1e-9);
        for (k, v) in &figures {
            if k != r {
                ratios.insert(format!("{k}/{r}"), v.p50 / base);
            }
        }
    }
    let summary =
        figures.iter().map(|(k, v)| format!("{k} p50 {:.0} ms", v.p50)).collect::<Vec<_>>().join(", ");
    let name = format!("{which:?}").to_lowercase();
    Ok(Report {
        bench: name.clone(),
        backend: "gvisor".into(),
        method: method.into(),
        inputs: serde_json::json!({"runs": runs, "short": short}),
        host: crate::sandbox::host_facts(engine),
        figures,
        ratios,
        summary: format!("gvisor {name}: {summary}"),
    })
}
