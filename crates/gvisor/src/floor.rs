//! The raw-runsc floor of a fork, for the fork benchmark: the runsc work a fork of `n`
//! children cannot avoid (one checkpoint of the source, then one restore per child), run back
//! to back with nothing of branchbox around it: no shim, no agent, no records, no parallelism.

use crate::GvisorBackend;
use branchbox_model::{Error, Result, SandboxId};
use std::path::Path;
use std::time::{Duration, Instant};

/// What the floor took.
#[derive(Debug, Clone)]
pub struct Floor {
    /// `runsc checkpoint` of the source, with the backend's flags.
    pub checkpoint: Duration,
    /// Each `runsc restore --detach` of that image, one after another.
    pub restores: Vec<Duration>,
}

impl Floor {
    /// The checkpoint and every restore.
    pub fn total(&self) -> Duration {
        self.checkpoint + self.restores.iter().sum::<Duration>()
    }
}

impl GvisorBackend {
    /// Measures the floor of a fork of `children` from sandbox `id` (runtime directory `dir`),
    /// using `work` (created, then removed) for the image and the restored copies' bundles.
    /// The copies are named `<id>-floor<i>`, so destroying or recovering the sandbox also
    /// finds them; each is destroyed before the next is restored, off the clock.
    pub fn raw_fork_floor(&self, id: &SandboxId, dir: &Path, work: &Path, children: usize) -> Result<Floor> {
        let runsc = self.runsc();
        let running = runsc.list(&format!("{id}-g"));
        let [cid] = &running[..] else {
            return Err(Error::Backend(format!(
                "sandbox {id} has {} runsc containers ({running:?}); the floor needs exactly one",
                running.len()
            )));
        };
        let base = dir.join(format!("bundle-{cid}")).join("config.json");
        let spec: serde_json::Value =
            std::fs::read(&base).map_err(|e| Error::io(&base, e)).and_then(|b| {
                serde_json::from_slice(&b).map_err(|e| Error::Backend(format!("{}: {e}", base.display())))
            })?;
        let image = work.join("image");
        std::fs::create_dir_all(&image).map_err(|e| Error::io(&image, e))?;
        let result = (|| {
            let t = Instant::now();
            runsc.checkpoint(cid, &image)?;
            let checkpoint = t.elapsed();
            let mut restores = Vec::with_capacity(children);
            for i in 0..children {
                let copy = format!("{id}-floor{i}");
                let bundle = work.join(&copy);
                std::fs::create_dir_all(&bundle).map_err(|e| Error::io(&bundle, e))?;
                let mut spec = spec.clone();
                if let Some(linux) = spec.get_mut("linux").and_then(|l| l.as_object_mut()) {
                    linux.insert("cgroupsPath".into(), format!("/branchbox/{copy}").into());
                }
                let config = bundle.join("config.json");
                let bytes = serde_json::to_vec(&spec).map_err(|e| Error::Backend(e.to_string()))?;
                std::fs::write(&config, bytes).map_err(|e| Error::io(&config, e))?;
                let t = Instant::now();
                let restored = runsc.restore_detached(&copy, &bundle, &image);
                restores.push(t.elapsed());
                runsc.destroy(&copy);
                crate::hostcg::remove(&copy);
                restored?;
            }
            Ok(Floor { checkpoint, restores })
        })();
        let _ = std::fs::remove_dir_all(work);
        result
    }
}
