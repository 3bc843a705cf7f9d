//! Running commands: spawning into their own process group, pumping output with a cap,
//! feeding stdin, and killing the whole group at the timeout.

use crate::reaper::Reaper;
use crate::Failure;
use branchbox_protocol::{Command as Cmd, ErrorCode, ExecSpec, ExitStatus, PtySize, CHUNK};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// Output cap when the request sets none (the host assumes the same).
pub use branchbox_protocol::limits::DEFAULT_OUTPUT_CAP;
/// Most arguments or environment entries a command may have.
const MAX_ITEMS: usize = 4096;
/// How long output is still read after the command exited, for grandchildren that keep the
/// pipes open.
const LINGER: Duration = Duration::from_millis(100);

/// Which output stream a chunk came from.
#[derive(Clone, Copy)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// A started command: the child and the channel its exit status arrives on.
pub struct Started {
    /// The child (its pipes are taken by the pump).
    pub child: Child,
    /// Receives the raw wait status.
    pub exited: Receiver<libc::c_int>,
    /// When it started.
    pub started: Instant,
    /// The terminal's master side, for a command run on a pseudo-terminal: its output is the
    /// command's, and what is written to it is typed into the command.
    pub pty: Option<File>,
}

fn bad(msg: impl Into<String>) -> Failure {
    Failure::new(ErrorCode::BadRequest, msg)
}

/// Spawns the command of `spec` in a new process group.
pub fn start(reaper: &Reaper, spec: &ExecSpec) -> Result<Started, Failure> {
    let mut cmd = match &spec.cmd {
        Cmd::Argv(argv) => {
            let (prog, args) = argv.split_first().ok_or_else(|| bad("argv is empty: give a program"))?;
            if argv.len() > MAX_ITEMS {
                return Err(bad(format!("too many arguments (limit {MAX_ITEMS})")));
            }
            let mut c = Command::new(prog);
            c.args(args);
            c
        }
        Cmd::Shell(line) => {
            let mut c = Command::new("/bin/sh");
            c.arg("-c").arg(line);
            c
        }
    };
    if spec.env.len() > MAX_ITEMS {
        return Err(bad(format!("too many environment variables (limit {MAX_ITEMS})")));
    }
    if let Some(k) = spec.env.keys().find(|k| k.is_empty() || k.contains('=') || k.contains('\0')) {
        return Err(bad(format!("invalid environment variable name {k:?}")));
    }
    let account = spec.user.as_deref().map(crate::account::lookup).transpose()?;
    let mut cwd = spec.cwd.as_deref().unwrap_or("/");
    if let Some(a) = &account {
        // The account's own variables, which the request's may still override.
        cmd.env("HOME", &a.home).env("USER", &a.name).env("LOGNAME", &a.name);
        cwd = spec.cwd.as_deref().unwrap_or(&a.home);
    }
    cmd.envs(&spec.env).current_dir(cwd);
    let pty = match spec.pty {
        Some(size) => {
            let size = PtySize::new(size.cols, size.rows).map_err(bad)?;
            let (master, slave) = open_pty(size)?;
            if !spec.env.contains_key("TERM") {
                cmd.env("TERM", "xterm-256color");
            }
            let io = |fd: &OwnedFd| fd.try_clone().map(Stdio::from);
            let failed =
                |e| Failure::new(ErrorCode::Io, format!("cannot hand the terminal to the command: {e}"));
            cmd.stdin(io(&slave).map_err(failed)?)
                .stdout(io(&slave).map_err(failed)?)
                .stderr(Stdio::from(slave));
            // A session of its own (which is also a process group led by the command, so the
            // timeout and cancel kill it as they kill any command's group), with the terminal
            // as its controlling tty. setsid must come before every other pre_exec step.
            // SAFETY: setsid and ioctl are async-signal-safe.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                })
            };
            Some(master)
        }
        None => {
            cmd.process_group(0)
                .stdin(if spec.stdin { Stdio::piped() } else { Stdio::null() })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            None
        }
    };
    crate::guest::confine(&mut cmd);
    if let Some(a) = &account {
        crate::account::run_as(&mut cmd, a);
    }
    let (child, exited) = reaper.spawn(&mut cmd).map_err(|e| {
        let what = match &spec.cmd {
            Cmd::Argv(a) => a.first().cloned().unwrap_or_default(),
            Cmd::Shell(_) => "/bin/sh".to_string(),
        };
        Failure::new(ErrorCode::SpawnFailed, format!("cannot start {what:?}: {e}"))
    })?;
    crate::oom::watch(child.id() as i32);
    Ok(Started { child, exited, started: Instant::now(), pty })
}

