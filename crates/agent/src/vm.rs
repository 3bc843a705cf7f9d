//! The agent as PID 1 of a Linux microVM: the kernel starts it as `/sbin/init` (or `/init`)
//! from the root disk, and nothing else runs before it. It mounts the virtual file systems,
//! sets the hostname, brings up loopback, and serves the agent protocol on every AF_VSOCK
//! connection to port [`AGENT_VSOCK_PORT`]. Zombies are reaped by [`crate::reaper`], which
//! waits for any child, so orphans re-parented to PID 1 are collected too.
//!
//! Under gVisor the agent is PID 1 of its container as well, but started as
//! `/usr/local/bin/branchbox-agent` with its protocol on stdin/stdout: [`is_vm_init`] tells the
//! two apart by the name the kernel exec'd.
//!
//! A PID 1 that exits panics the kernel, so every fatal error here ends in [`power_off`]: end
//! the other processes, remount the root read-only, sync, then `reboot(RB_POWER_OFF)`.

use branchbox_protocol::AGENT_VSOCK_PORT;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// The hostname when the kernel command line gives none (`branchbox.hostname=`).
pub const DEFAULT_HOSTNAME: &str = "branchbox";

/// The environment commands get, as in the gVisor bundle: the kernel starts init with only
/// `HOME=/` and `TERM=linux`, and no `PATH`.
pub const VM_ENV: &[(&str, &str)] = &[
    ("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
    ("HOME", "/root"),
    ("LANG", "C.UTF-8"),
    ("PYTHONUNBUFFERED", "1"),
];

/// Open files a command may have, as in the gVisor bundle (the kernel's default is 1024).
const NOFILE: libc::rlim_t = 65536;

/// True when this process is the init of a Linux VM: PID 1, exec'd by the kernel as `init`.
pub fn is_vm_init(pid: u32, argv0: &str) -> bool {
    pid == 1 && Path::new(argv0).file_name().is_some_and(|n| n == "init")
}

/// One mount the agent makes at boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The `source` argument of mount(2).
    pub source: &'static str,
    /// Where (created when missing).
    pub target: &'static str,
    /// File system type.
    pub fstype: &'static str,
    /// `MS_*` flags.
    pub flags: libc::c_ulong,
    /// File-system-specific options.
    pub data: &'static str,
}

/// What PID 1 mounts, in order (a target below another one comes after it).
pub fn mount_plan() -> Vec<Mount> {
    let (nosuid, nodev, noexec) = (libc::MS_NOSUID, libc::MS_NODEV, libc::MS_NOEXEC);
    let m = |source, target, fstype, flags, data| Mount { source, target, fstype, flags, data };
    vec![
        m("proc", "/proc", "proc", nosuid | nodev | noexec, ""),
        m("sysfs", "/sys", "sysfs", nosuid | nodev | noexec, ""),
        m("devtmpfs", "/dev", "devtmpfs", nosuid, "mode=0755"),
        m("devpts", "/dev/pts", "devpts", nosuid | noexec, "gid=5,mode=0620,ptmxmode=0666"),
        m("tmpfs", "/dev/shm", "tmpfs", nosuid | nodev, "mode=1777"),
        m("tmpfs", "/tmp", "tmpfs", nosuid | nodev, "mode=1777"),
        m("tmpfs", "/run", "tmpfs", nosuid | nodev, "mode=0755"),
    ]
}

/// Whether `target` is a mount point according to `/proc/self/mounts` text (the kernel may
/// have mounted `/dev` itself, with `CONFIG_DEVTMPFS_MOUNT`).
pub fn is_mounted(mounts: &str, target: &str) -> bool {
    mounts.lines().any(|l| l.split_whitespace().nth(1) == Some(target))
}

