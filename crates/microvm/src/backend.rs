//! [`Backend`] for Linux microVMs, one `branchbox-vmm` process per sandbox.

use crate::files::{self, check_socket_paths, serial_tail};
use branchbox_image::{cached_disk, cached_kernel, external_kernel, Image, KernelSource, KERNEL_ENV};
use branchbox_model::{AgentConn, Backend, BackendKind, ChildResult, Error, Result, SandboxId, SandboxPlan};
use branchbox_protocol::{AgentClient, HookReport, AGENT_VSOCK_PORT};
use branchbox_vmm::linux::connect_guest_port;
use branchbox_vmm::process::protocol::{BootLinux, ErrorKind, VmState};
use branchbox_vmm::process::{spawn_listening, ClientError, VmmProcess};
use branchbox_vmm::VmConfig;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Longest the engine waits for a new guest's agent to answer (a hardware-KVM boot to the
/// agent takes well under a second; this only bounds a guest that hangs).
pub const AGENT_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest a VMM process may take to listen on its control socket.
pub(crate) const LISTEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a VMM process may take to end after a shutdown request.
const EXIT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one vsock connection attempt may wait for the device's answer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one connection's handshake may wait for the agent before a fresh connection is
/// tried. After a restore the guest handles the vsock transport-reset event on its own time and
/// resets every connection it has by then, possibly the one it had just accepted from us: that
/// connection never answers, and only a new one does.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the microvm backend finds its programs and guest.
#[derive(Debug, Clone)]
pub struct MicrovmConfig {
    /// The `branchbox-vmm` program.
    pub vmm: PathBuf,
    /// The guest kernel (`vmlinux`, ELF).
    pub kernel: PathBuf,
    /// The image cache, where each image's root disk is found.
    pub images_dir: PathBuf,
    /// The agent the root disks were built with (part of a disk's cache key).
    pub agent: PathBuf,
    /// Longest [`Backend::create`] and [`Backend::connect`] wait for the agent.
    pub agent_timeout: Duration,
}

/// The microvm backend.
#[derive(Debug, Clone)]
pub struct MicrovmBackend {
    cfg: MicrovmConfig,
}

pub(crate) fn vmm_err(e: ClientError) -> Error {
    match e.remote().map(|r| r.kind) {
        Some(ErrorKind::Unsupported) => Error::Unavailable(e.to_string()),
        _ => Error::Backend(e.to_string()),
    }
}

/// Longest host name the guest's agent accepts.
const MAX_HOSTNAME: usize = 64;

/// Refuses a host name the agent would not set: it goes on the kernel command line, where a
/// space would add a parameter of its own.
fn check_hostname(name: &str) -> Result<()> {
    let valid = (1..=MAX_HOSTNAME).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if valid {
        return Ok(());
    }
    Err(Error::InvalidInput(format!(
        "host name {name:?} is not 1-{MAX_HOSTNAME} letters, digits, '-' or '.'; the guest's kernel command line carries it"
    )))
}

fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).map_err(|e| Error::io(path, e))
}

impl MicrovmBackend {
    /// A backend with `cfg` as given.
    pub fn new(cfg: MicrovmConfig) -> MicrovmBackend {
        MicrovmBackend { cfg }
    }

    /// A backend booting the cached guest kernel (or the one `BRANCHBOX_KERNEL` names) with
    /// root disks from `images_dir`; fails, naming the command that builds it, when the
    /// kernel is not built. Builds nothing.
    pub fn locate(vmm: PathBuf, images_dir: PathBuf, agent: PathBuf) -> Result<MicrovmBackend> {
        let kernel = match std::env::var_os(KERNEL_ENV).filter(|v| !v.is_empty()) {
            Some(path) => external_kernel(Path::new(&path))?,
            None => cached_kernel(&images_dir, &KernelSource::debian()?).ok_or_else(|| {
                Error::Unavailable(format!(
                    "the guest kernel is not built in {}; build it with `branchbox guest kernel`",
                    images_dir.display()
                ))
            })?,
        };
        let kernel = kernel.vmlinux.ok_or_else(|| {
            Error::Unavailable(format!(
                "{KERNEL_ENV} names a bzImage; the microvm backend boots a vmlinux (ELF)"
            ))
        })?;
        Ok(MicrovmBackend::new(MicrovmConfig {
            vmm,
            kernel,
            images_dir,
            agent,
            agent_timeout: AGENT_TIMEOUT,
        }))
    }

