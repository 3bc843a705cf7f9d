//! A stand-in for `sudo`. Under gVisor every process runs with `no_new_privs`, so a setuid
//! `sudo` never gains root and refuses to run; E2B's images give their `user` passwordless sudo,
//! and code written for them relies on it. So the agent links `/usr/local/bin/sudo` (ahead of
//! `/usr/bin` in `PATH`) to its own binary: run as `sudo`, it parses sudo's usual options, hands
//! its standard streams, directory and command over a Unix socket to the agent (root), and
//! exits with the command's status. The kernel attaches the sender's own credentials to the
//! request (`SCM_CREDENTIALS`; it refuses forged ones), and the agent runs the command as root
//! only for root or an account that the image's root-owned sudoers files give
//! `NAME ALL=(ALL:ALL) NOPASSWD: ALL`, exactly as passwordless sudo would; the command is
//! confined and watched like every command the agent starts, and killed when its `sudo` goes
//! away. Where the agent itself runs with `no_new_privs` (so every process of the sandbox does),
//! a setuid program at `/usr/bin/sudo` can never work, so that path is made a link to the
//! stand-in too: scripts that call `/usr/bin/sudo` by its full path reach it as well.

use crate::reaper::Reaper;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Where the agent listens.
pub const SOCKET: &str = "/run/branchbox/sudo.sock";
/// Where the stand-in is linked.
const STAND_IN: &str = "/usr/local/bin/sudo";
/// Where images install sudo itself, replaced by the stand-in where it cannot work.
const SYSTEM_SUDO: &str = "/usr/bin/sudo";
/// Largest request (command line, directory and environment).
const MAX_REQUEST: usize = 256 * 1024;
/// Commands run through the stand-in at once, at most.
const MAX_AT_ONCE: usize = 64;
/// How long a request may take to arrive.
const REQUEST_TIME: std::time::Duration = std::time::Duration::from_secs(10);
/// `PATH` of a command run as root (sudo's usual `secure_path`).
const SECURE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// True when the binary was started as `sudo` (through the stand-in's link).
pub fn invoked_as_sudo(argv0: &str) -> bool {
    std::path::Path::new(argv0).file_name().is_some_and(|n| n == "sudo")
}

// ---- the stand-in (runs as the caller) ----

/// What the stand-in asks for.
#[derive(Debug, PartialEq, Eq)]
struct Ask {
    argv: Vec<String>,
    keep_env: bool,
}

/// Parses sudo's options: `-n`, `-E`, `-H`, `-S`, `-k`, `-u root` and `--` are taken (the
/// stand-in never asks for a password and runs only as root); others are refused by name.
fn parse(args: &[String]) -> Result<Ask, String> {
    let mut keep_env = false;
    let mut it = args.iter().peekable();
    while let Some(a) = it.peek() {
        let a = a.as_str();
        if a == "--" {
            it.next();
            break;
        }
        if !a.starts_with('-') || a == "-" {
            break;
        }
        it.next();
        let user = if a == "-u" || a == "--user" {
            Some(it.next().ok_or("option -u needs a user")?.clone())
        } else {
            a.strip_prefix("--user=").map(str::to_string)
        };
        if let Some(u) = user {
            if !matches!(u.as_str(), "root" | "#0" | "0") {
                return Err(format!("only root is served (-u {u}); use the account's own commands"));
            }
            continue;
        }
        match a {
            "-n" | "--non-interactive" | "-H" | "--set-home" | "-S" | "--stdin" | "-k"
            | "--reset-timestamp" => {}
            "-E" | "--preserve-env" => keep_env = true,
            other => return Err(format!("option {other} is not served by branchbox's sudo stand-in")),
        }
    }
    let argv: Vec<String> = it.cloned().collect();
    if argv.is_empty() {
        return Err("usage: sudo [-nEHS] [-u root] [--] command [args...]".into());
    }
    Ok(Ask { argv, keep_env })
}

/// Room for the control messages of a request: three descriptors and the sender's credentials.
fn control_space() -> usize {
    // SAFETY: CMSG_SPACE is a pure computation.
    unsafe {
        (libc::CMSG_SPACE(3 * std::mem::size_of::<RawFd>() as u32)
            + libc::CMSG_SPACE(std::mem::size_of::<libc::ucred>() as u32)) as usize
    }
}

