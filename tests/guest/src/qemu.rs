//! Boots the project's guest kernel and root disk under QEMU (software emulation, q35,
//! virtio-pci) with its block, vsock and rng devices served by OUR vhost-user servers, running
//! in this test process so the test can read their counters.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use branchbox_disk::{BlockBackend, OverlayBackend, SECTOR_SIZE};
use branchbox_protocol::client::AgentClient;
use branchbox_protocol::message::{Command as AgentCommand, ExecSpec};
use branchbox_vhost::{Backend, Counters, ServeError, ServedDevice, VhostServer};
use branchbox_virtio::blk::Block;
use branchbox_virtio::rng::Rng;
use branchbox_virtio::vsock::Vsock;

use crate::artifacts::GuestFiles;

/// The agent's vsock port in the guest (crates/protocol's `AGENT_VSOCK_PORT`).
pub const AGENT_PORT: u32 = 1024;
/// The guest's vsock context id (the vsock device's config space tells the guest).
pub const GUEST_CID: u64 = 3;
/// How long a boot under software emulation may take to the agent's first answer, on a
/// loaded 2-core machine; a healthy boot takes a few seconds.
const BOOT_DEADLINE: Duration = Duration::from_secs(120);

/// One QEMU at a time: the host has 2 cores, and emulated guests racing each other would only
/// make every boot slower.
pub fn one_guest_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// The disk the guest boots from: the cached root filesystem, opened read-only by our block
/// device, and the overlay that takes every guest write.
#[derive(Clone)]
pub struct Disk {
    /// The cached rootfs.ext4 (never written).
    pub base: PathBuf,
    /// The test's overlay.
    pub overlay: PathBuf,
}

impl Disk {
    /// Writes the disk as the guest sees it (base with the overlay's clusters on top) into one
    /// plain file, through the block device's own backend, for e2fsck.
    pub fn flatten(&self, out: &Path) -> PathBuf {
        let mut disk = OverlayBackend::open(&self.base, &self.overlay).expect("open the disk to flatten it");
        let mut file = File::create(out).expect("create the flat image");
        let chunk_sectors = (1 << 20) / SECTOR_SIZE;
        let mut buf = vec![0u8; (chunk_sectors * SECTOR_SIZE) as usize];
        let mut sector = 0;
        while sector < disk.sectors() {
            let n = chunk_sectors.min(disk.sectors() - sector);
            let part = &mut buf[..(n * SECTOR_SIZE) as usize];
            disk.read(sector, part).expect("read the disk");
            // Holes stay holes: the root disk is mostly free space.
            if part.iter().all(|&b| b == 0) {
                file.seek(SeekFrom::Current(part.len() as i64)).expect("seek in the flat image");
            } else {
                file.write_all(part).expect("write the flat image");
            }
            sector += n;
        }
        file.set_len(disk.sectors() * SECTOR_SIZE).expect("size the flat image");
        out.to_owned()
    }
}

/// The vhost-user servers of one boot.
pub struct Devices {
    /// Socket paths QEMU connects to.
    blk_socket: PathBuf,
    vsock_socket: PathBuf,
    rng_socket: PathBuf,
    /// The vsock device's host side: where the test reaches the guest's agent.
    pub vsock_host_socket: PathBuf,
    /// Counters of the block server.
    pub blk: Arc<Counters>,
    /// Counters of the vsock server.
    pub vsock: Arc<Counters>,
    /// Counters of the rng server.
    pub rng: Arc<Counters>,
    sessions: Vec<(&'static str, JoinHandle<Result<(), ServeError>>)>,
}

fn start<D: ServedDevice>(socket: &Path, device: D) -> (Arc<Counters>, JoinHandle<Result<(), ServeError>>) {
    let mut server = VhostServer::bind(socket).expect("bind a vhost-user socket");
    let backend = Backend::new(device);
    let counters = backend.counters();
    let session = std::thread::spawn(move || server.serve(backend));
    (counters, session)
}

impl Devices {
    /// Binds and serves blk (over `disk`), vsock and rng in `dir`, one session each.
    pub fn start(dir: &Path, disk: &Disk) -> Devices {
        let backend = OverlayBackend::open(&disk.base, &disk.overlay).expect("open the guest disk");
        Devices::with_disk(dir, Box::new(backend))
    }