/// The hostname the kernel command line asks for (`branchbox.hostname=NAME`), if it is a valid
/// host name (1-64 of letters, digits, `-` and `.`); a later occurrence wins.
pub fn hostname_from_cmdline(cmdline: &str) -> Option<String> {
    let name =
        cmdline.split_whitespace().filter_map(|w| w.strip_prefix("branchbox.hostname=")).next_back()?;
    let valid = (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    valid.then(|| name.to_string())
}

/// The resolver file for the name servers the kernel's `ip=` argument gave (`/proc/net/pnp`
/// lists them as `nameserver A.B.C.D`): a networked microVM's resolver is its gateway
/// (docs/network.md). `None` when the kernel configured no name server.
pub fn resolv_conf_from_pnp(pnp: &str) -> Option<String> {
    let servers: Vec<std::net::Ipv4Addr> = pnp
        .lines()
        .filter_map(|l| l.strip_prefix("nameserver "))
        .filter_map(|a| a.trim().parse().ok())
        .filter(|a: &std::net::Ipv4Addr| !a.is_unspecified())
        .take(3)
        .collect();
    (!servers.is_empty()).then(|| servers.iter().map(|a| format!("nameserver {a}\n")).collect())
}

/// The AF_VSOCK address the agent listens on: any CID, `port`.
pub fn vsock_addr(port: u32) -> libc::sockaddr_vm {
    // SAFETY: sockaddr_vm is plain data; all-zero is a valid value to fill in.
    let mut a: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    a.svm_family = libc::AF_VSOCK as libc::sa_family_t;
    a.svm_port = port;
    a.svm_cid = libc::VMADDR_CID_ANY;
    a
}

fn cstr(s: &str) -> std::io::Result<CString> {
    CString::new(s).map_err(std::io::Error::other)
}

fn do_mount(m: &Mount) -> std::io::Result<()> {
    std::fs::create_dir_all(m.target)?;
    let (source, target, fstype, data) = (cstr(m.source)?, cstr(m.target)?, cstr(m.fstype)?, cstr(m.data)?);
    // SAFETY: valid NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(source.as_ptr(), target.as_ptr(), fstype.as_ptr(), m.flags, data.as_ptr().cast())
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Makes the mounts of [`mount_plan`] that are not there yet. A failure is reported on the
/// console and the rest still happen: an agent without `/dev/shm` is better than none.
fn mount_all() {
    for m in mount_plan() {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        if is_mounted(&mounts, m.target) {
            continue;
        }
        if let Err(e) = do_mount(&m) {
            eprintln!("branchbox-agent: cannot mount {} on {}: {e}", m.fstype, m.target);
        }
    }
}

/// The kernel gives init `/dev/console` as fds 0-2 only when the root disk has that node; a
/// closed one would be taken by the first socket or file the agent opens, and a diagnostic
/// written there would corrupt it.
fn ensure_std_fds() {
    for fd in 0..3 {
        // SAFETY: F_GETFD on any number is harmless.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } != -1 {
            continue;
        }
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/console")
            .or_else(|_| std::fs::OpenOptions::new().read(true).write(true).open("/dev/null"));
        if let Ok(f) = opened {
            // SAFETY: duplicating a descriptor we own onto a closed standard one.
            unsafe { libc::dup2(f.as_raw_fd(), fd) };
        }
    }
}

fn set_hostname(name: &str) -> std::io::Result<()> {
    // SAFETY: pointer and length describe `name`'s bytes.
    if unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    crate::guest::write_etc_hostname(name)
}

/// Sets `IFF_UP` on `lo`; the kernel then gives it 127.0.0.1/8 itself.
fn loopback_up() -> std::io::Result<()> {
    // SAFETY: plain socket call; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a new descriptor we own.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain data.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: a valid ifreq for SIOCGIFFLAGS/SIOCSIFFLAGS on our socket.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Boot-time setup of the VM; every step reports its own failure and the rest go on. Called
/// before any thread starts (it sets environment variables).
pub fn boot() {
    // SAFETY: umask has no preconditions; init starts with the kernel's 0022, made explicit.
    unsafe { libc::umask(0o022) };
    for (k, v) in VM_ENV {
        std::env::set_var(k, v);
    }
    let limit = libc::rlimit { rlim_cur: NOFILE, rlim_max: NOFILE };
    // SAFETY: a valid rlimit; PID 1 runs as root and may raise its hard limit.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        eprintln!("branchbox-agent: cannot raise the open-file limit: {}", std::io::Error::last_os_error());
    }
    mount_all();
    ensure_std_fds();
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let name = hostname_from_cmdline(&cmdline).unwrap_or_else(|| DEFAULT_HOSTNAME.to_string());
    if let Err(e) = set_hostname(&name) {
        eprintln!("branchbox-agent: cannot set the hostname {name:?}: {e}");
    }
    if let Err(e) = loopback_up() {
        eprintln!("branchbox-agent: cannot bring up loopback: {e}");
    }
    let pnp = std::fs::read_to_string("/proc/net/pnp").unwrap_or_default();
    if let Some(resolv) = resolv_conf_from_pnp(&pnp) {
        // A symlink in the image (systemd-resolved's) would send the write elsewhere.
        let _ = std::fs::remove_file("/etc/resolv.conf");
        if let Err(e) = std::fs::write("/etc/resolv.conf", resolv) {
            eprintln!("branchbox-agent: cannot write /etc/resolv.conf: {e}");
        }
    }
    // A panic in PID 1 would panic the kernel with no word of why: say it, then power off.
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        power_off("the agent panicked");
    }));
}