/// Sends `data` with the caller's standard streams and its credentials attached (the kernel
/// refuses credentials that are not the sender's own).
fn send_with_fds(sock: &UnixStream, data: &[u8]) -> std::io::Result<()> {
    let fds: [RawFd; 3] = [0, 1, 2];
    // SAFETY: plain getters.
    let cred = unsafe { libc::ucred { pid: libc::getpid(), uid: libc::getuid(), gid: libc::getgid() } };
    let space = control_space();
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut _, iov_len: data.len() };
    // SAFETY: msghdr is plain data; the pointers below stay valid for the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer holds a header for three fds and one for the credentials, as
    // sized by `control_space`.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(&fds) as u32) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast::<RawFd>(), fds.len());
        let c = libc::CMSG_NXTHDR(&msg, c);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_CREDENTIALS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::ucred>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<libc::ucred>(), cred);
    }
    // SAFETY: a connected socket and a message whose buffers outlive the call.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    (&*sock).write_all(&data[n as usize..])
}

/// Runs as `sudo`: asks the agent, relays the command's status. Never returns.
pub fn client(args: Vec<String>) -> ! {
    let fail = |why: String| -> ! {
        eprintln!("sudo: {why}");
        std::process::exit(1)
    };
    let ask = parse(&args).unwrap_or_else(|e| fail(e));
    let cwd =
        std::env::current_dir().map(|p| p.to_string_lossy().into_owned()).unwrap_or_else(|_| "/".into());
    let env: BTreeMap<String, String> = if ask.keep_env {
        std::env::vars().collect()
    } else {
        std::env::vars().filter(|(k, _)| k == "TERM").collect()
    };
    let body = json!({"argv": ask.argv, "cwd": cwd, "env": env, "keep_env": ask.keep_env}).to_string();
    let mut data = (body.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(body.as_bytes());
    if data.len() > MAX_REQUEST {
        fail(format!("the command and its environment pass {MAX_REQUEST} bytes"));
    }
    let sock = UnixStream::connect(SOCKET)
        .unwrap_or_else(|e| fail(format!("cannot reach the sandbox's agent at {SOCKET}: {e}")));
    send_with_fds(&sock, &data).unwrap_or_else(|e| fail(format!("cannot ask the sandbox's agent: {e}")));
    let mut answer = String::new();
    if let Err(e) = (&sock).take(64 * 1024).read_to_string(&mut answer) {
        fail(format!("lost the sandbox's agent: {e}"));
    }
    let v: Value = serde_json::from_str(&answer).unwrap_or(Value::Null);
    match (v.get("code").and_then(Value::as_i64), v.get("error").and_then(Value::as_str)) {
        (Some(code), _) => std::process::exit(code as i32),
        (None, Some(why)) => fail(why.to_string()),
        _ => fail("the sandbox's agent gave no answer".into()),
    }
}

// ---- the agent's side (root) ----

/// Links the stand-in (when the image has no file there) and serves it on a thread.
pub fn serve(reaper: Arc<Reaper>) {
    if let Err(e) = install() {
        return eprintln!("branchbox-agent: no sudo stand-in ({e})");
    }
    let _ = std::fs::remove_file(SOCKET);
    let listener = match UnixListener::bind(SOCKET) {
        Ok(l) => l,
        Err(e) => return eprintln!("branchbox-agent: cannot listen at {SOCKET} ({e}); sudo will not work"),
    };
    // Anyone may ask; who may run as root is decided per connection.
    let _ = std::fs::set_permissions(SOCKET, std::fs::Permissions::from_mode(0o666));
    let busy = Arc::new(AtomicUsize::new(0));
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let (reaper, busy) = (reaper.clone(), busy.clone());
            if busy.fetch_add(1, Ordering::SeqCst) >= MAX_AT_ONCE {
                busy.fetch_sub(1, Ordering::SeqCst);
                reply(&conn, json!({"error": format!("more than {MAX_AT_ONCE} sudo commands at once")}));
                continue;
            }
            std::thread::spawn(move || {
                let answer = match handle(&conn, &reaper) {
                    Ok(code) => json!({ "code": code }),
                    Err(why) => json!({ "error": why }),
                };
                reply(&conn, answer);
                busy.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
}

fn install() -> std::io::Result<()> {
    std::fs::create_dir_all("/run/branchbox")?;
    let me = std::env::current_exe()?;
    if no_new_privs() {
        if let Err(e) = take_over(std::path::Path::new(SYSTEM_SUDO), &me) {
            eprintln!(
                "branchbox-agent: {SYSTEM_SUDO} stays the image's ({e}); sudo by that path will not work"
            );
        }
    }
    if std::fs::symlink_metadata(STAND_IN).is_ok() {
        return Ok(());
    }
    std::os::unix::fs::symlink(me, STAND_IN)
}

/// Whether this process runs with `no_new_privs`, which it passes to every process it starts
/// (gVisor sets it on every process of a sandbox, whatever the OCI spec says).
fn no_new_privs() -> bool {
    // SAFETY: a getter without pointers.
    unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1 }
}

/// Replaces the setuid program at `path` (followed through links: sudo, or sudo-rs behind a
/// link) with a link to the stand-in `me`, in one rename, and answers whether it did. Under
/// `no_new_privs` a setuid program never changes ids, so nothing that worked is lost; anything
/// else there (no file, a script the image put there) is left as it is.
fn take_over(path: &std::path::Path, me: &std::path::Path) -> std::io::Result<bool> {
    match std::fs::metadata(path) {
        Ok(md) if md.is_file() && md.mode() & 0o4000 != 0 => {}
        _ => return Ok(false),
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let link = path.with_file_name(format!(".{name}.branchbox-{}", std::process::id()));
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(me, &link)?;
    std::fs::rename(&link, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&link);
    })?;
    Ok(true)
}

/// Answers and ends the connection (a watcher's clone of it included).
fn reply(conn: &UnixStream, v: Value) {
    let _ = (&*conn).write_all(v.to_string().as_bytes());
    let _ = conn.shutdown(std::net::Shutdown::Both);
}

/// Asks the kernel to attach each sender's credentials to what it sends (`SO_PEERCRED` is no
/// use here: under gVisor it names the listener's creator, not the peer).
fn pass_credentials(conn: &UnixStream) -> Result<(), String> {
    let on: libc::c_int = 1;
    // SAFETY: a connected socket and an int option.
    let rc = unsafe {
        libc::setsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(format!("cannot learn who asks: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Whether the image's sudoers give `name` passwordless root for every command: a line
/// `NAME ALL=(ALL:ALL) NOPASSWD: ALL` (or `(ALL)`) in `/etc/sudoers` or
/// `/etc/sudoers.d/NAME`, a file root owns and only root may write, as sudo itself requires.
fn may_sudo(name: &str) -> bool {
    let wanted = [format!("{name}ALL=(ALL:ALL)NOPASSWD:ALL"), format!("{name}ALL=(ALL)NOPASSWD:ALL")];
    ["/etc/sudoers".to_string(), format!("/etc/sudoers.d/{name}")].iter().any(|path| {
        let Ok(md) = std::fs::symlink_metadata(path) else { return false };
        if !md.is_file() || md.uid() != 0 || md.mode() & 0o022 != 0 || md.len() > 1 << 20 {
            return false;
        }
        std::fs::read_to_string(path).is_ok_and(|text| {
            text.lines().any(|l| {
                let squeezed: String = l.chars().filter(|c| !c.is_whitespace()).collect();
                wanted.contains(&squeezed)
            })
        })
    })
}

/// Receives a request, its three streams and the uid of the process that sent it.
fn receive(conn: &UnixStream) -> Result<(Value, [OwnedFd; 3], u32), String> {
    pass_credentials(conn)?;
    // A client that connects and sends nothing holds its place only this long.
    conn.set_read_timeout(Some(REQUEST_TIME)).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 64 * 1024];
    let space = control_space();
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: msghdr is plain data; its buffers outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: a connected socket; received descriptors are close-on-exec.
    let n = unsafe { libc::recvmsg(conn.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n <= 0 {
        return Err("the request did not arrive".into());
    }
    let mut got: Vec<OwnedFd> = Vec::new();
    let mut uid = None;
    // SAFETY: walking the control messages the kernel wrote into `control`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let count =
                    ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                for i in 0..count {
                    got.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            } else if (*c).cmsg_level == libc::SOL_SOCKET
                && (*c).cmsg_type == libc::SCM_CREDENTIALS
                && (*c).cmsg_len as usize
                    >= libc::CMSG_LEN(std::mem::size_of::<libc::ucred>() as u32) as usize
            {
                uid = Some(std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::ucred>()).uid);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 || got.len() != 3 {
        return Err("send exactly the three standard streams".into());
    }
    let uid = uid.ok_or("the request came without the sender's credentials")?;
    let mut data = buf[..n as usize].to_vec();
    if data.len() < 4 {
        let mut more = [0u8; 4];
        let need = 4 - data.len();
        (&*conn).read_exact(&mut more[..need]).map_err(|e| format!("a short request: {e}"))?;
        data.extend_from_slice(&more[..need]);
    }
    let len = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) as usize;
    if len > MAX_REQUEST {
        return Err(format!("the request passes {MAX_REQUEST} bytes"));
    }
    let mut body = data[4..].to_vec();
    if body.len() > len {
        return Err("the request is longer than it said".into());
    }
    let missing = len - body.len();
    let mut rest = vec![0u8; missing];
    (&*conn).read_exact(&mut rest).map_err(|e| format!("a short request: {e}"))?;
    body.extend_from_slice(&rest);
    let v: Value = serde_json::from_slice(&body).map_err(|e| format!("the request does not parse: {e}"))?;
    conn.set_read_timeout(None).map_err(|e| e.to_string())?;
    let [a, b, c]: [OwnedFd; 3] = got.try_into().map_err(|_| "three streams")?;
    Ok((v, [a, b, c], uid))
}

/// Serves one request: the command's status as a shell reports it (128 + signal when killed).
fn handle(conn: &UnixStream, reaper: &Reaper) -> Result<i32, String> {
    // The streams are dropped (closed) unused when the sender may not run as root.
    let (req, [stdin, stdout, stderr], uid) = receive(conn)?;
    let names = crate::account::Names::read();
    let name = names.user(uid);
    if uid != 0 && !may_sudo(&name) {
        return Err(format!(
            "{name} may not run commands as root here: branchbox's sudo stand-in serves root and accounts \
             whose root-owned /etc/sudoers.d/{name} (or /etc/sudoers) says `{name} ALL=(ALL:ALL) NOPASSWD: ALL`"
        ));
    }
    let argv: Vec<String> = req
        .get("argv")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
        .filter(|a: &Vec<String>| !a.is_empty())
        .ok_or("the request names no command")?;
    let cwd = req.get("cwd").and_then(Value::as_str).filter(|d| d.starts_with('/')).unwrap_or("/");
    let keep_env = req.get("keep_env").and_then(Value::as_bool).unwrap_or(false);
    let given: BTreeMap<String, String> = req
        .get("env")
        .and_then(Value::as_object)
        .map(|m| m.iter().filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string()))).collect())
        .unwrap_or_default();
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).env_clear();
    if keep_env {
        cmd.envs(&given);
    } else if let Some(term) = given.get("TERM") {
        cmd.env("TERM", term);
    }
    if !keep_env || !given.contains_key("PATH") {
        cmd.env("PATH", SECURE_PATH);
    }
    let gid = crate::account::lookup(&name).map(|a| a.gid).unwrap_or(uid);
    cmd.envs([
        ("HOME", "/root".to_string()),
        ("USER", "root".into()),
        ("LOGNAME", "root".into()),
        ("SUDO_USER", name.clone()),
        ("SUDO_UID", uid.to_string()),
        ("SUDO_GID", gid.to_string()),
        ("SUDO_COMMAND", argv.join(" ")),
    ]);
    cmd.current_dir(if std::path::Path::new(cwd).is_dir() { cwd } else { "/" })
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr))
        .process_group(0);
    crate::guest::confine(&mut cmd);
    let (child, exited) = reaper.spawn(&mut cmd).map_err(|e| format!("{}: {e}", argv[0]))?;
    let pid = child.id() as i32;
    crate::oom::watch(pid);
    // The command is killed when its `sudo` goes (the connection closes before it ends).
    let ended = Arc::new(std::sync::Mutex::new(false));
    let (watcher, seen) = (conn.try_clone().map_err(|e| e.to_string())?, ended.clone());
    std::thread::spawn(move || {
        let mut b = [0u8; 1];
        let _ = (&watcher).read(&mut b);
        if !*seen.lock().unwrap_or_else(|e| e.into_inner()) {
            // SAFETY: signalling the command's own process group, which has not been reaped.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
    });
    let status = exited.recv();
    *ended.lock().unwrap_or_else(|e| e.into_inner()) = true;
    let status = status.map_err(|_| "the command's status was lost".to_string())?;
    let st = std::process::ExitStatus::from_raw(status);
    Ok(st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn sudos_usual_options_are_taken_and_others_refused_by_name() {
        let ask = parse(&v(&["-n", "-E", "-u", "root", "--", "apt-get", "-y", "install"])).unwrap();
        assert_eq!(ask, Ask { argv: v(&["apt-get", "-y", "install"]), keep_env: true });
        assert_eq!(parse(&v(&["--user=0", "id", "-u"])).unwrap().argv, v(&["id", "-u"]));
        assert_eq!(parse(&v(&["ls", "-l"])).unwrap(), Ask { argv: v(&["ls", "-l"]), keep_env: false });
        assert!(parse(&v(&["-u", "nobody", "id"])).unwrap_err().contains("only root"));
        assert!(parse(&v(&["-i"])).unwrap_err().contains("-i"));
        assert!(parse(&v(&["-n"])).unwrap_err().contains("usage"));
        assert!(parse(&v(&["-u"])).is_err());
    }

    #[test]
    fn a_setuid_sudo_is_replaced_by_a_link_to_the_stand_in_and_nothing_else_is() {
        let dir = tempfile::tempdir().unwrap();
        let me = dir.path().join("branchbox-agent");
        std::fs::write(&me, "agent").unwrap();
        let sudo = dir.path().join("sudo");
        std::fs::write(&sudo, "setuid sudo").unwrap();
        std::fs::set_permissions(&sudo, std::fs::Permissions::from_mode(0o4755)).unwrap();
        assert!(take_over(&sudo, &me).unwrap());
        assert_eq!(std::fs::read_link(&sudo).unwrap(), me);
        assert!(invoked_as_sudo(&sudo.to_string_lossy()), "run by that path, the binary acts as sudo");
        assert!(!take_over(&sudo, &me).unwrap(), "the stand-in itself is not setuid: left as it is");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2, "no temporary link left");

        // Behind a link, as sudo-rs is installed: the link is replaced, its target kept.
        let real = dir.path().join("sudo-rs");
        std::fs::write(&real, "setuid sudo-rs").unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o4755)).unwrap();
        let linked = dir.path().join("linked");
        std::os::unix::fs::symlink(&real, &linked).unwrap();
        assert!(take_over(&linked, &me).unwrap());
        assert_eq!(std::fs::read_link(&linked).unwrap(), me);
        assert_eq!(std::fs::read_to_string(&real).unwrap(), "setuid sudo-rs");

        let script = dir.path().join("script");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(!take_over(&script, &me).unwrap());
        assert_eq!(std::fs::read_to_string(&script).unwrap(), "#!/bin/sh\n");
        assert!(!take_over(&dir.path().join("missing"), &me).unwrap());
        assert!(!dir.path().join("missing").exists(), "no sudo is made where the image has none");
    }

    #[test]
    fn invoked_as_sudo_by_its_links_name_only() {
        assert!(invoked_as_sudo("/usr/local/bin/sudo") && invoked_as_sudo("sudo"));
        assert!(!invoked_as_sudo("/usr/local/bin/branchbox-agent") && !invoked_as_sudo("sudoku"));
    }
}