    /// The cached root disk of the image whose root filesystem is `rootfs`.
    fn disk_for(&self, rootfs: &Path) -> Result<PathBuf> {
        let id = rootfs.parent().and_then(Path::file_name).map(|n| n.to_string_lossy().into_owned());
        let Some(id) = id else {
            return Err(Error::InvalidInput(format!(
                "{} is not an image's root filesystem",
                rootfs.display()
            )));
        };
        let image = Image { id, rootfs: rootfs.to_path_buf(), built: false };
        match cached_disk(&self.cfg.images_dir, &image, &self.cfg.agent)? {
            Some(disk) => Ok(disk.path),
            None => Err(Error::Unavailable(format!(
                "the root disk of image {} with the agent {} is not built in {}; build it with `branchbox guest disk --image NAME` (NAME: the image given to create, `default` when none)",
                image.id,
                self.cfg.agent.display(),
                self.cfg.images_dir.display()
            ))),
        }
    }

    /// Starts the sandbox's VMM and boots its guest; the agent is not waited for.
    fn boot(&self, plan: &SandboxPlan, dir: &Path) -> Result<()> {
        let disk = absolute(&self.disk_for(&plan.rootfs)?)?;
        let mem_size = plan.limits.memory_mib.saturating_mul(1 << 20);
        let vcpus = u8::try_from(plan.limits.cpus).map_err(|_| {
            Error::InvalidInput(format!("{} CPUs is more than a microVM has (at most 255)", plan.limits.cpus))
        })?;
        let config = VmConfig { mem_size, vcpus, irqchip: false };
        let net = match &plan.network {
            Some(egress) => Some(crate::network::attach(plan.id.as_str(), dir, egress)?),
            None => None,
        };
        let pid = spawn_listening(
            &self.cfg.vmm,
            config,
            &files::control(dir),
            &files::vmm_log(dir),
            LISTEN_TIMEOUT,
        )
        .map_err(|e| Error::Unavailable(e.to_string()))?;
        let pid_path = files::pid_file(dir);
        std::fs::write(&pid_path, pid.to_string()).map_err(|e| Error::io(&pid_path, e))?;
        let mut vmm = VmmProcess::connect(&files::control(dir)).map_err(vmm_err)?;
        vmm.boot_linux(BootLinux {
            kernel: absolute(&self.cfg.kernel)?,
            disk,
            disk_store: files::disk_store(dir),
            disk_chain: files::DISK_CHAIN.into(),
            cmdline_extra: format!(
                "branchbox.hostname={}{}",
                plan.hostname,
                crate::network::cmdline(net.as_ref())
            ),
            mem_size,
            vcpus,
            vsock_socket: files::vsock(dir),
            serial_log: files::serial_log(dir),
            net,
        })
        .map_err(vmm_err)
    }

    /// Why the sandbox's guest cannot answer, if it cannot: its VMM is gone or its guest
    /// ended. `vmm` keeps the control connection between polls.
    fn guest_gone(dir: &Path, vmm: &mut Option<VmmProcess>) -> Option<String> {
        if vmm.is_none() {
            match VmmProcess::connect(&files::control(dir)) {
                Ok(p) => *vmm = Some(p),
                Err(e) => return Some(format!("the sandbox's VMM process is gone ({e})")),
            }
        }
        match vmm.as_mut().map(VmmProcess::status) {
            Some(Ok(s)) => match s.state {
                VmState::GuestExited { reason } => Some(format!("the guest ended: {reason}")),
                _ => None,
            },
            Some(Err(e)) => Some(format!("the sandbox's VMM process is gone ({e})")),
            None => None,
        }
    }
}

