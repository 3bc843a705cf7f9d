//! Creating a sandbox from an image: a plan, the backend's start, the record, and the exec
//! defaults an imported image brings.

use super::{BackendChoice, Engine};
use branchbox_image::DEFAULT_IMAGE;
use branchbox_model::{now_ms, Error, Limits, Result, Sandbox, SandboxId, SandboxState};

impl Engine {
    /// Creates and starts a sandbox from the default image (built first when missing).
    pub fn create(
        &self,
        choice: BackendChoice,
        limits: Option<Limits>,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Sandbox> {
        self.create_from(choice, limits, DEFAULT_IMAGE, progress)
    }

    /// Creates and starts a sandbox from the image `image` (a built-in name such as `default`
    /// or `minimal`, or an imported one), built first when missing.
    pub fn create_from(
        &self,
        choice: BackendChoice,
        limits: Option<Limits>,
        image: &str,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Sandbox> {
        self.create_networked(choice, limits, image, None, progress)
    }

    /// [`Engine::create_networked`], with the sandbox's exposed ports open to every local user
    /// of the host when `open_ports` ([`Engine::open_ports`]; docs/network.md). A sandbox whose
    /// ports cannot be opened is not kept.
    pub fn create_networked_ports(
        &self,
        choice: BackendChoice,
        limits: Option<Limits>,
        image: &str,
        network: Option<branchbox_net::Egress>,
        open_ports: bool,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Sandbox> {
        if open_ports && network.is_none() {
            return Err(Error::InvalidInput(
                "open ports need a network: give one (--network, --allow or --deny-all)".into(),
            ));
        }
        let sandbox = self.create_networked(choice, limits, image, network, progress)?;
        if open_ports {
            if let Err(e) = self.open_ports(&sandbox.id) {
                let _ = self.kill(&sandbox.id);
                return Err(e);
            }
        }
        Ok(sandbox)
    }

    /// [`Engine::create_from`] with a network and egress policy (`None`: no network;
    /// docs/network.md).
    pub fn create_networked(
        &self,
        choice: BackendChoice,
        limits: Option<Limits>,
        image: &str,
        network: Option<branchbox_net::Egress>,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Sandbox> {
        let _busy = self.in_progress()?;
        let limits = limits.unwrap_or(self.cfg.limits);
        limits.validate()?;
        let kind = self.resolve(choice);
        let backend = self.backend(kind)?;
        let defaults = self.image_defaults(image)?;
        let image = self.build_image(image, progress)?;
        let mut plan = self.plan(SandboxId::generate(), image.rootfs.clone(), limits);
        plan.network = network;
        if let Err(e) = backend.create(&plan) {
            let _ = backend.destroy(&plan.id, &plan.dir);
            return Err(e);
        }
        let sandbox = Sandbox {
            id: plan.id,
            backend: kind,
            image: image.id,
            state: SandboxState::Running,
            created_ms: now_ms(),
            parent_snapshot: None,
            limits,
            history: false,
        };
        self.store.insert_sandbox(&sandbox)?;
        // An imported image's Env and WorkingDir apply to its commands, as they do to a
        // template built on it; snapshots and forks pass them on.
        self.set_exec_defaults(&sandbox.id, &defaults)?;
        Ok(sandbox)
    }
}