/// Opens a new pseudo-terminal of `size`: its master side and the path-less slave side, both
/// close-on-exec so that no other command inherits them.
fn open_pty(size: PtySize) -> Result<(File, OwnedFd), Failure> {
    let failed = |what: &str| {
        Failure::new(
            ErrorCode::Io,
            format!("cannot open a terminal ({what}: {})", std::io::Error::last_os_error()),
        )
    };
    let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: open of a constant path; the fd is owned by the File below.
    let fd = unsafe { libc::open(c"/dev/ptmx".as_ptr(), flags) };
    if fd < 0 {
        return Err(failed("/dev/ptmx"));
    }
    // SAFETY: fd is a fresh descriptor we own.
    let master = unsafe { File::from_raw_fd(fd) };
    let mut unlock: libc::c_int = 0;
    let mut number: libc::c_uint = 0;
    // SAFETY: TIOCSPTLCK reads an int and TIOCGPTN writes an unsigned int, both ours.
    if unsafe { libc::ioctl(fd, libc::TIOCSPTLCK, &mut unlock) } < 0
        || unsafe { libc::ioctl(fd, libc::TIOCGPTN, &mut number) } < 0
    {
        return Err(failed("unlock"));
    }
    set_size(&master, size).map_err(|_| failed("size"))?;
    let path = std::ffi::CString::new(format!("/dev/pts/{number}")).map_err(|_| failed("name"))?;
    // SAFETY: open of a NUL-terminated path we made.
    let slave = unsafe { libc::open(path.as_ptr(), flags) };
    if slave < 0 {
        return Err(failed("/dev/pts"));
    }
    // SAFETY: slave is a fresh descriptor we own.
    Ok((master, unsafe { OwnedFd::from_raw_fd(slave) }))
}