/// A listening AF_VSOCK stream socket on `port`, any CID.
pub fn listen(port: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: plain socket call; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a new descriptor we own.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let addr = vsock_addr(port);
    let len = std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;
    // SAFETY: addr is a valid sockaddr_vm of `len` bytes.
    if unsafe { libc::bind(sock.as_raw_fd(), (&addr as *const libc::sockaddr_vm).cast(), len) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: listening on our bound socket.
    if unsafe { libc::listen(sock.as_raw_fd(), 16) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(sock)
}

/// Accepts connections on `listener` forever, serving each on its own thread with `serve`.
pub fn accept_loop(listener: &OwnedFd, serve: impl Fn(std::fs::File) + Send + Sync + Clone + 'static) -> ! {
    loop {
        // SAFETY: accept on our listening socket; peer address not wanted.
        let fd = unsafe {
            libc::accept4(
                listener.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            // Per-connection failures (the peer reset before accept, a signal): keep serving.
            if matches!(e.raw_os_error(), Some(libc::EINTR | libc::ECONNABORTED | libc::EPROTO)) {
                continue;
            }
            power_off(&format!("accepting vsock connections failed: {e}"));
        }
        // SAFETY: a new connected socket we own; a File gives it Read and Write.
        let conn = unsafe { std::fs::File::from_raw_fd(fd) };
        let serve = serve.clone();
        std::thread::spawn(move || serve(conn));
    }
}

/// Serves the agent protocol on vsock port [`AGENT_VSOCK_PORT`]; never returns.
pub fn run(serve: impl Fn(std::fs::File) + Send + Sync + Clone + 'static) -> ! {
    match listen(AGENT_VSOCK_PORT) {
        Ok(l) => {
            eprintln!("branchbox-agent: listening on vsock port {AGENT_VSOCK_PORT}");
            accept_loop(&l, serve)
        }
        Err(e) => power_off(&format!(
            "cannot listen on vsock port {AGENT_VSOCK_PORT} ({e}); does the VM have a virtio-vsock device?"
        )),
    }
}

/// How long processes get to exit on SIGTERM before they are killed, at a shutdown.
const TERM_GRACE: std::time::Duration = std::time::Duration::from_millis(300);
/// How often the root is tried read-only while killed processes still close their files.
const REMOUNT_TRIES: u32 = 20;

/// Ends every other process, remounts the root read-only (so the journal is closed and the
/// next mount needs no recovery), syncs and powers the VM off (`reboot` restarts it instead).
/// Returns only on failure.
pub fn shutdown(reboot: bool) -> std::io::Error {
    // SAFETY: kill(-1) signals every process but PID 1 (us); sync has no preconditions.
    unsafe {
        libc::kill(-1, libc::SIGTERM);
        std::thread::sleep(TERM_GRACE);
        libc::kill(-1, libc::SIGKILL);
        libc::sync();
    }
    if let Err(e) = remount_root_read_only() {
        // The disk is synced anyway; the next mount replays the journal.
        eprintln!(
            "branchbox-agent: / stays read-write at shutdown ({e}); the next boot recovers its journal"
        );
    }
    let cmd = if reboot { libc::RB_AUTOBOOT } else { libc::RB_POWER_OFF };
    // SAFETY: reboot(2) with a valid command; only returns on failure.
    unsafe { libc::reboot(cmd) };
    std::io::Error::last_os_error()
}

/// Remounts `/` read-only, retrying while processes just killed still hold files open for
/// writing (EBUSY).
fn remount_root_read_only() -> std::io::Result<()> {
    let root = c"/";
    let mut last = std::io::Error::from_raw_os_error(libc::EBUSY);
    for _ in 0..REMOUNT_TRIES {
        let flags = libc::MS_REMOUNT | libc::MS_RDONLY;
        // SAFETY: a remount of "/" with no source, type or data.
        let r = unsafe {
            libc::mount(std::ptr::null(), root.as_ptr(), std::ptr::null(), flags, std::ptr::null())
        };
        if r == 0 {
            return Ok(());
        }
        last = std::io::Error::last_os_error();
        if last.raw_os_error() != Some(libc::EBUSY) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Err(last)
}

/// Reports `why` on the console and powers off; if even that fails, waits forever (PID 1
/// must not exit).
pub fn power_off(why: &str) -> ! {
    eprintln!("branchbox-agent: {why}; powering off");
    let e = shutdown(false);
    eprintln!("branchbox-agent: power-off failed: {e}");
    loop {
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_kernel_started_init_is_a_vm_init() {
        assert!(is_vm_init(1, "/sbin/init"));
        assert!(is_vm_init(1, "/init"));
        assert!(is_vm_init(1, "init"));
        // gVisor starts the agent by its own path, as PID 1 of the container.
        assert!(!is_vm_init(1, "/usr/local/bin/branchbox-agent"));
        assert!(!is_vm_init(7, "/sbin/init"));
        assert!(!is_vm_init(1, "/sbin/initx"));
    }

    #[test]
    fn the_mount_plan_mounts_parents_first_and_covers_the_virtual_file_systems() {
        let plan = mount_plan();
        let targets: Vec<&str> = plan.iter().map(|m| m.target).collect();
        for t in ["/proc", "/sys", "/dev", "/dev/pts", "/tmp", "/run"] {
            assert!(targets.contains(&t), "{t} missing from {targets:?}");
        }
        for (i, m) in plan.iter().enumerate() {
            for earlier in &plan[i + 1..] {
                assert!(
                    !m.target.starts_with(&format!("{}/", earlier.target)),
                    "{} before its parent",
                    m.target
                );
            }
        }
        assert_eq!(plan.iter().find(|m| m.target == "/dev").map(|m| m.fstype), Some("devtmpfs"));
        assert!(plan.iter().all(|m| m.flags & libc::MS_NOSUID != 0));
    }

    #[test]
    fn mount_points_are_read_from_proc_mounts() {
        let mounts =
            "/dev/root / ext4 rw 0 0\ndevtmpfs /dev devtmpfs rw,nosuid 0 0\nproc /proc proc rw 0 0\n";
        assert!(is_mounted(mounts, "/dev"));
        assert!(is_mounted(mounts, "/"));
        assert!(!is_mounted(mounts, "/dev/pts"));
        assert!(!is_mounted(mounts, "/sys"));
        assert!(!is_mounted("", "/proc"));
    }

    #[test]
    fn the_hostname_comes_from_the_command_line_when_valid() {
        let c = "root=/dev/vda rw console=ttyS0 branchbox.hostname=bb-1234 init=/sbin/init";
        assert_eq!(hostname_from_cmdline(c), Some("bb-1234".into()));
        assert_eq!(hostname_from_cmdline("branchbox.hostname=a branchbox.hostname=b"), Some("b".into()));
        assert_eq!(hostname_from_cmdline("root=/dev/vda"), None);
        assert_eq!(hostname_from_cmdline("branchbox.hostname="), None);
        assert_eq!(hostname_from_cmdline("branchbox.hostname=a/b"), None);
        assert_eq!(hostname_from_cmdline(&format!("branchbox.hostname={}", "a".repeat(65))), None);
    }

    #[test]
    fn the_kernels_name_servers_become_the_resolver_file() {
        let pnp = "#MANUAL\nnameserver 10.200.0.1\nnameserver 0.0.0.0\n";
        assert_eq!(resolv_conf_from_pnp(pnp).as_deref(), Some("nameserver 10.200.0.1\n"));
        assert_eq!(resolv_conf_from_pnp("#MANUAL\n"), None);
        assert_eq!(resolv_conf_from_pnp("nameserver 10.0.0.1; rm -rf /\n"), None);
        assert_eq!(resolv_conf_from_pnp(""), None);
    }

    #[test]
    fn commands_get_a_path_that_finds_the_image_programs() {
        let path = VM_ENV.iter().find(|(k, _)| *k == "PATH").map(|(_, v)| *v).unwrap();
        for dir in ["/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin"] {
            assert!(path.split(':').any(|p| p == dir), "{dir} not in {path}");
        }
    }

    #[test]
    fn the_vsock_address_is_any_cid_on_the_agent_port() {
        let a = vsock_addr(AGENT_VSOCK_PORT);
        assert_eq!(a.svm_family, libc::AF_VSOCK as libc::sa_family_t);
        assert_eq!(a.svm_port, 1024);
        assert_eq!(a.svm_cid, libc::VMADDR_CID_ANY);
    }
}