    /// Binds and serves blk (over `disk`, any block backend: overlay or layered), vsock and
    /// rng in `dir`, one session each. The backend is dropped when its session ends.
    pub fn with_disk(dir: &Path, disk: Box<dyn BlockBackend>) -> Devices {
        let blk_socket = dir.join("blk.sock");
        let rng_socket = dir.join("rng.sock");
        let vsock_socket = dir.join("vsock.sock");
        let vsock_host_socket = dir.join("vsock.host");
        let (blk, blk_session) = start(&blk_socket, Block::new(disk, "branchbox-root"));
        let vsock_device = Vsock::new(GUEST_CID, &vsock_host_socket).expect("the vsock device's host socket");
        let (vsock, vsock_session) = start(&vsock_socket, vsock_device);
        let (rng, rng_session) = start(&rng_socket, Rng::new());
        Devices {
            blk_socket,
            vsock_socket,
            rng_socket,
            vsock_host_socket,
            blk,
            vsock,
            rng,
            sessions: vec![("blk", blk_session), ("vsock", vsock_session), ("rng", rng_session)],
        }
    }

    /// Waits for every session to end (QEMU has exited) and checks each ended cleanly.
    pub fn finish(self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        for (name, session) in self.sessions {
            while !session.is_finished() {
                assert!(
                    Instant::now() < deadline,
                    "the {name} vhost-user session did not end after QEMU exited"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            match session.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => panic!("the {name} vhost-user session failed: {e}"),
                Err(_) => panic!("the {name} vhost-user session panicked"),
            }
        }
    }
}

/// A running QEMU.
pub struct Qemu {
    child: Child,
    console: PathBuf,
    /// When QEMU was started.
    pub started: Instant,
}

impl Qemu {
    /// Boots `files.bzimage` with our devices; the serial console goes to `console`.
    pub fn boot(files: &GuestFiles, devices: &Devices, console: &Path) -> Qemu {
        Qemu::start(files, devices, console, None)
    }

    /// [`Qemu::boot`] plus a virtio-net device served by our vhost-user server at
    /// `net_socket`, with the MAC every guest has and the kernel's `ip=` address.
    pub fn boot_networked(files: &GuestFiles, devices: &Devices, net_socket: &Path, console: &Path) -> Qemu {
        Qemu::start(files, devices, console, Some(net_socket))
    }

    fn start(files: &GuestFiles, devices: &Devices, console: &Path, net: Option<&Path>) -> Qemu {
        let chardev = |id: &str, path: &Path| format!("socket,id={id},path={}", path.display());
        // panic=-1 with -no-reboot: a guest that panics ends QEMU instead of hanging the test.
        let mut append = String::from("root=/dev/vda rw console=ttyS0 init=/sbin/init panic=-1");
        let mut cmd = Command::new("qemu-system-x86_64");
        if let Some(socket) = net {
            append.push(' ');
            append.push_str(&branchbox_net::guest_ip_arg());
            cmd.args(["-chardev", &chardev("net", socket)])
                .args(["-netdev", "vhost-user,id=net0,chardev=net"])
                .args(["-device", &format!("virtio-net-pci,netdev=net0,mac={}", branchbox_net::GUEST_MAC)]);
        }
        cmd.args(["-M", "q35,accel=tcg,memory-backend=mem", "-cpu", "max", "-smp", "1", "-m", "512M"])
            .args(["-object", "memory-backend-memfd,id=mem,size=512M,share=on"])
            .arg("-kernel")
            .arg(&files.bzimage)
            .args(["-append", &append, "-no-reboot"])
            .args(["-nodefaults", "-no-user-config", "-display", "none", "-monitor", "none"])
            .arg("-serial")
            .arg(format!("file:{}", console.display()))
            .args(["-chardev", &chardev("blk", &devices.blk_socket)])
            .args(["-device", "vhost-user-blk-pci,chardev=blk,num-queues=1"])
            .args(["-chardev", &chardev("vsock", &devices.vsock_socket)])
            .args(["-device", "vhost-user-vsock-pci,chardev=vsock"])
            .args(["-chardev", &chardev("rng", &devices.rng_socket)])
            .args(["-device", "vhost-user-rng-pci,chardev=rng"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!("cannot start qemu-system-x86_64 ({e}); install it: apt-get install -y qemu-system-x86 (scripts/setup.sh --test)")
        });
        Qemu { child, console: console.to_owned(), started: Instant::now() }
    }