/// Sets the size of the terminal whose master side is `master`; its session gets SIGWINCH.
pub fn set_size(master: &File, size: PtySize) -> std::io::Result<()> {
    let ws = libc::winsize { ws_row: size.rows, ws_col: size.cols, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCSWINSZ reads a winsize we own.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Types client stream chunks into a terminal on a thread of its own (a command that does not
/// read blocks only this thread). The end of the client's stream types nothing: the session
/// ends when its command does, or when the client goes.
pub fn feed_pty(master: File, chunks: Receiver<Option<Vec<u8>>>) {
    std::thread::spawn(move || {
        let mut master = master;
        while let Ok(Some(chunk)) = chunks.recv() {
            if master.write_all(&chunk).is_err() {
                break;
            }
        }
    });
}

/// Feeds client stream chunks to the child's stdin on a thread of its own, so a command that
/// writes before it reads cannot deadlock against us.
pub fn feed_stdin(child: &mut Child, chunks: Receiver<Option<Vec<u8>>>) {
    if let Some(mut stdin) = child.stdin.take() {
        std::thread::spawn(move || {
            while let Ok(Some(chunk)) = chunks.recv() {
                if stdin.write_all(&chunk).is_err() {
                    break;
                }
            }
        });
    }
}

fn set_nonblocking(fd: i32) {
    // SAFETY: plain fcntl on a pipe fd we own.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
}

/// Pumps the child's output into `sink` until it exits (and its pipes close, or `LINGER`
/// passes), killing its process group at `timeout`. At most `cap` bytes reach `sink`.
pub fn pump(
    mut s: Started,
    timeout: Option<Duration>,
    cap: u64,
    sink: &mut dyn FnMut(Stream, &[u8]),
) -> ExitStatus {
    let pid = s.child.id() as i32;
    let mut pipes: Vec<(Stream, Box<dyn Read + Send>, i32)> = Vec::new();
    if let Some(o) = s.child.stdout.take() {
        let fd = o.as_raw_fd();
        pipes.push((Stream::Stdout, Box::new(o), fd));
    }
    if let Some(e) = s.child.stderr.take() {
        let fd = e.as_raw_fd();
        pipes.push((Stream::Stderr, Box::new(e), fd));
    }
    if let Some(m) = s.pty.take() {
        // Once every holder of the terminal's slave side has gone, reads fail with EIO:
        // the terminal's end.
        let fd = m.as_raw_fd();
        pipes.push((Stream::Stdout, Box::new(m), fd));
    }
    for p in &pipes {
        set_nonblocking(p.2);
    }
    let deadline = timeout.map(|t| s.started + t);
    let (mut sent, mut truncated, mut timed_out) = (0u64, false, false);
    let mut status: Option<libc::c_int> = None;
    let mut exited_at: Option<Instant> = None;
    let mut buf = vec![0u8; CHUNK];
    while !pipes.is_empty() {
        let now = Instant::now();
        if let (Some(d), false) = (deadline, timed_out) {
            if now >= d {
                crate::reaper::kill_group(pid);
                timed_out = true;
            }
        }
        if status.is_none() {
            if let Ok(st) = s.exited.try_recv() {
                status = Some(st);
                exited_at = Some(now);
            }
        }
        if exited_at.is_some_and(|t| now.duration_since(t) > LINGER) {
            break;
        }
        let mut fds: Vec<libc::pollfd> =
            pipes.iter().map(|p| libc::pollfd { fd: p.2, events: libc::POLLIN, revents: 0 }).collect();
        let wait_ms = match deadline {
            Some(d) if !timed_out => d.saturating_duration_since(now).as_millis().min(50) as i32,
            _ => 50,
        };
        // SAFETY: fds is a valid array of pollfd for the duration of the call.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait_ms) };
        let mut closed = Vec::new();
        for (i, p) in pipes.iter_mut().enumerate() {
            if fds[i].revents == 0 {
                continue;
            }
            match p.1.read(&mut buf) {
                Ok(0) => closed.push(i),
                Ok(n) => {
                    let room = cap.saturating_sub(sent) as usize;
                    let take = n.min(room);
                    if take < n {
                        truncated = true;
                    }
                    if take > 0 {
                        sink(p.0, &buf[..take]);
                        sent += take as u64;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => closed.push(i),
            }
        }
        for i in closed.into_iter().rev() {
            pipes.remove(i);
        }
    }
    let raw = match status {
        Some(st) => st,
        None => wait_exit(&s.exited, pid, deadline, &mut timed_out),
    };
    let mut status = decode_status(raw, timed_out, truncated, s.started.elapsed());
    status.oom_killed = crate::oom::take(pid);
    status
}

/// Waits for the exit status, killing the group if the deadline passes first.
fn wait_exit(
    rx: &Receiver<libc::c_int>,
    pid: i32,
    deadline: Option<Instant>,
    timed_out: &mut bool,
) -> libc::c_int {
    loop {
        let wait = match deadline {
            Some(d) if !*timed_out => d.saturating_duration_since(Instant::now()),
            _ => Duration::from_secs(3600),
        };
        match rx.recv_timeout(wait) {
            Ok(st) => return st,
            Err(RecvTimeoutError::Timeout) => {
                if deadline.is_some() && !*timed_out {
                    crate::reaper::kill_group(pid);
                    *timed_out = true;
                }
            }
            // The reaper is gone: report an unknown end rather than hanging forever.
            Err(RecvTimeoutError::Disconnected) => return -1,
        }
    }
}

/// Turns a raw wait status into the protocol's exit status.
pub fn decode_status(raw: libc::c_int, timed_out: bool, truncated: bool, took: Duration) -> ExitStatus {
    let (code, signal) = if raw == -1 {
        (None, None)
    } else if libc::WIFEXITED(raw) {
        (Some(libc::WEXITSTATUS(raw)), None)
    } else if libc::WIFSIGNALED(raw) {
        (None, Some(libc::WTERMSIG(raw)))
    } else {
        (None, None)
    };
    ExitStatus { code, signal, timed_out, truncated, duration_ms: took.as_millis() as u64, oom_killed: false }
}