impl Backend for MicrovmBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Microvm
    }

    fn create(&self, plan: &SandboxPlan) -> Result<()> {
        let dir = self.sandbox_dir(plan)?;
        let started = self.boot(plan, &dir).and_then(|()| self.connect(&dir).map(drop));
        if started.is_err() {
            // Leave no VMM and no network behind; the directory keeps the logs the error
            // quotes until the engine removes it.
            self.stop_vmm(&dir);
            if plan.network.is_some() {
                let _ = crate::network::detach(plan.id.as_str());
            }
        }
        started
    }

    fn connect(&self, dir: &Path) -> Result<AgentConn> {
        self.agent(dir, &files::serial_log(dir))
    }

    fn pause(&self, dir: &Path) -> Result<()> {
        VmmProcess::connect(&files::control(dir)).and_then(|mut p| p.pause()).map_err(vmm_err)
    }

    fn resume(&self, dir: &Path) -> Result<()> {
        VmmProcess::connect(&files::control(dir)).and_then(|mut p| p.resume()).map_err(vmm_err)
    }

    fn snapshot(&self, dir: &Path, dest: &Path) -> Result<u64> {
        self.snapshot_guest(dir, dest)
    }

    fn rollback(&self, dir: &Path, src: &Path) -> Result<()> {
        self.rollback_guest(dir, src)
    }

    fn restore(&self, src: &Path, plan: &SandboxPlan) -> Result<HookReport> {
        self.restore_guest(src, plan)
    }

    fn fork(&self, dir: &Path, dest: &Path, children: &[SandboxPlan]) -> Result<(u64, Vec<ChildResult>)> {
        self.fork_guest(dir, dest, children)
    }

    fn destroy(&self, id: &SandboxId, dir: &Path) -> Result<()> {
        // Read before the directory goes; a record that cannot be read still tears down.
        let networked = crate::network::is_networked(dir).unwrap_or(true);
        self.stop_vmm(dir);
        if networked {
            crate::network::detach(id.as_str())?;
        }
        match std::fs::remove_dir_all(dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(dir, e)),
        }
    }

    fn is_alive(&self, dir: &Path) -> bool {
        VmmProcess::connect(&files::control(dir))
            .and_then(|mut p| p.status())
            .is_ok_and(|s| matches!(s.state, VmState::Running | VmState::Paused))
    }
}