    /// The guest's serial console so far.
    pub fn console(&self) -> String {
        std::fs::read_to_string(&self.console).unwrap_or_default()
    }

    /// Panics with `what`, the end of the console and QEMU's stderr.
    pub fn fail(&mut self, what: &str) -> ! {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut stderr = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut stderr);
        }
        let console = self.console();
        let tail: String = console.chars().rev().take(4000).collect::<Vec<_>>().into_iter().rev().collect();
        panic!("{what}\n--- qemu stderr ---\n{stderr}\n--- guest console (end) ---\n{tail}");
    }

    /// Waits for QEMU to exit by itself (the guest powered off); panics after `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return status,
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                _ => self.fail(&format!("QEMU did not exit within {limit:?} of the guest's power-off")),
            }
        }
    }

    /// Power cut: SIGKILL, nothing flushed by QEMU or the guest.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `line` with `/bin/sh -c` in the guest; panics unless it exits 0. Returns stdout.
pub fn sh(agent: &mut AgentClient<UnixStream>, line: &str) -> String {
    let out = agent.exec(ExecSpec::new(AgentCommand::Shell(line.to_string())), None).expect("agent exec");
    assert_eq!(
        out.status.code,
        Some(0),
        "guest command {line:?} failed: {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until `cond` holds, or panics with `what` after `limit`.
pub fn wait_for(qemu: &mut Qemu, limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        if Instant::now() > deadline {
            qemu.fail(&format!("timed out after {limit:?} waiting for {what}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Longest `OK <port>` line the host side may send; anything longer is not our protocol.
const MAX_REPLY_LINE: usize = 64;

/// One attempt to reach the guest's `port` through the vsock device's host socket:
/// `CONNECT <port>\n`, then `OK <host port>\n`. Returns the stream, now the guest connection.
fn connect_vsock(host_socket: &Path, port: u32) -> std::io::Result<UnixStream> {
    let mut stream = UnixStream::connect(host_socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(format!("CONNECT {port}\n").as_bytes())?;
    // Byte by byte: what follows the line is the agent's stream, not ours to consume.
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.len() < MAX_REPLY_LINE {
        if stream.read(&mut byte)? == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "closed before OK"));
        }
        if byte[0] == b'\n' {
            let text = String::from_utf8_lossy(&line);
            if text.strip_prefix("OK ").is_some_and(|p| p.parse::<u32>().is_ok()) {
                stream.set_read_timeout(None)?;
                return Ok(stream);
            }
            return Err(std::io::Error::other(format!("host side answered {text:?}")));
        }
        line.push(byte[0]);
    }
    Err(std::io::Error::other("reply line too long"))
}

/// Connects to the agent (PID 1 in the guest) through our vsock back end, retrying while the
/// guest boots, and completes the protocol handshake. Returns the client and the time from
/// QEMU's start to the agent's first answer.
pub fn agent(qemu: &mut Qemu, host_socket: &Path) -> (AgentClient<UnixStream>, Duration) {
    let deadline = qemu.started + BOOT_DEADLINE;
    loop {
        let last = match connect_vsock(host_socket, AGENT_PORT) {
            Ok(stream) => {
                let mut client = AgentClient::new(stream);
                match client.hello() {
                    Ok(()) => return (client, qemu.started.elapsed()),
                    Err(e) => format!("hello failed: {e}"),
                }
            }
            Err(e) => e.to_string(),
        };
        if Instant::now() > deadline {
            qemu.fail(&format!(
                "the agent did not answer over our vsock back end within {BOOT_DEADLINE:?}: {last}"
            ));
        }
        if let Ok(Some(status)) = qemu.child.try_wait() {
            qemu.fail(&format!("QEMU exited ({status}) before the agent answered: {last}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