impl MicrovmBackend {
    /// Connects to the agent of the guest behind `dir`'s vsock socket; errors quote the serial
    /// log at `serial`.
    pub(crate) fn agent(&self, dir: &Path, serial: &Path) -> Result<AgentConn> {
        let deadline = Instant::now() + self.cfg.agent_timeout;
        let mut vmm = None;
        loop {
            let last = match connect_guest_port(&files::vsock(dir), AGENT_VSOCK_PORT, CONNECT_TIMEOUT) {
                Ok(stream) => {
                    let mut agent = AgentClient::new(stream);
                    let wait = agent.limits().timeout;
                    agent.set_wait(Some(HELLO_TIMEOUT));
                    match agent.hello() {
                        Ok(()) => {
                            agent.set_wait(wait);
                            return Ok(agent);
                        }
                        Err(e) => format!("the agent's handshake failed: {e}"),
                    }
                }
                Err(e) => format!("vsock port {AGENT_VSOCK_PORT}: {e}"),
            };
            if let Some(why) = Self::guest_gone(dir, &mut vmm) {
                return Err(Error::Backend(format!(
                    "the sandbox's agent cannot answer: {why}; {}",
                    serial_tail(serial)
                )));
            }
            if Instant::now() > deadline {
                return Err(Error::Backend(format!(
                    "the agent did not answer within {}s (last: {last}); {}",
                    self.cfg.agent_timeout.as_secs(),
                    serial_tail(serial)
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The backend's configuration.
    pub(crate) fn config(&self) -> &MicrovmConfig {
        &self.cfg
    }

    /// Checks the plan's host name and makes its directory (owner-only: its sockets drive
    /// the VM and reach the agent); returns the directory's absolute path.
    pub(crate) fn sandbox_dir(&self, plan: &SandboxPlan) -> Result<PathBuf> {
        check_hostname(&plan.hostname)?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&plan.dir)
            .map_err(|e| Error::io(&plan.dir, e))?;
        let dir = absolute(&plan.dir)?;
        check_socket_paths(&dir)?;
        Ok(dir)
    }

    /// Asks the sandbox's VMM to shut down, then kills it if it is still there, and returns
    /// once it has ended. The pid is taken before the request: an exiting VMM loses its
    /// command line (which proves it ours) before it is gone.
    pub(crate) fn stop_vmm(&self, dir: &Path) {
        let vmm = files::our_vmm(dir);
        let control = VmmProcess::connect(&files::control(dir)).ok();
        match vmm {
            Some(pid) => end_vmm(dir, pid, control),
            None => {
                if let Some(p) = control {
                    let _ = p.shutdown();
                }
            }
        }
    }
}

/// Asks VMM `pid` to shut down through `control` (when given), kills it if it is still there
/// after [`EXIT_TIMEOUT`] and its command line still names `dir`'s control socket, and returns
/// once it has ended.
pub(crate) fn end_vmm(dir: &Path, pid: i32, control: Option<VmmProcess>) {
    if let Some(p) = control {
        let _ = p.shutdown();
    }
    let deadline = Instant::now() + EXIT_TIMEOUT;
    let mut killed = false;
    while files::running(pid) {
        if !killed && Instant::now() > deadline {
            if files::names_control(pid, dir) {
                // SAFETY: the pid is this sandbox's VMM (its command line names this
                // directory's control socket) and not a zombie.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            killed = true;
        } else if Instant::now() > deadline + EXIT_TIMEOUT {
            // Still there after SIGKILL: stuck in the kernel (e.g. on a slow disk); the
            // caller's own checks will name it.
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_name_that_would_add_kernel_parameters_is_refused_before_anything_starts() {
        let work = tempfile::tempdir().unwrap();
        let backend = MicrovmBackend::new(MicrovmConfig {
            vmm: "/nonexistent/branchbox-vmm".into(),
            kernel: "/nonexistent/vmlinux".into(),
            images_dir: work.path().into(),
            agent: "/nonexistent/agent".into(),
            agent_timeout: AGENT_TIMEOUT,
        });
        let dir = work.path().join("sandbox");
        for bad in ["a init=/bin/sh", "", &"a".repeat(MAX_HOSTNAME + 1), "a\nb"] {
            let plan = SandboxPlan {
                id: SandboxId::generate(),
                dir: dir.clone(),
                rootfs: work.path().join("img-0000000000000000/rootfs"),
                limits: branchbox_model::Limits::default(),
                hostname: bad.to_string(),
                network: None,
            };
            let e = backend.create(&plan).unwrap_err();
            assert!(
                matches!(&e, Error::InvalidInput(m) if m.contains("is not 1-64 letters")),
                "{bad:?}: {e:?}"
            );
            assert!(!dir.exists(), "nothing is created for a refused plan");
        }
        assert!(check_hostname("bb-0123abcd.test").is_ok());
    }

    #[test]
    fn locating_without_a_built_kernel_names_what_builds_it() {
        if std::env::var_os(KERNEL_ENV).is_some() {
            eprintln!("skipped: {KERNEL_ENV} names a kernel");
            return;
        }
        let images = tempfile::tempdir().unwrap();
        let e =
            MicrovmBackend::locate("branchbox-vmm".into(), images.path().into(), "agent".into()).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
        // Without Debian's kernel source the recipe itself cannot be named: that says how to
        // install it instead.
        assert!(text.contains("`branchbox guest kernel`") || text.contains("linux-source"), "{text}");
    }
}
