//! Writing a checkpoint's delta layer after the VM runs again, from memory captured at the
//! instant of the checkpoint.
//!
//! The VMM `fork(2)`s a writer process while the VM is paused. The writer sees the dirty
//! pages exactly as they were at that instant (copy-on-write: the VM's later writes copy
//! pages in the VMM, never in the writer), writes the delta layer, fsyncs it, renames it into
//! place, then writes, fsyncs and renames the state file; the VMM resumes the VM right after
//! the `fork`. Only the dirty runs are inherited: all other guest RAM is `MADV_DONTFORK`
//! (see `GuestRam`), so the fork copies page tables for the dirty pages only.
//!
//! A KVM VM cannot be used from a forked process, and this one never tries: the writer makes
//! only raw system calls on buffers prepared before the fork (no allocation, no locks: other
//! VMM threads may hold them) and exits with a code naming the step that failed. A writer
//! killed part way leaves only `.tmp` files: a layer or state file is renamed to its final
//! name only after its content is durable, and the state file comes last.

use super::delta::{seal_header, HEADER_LEN};
use crate::error::{Error, Result};
use std::ffi::CString;
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::sync::{Arc, Mutex};

/// Everything the writer process needs, prepared before the fork.
pub(crate) struct WritePlan {
    /// The snapshot directory, for `renameat` and its fsync.
    pub dir: File,
    /// The delta's temporary file (already sized), shared with the VMM through `fork`.
    pub delta: File,
    /// The encoded header; the writer seals it with the data checksum.
    pub header: [u8; HEADER_LEN],
    /// Index bytes and padding, written right after the header.
    pub index: Vec<u8>,
    /// File offset of the page data.
    pub data_off: u64,
    /// Host address and length of each run of dirty pages, in index order.
    pub runs: Vec<(usize, usize)>,
    /// Temporary and final names of the delta.
    pub delta_names: (CString, CString),
    /// The state file: its temporary file, its bytes, temporary and final names.
    pub state: (File, Vec<u8>, CString, CString),
}

/// A writer process. Clones share it (the checkpoint and its VM's lineage both hold one):
/// whichever waits first reaps the process and records the outcome for the others.
#[derive(Clone)]
pub(crate) struct Writer {
    inner: Arc<Inner>,
}

struct Inner {
    pid: libc::pid_t,
    ready: Mutex<Option<File>>,
    status: Mutex<Option<std::result::Result<(), i32>>>,
}

/// What each writer exit code means.
fn step(code: i32) -> &'static str {
    match code {
        10 => "write the page index",
        11 => "write page data",
        12 => "write the header",
        13 => "fsync the delta layer",
        14 => "rename the delta layer",
        15 | 19 => "fsync the snapshot directory",
        16 => "write the state file",
        17 => "fsync the state file",
        18 => "rename the state file",
        _ => "finish",
    }
}

fn pwrite_all(fd: libc::c_int, mut ptr: *const u8, mut len: usize, mut off: u64) -> bool {
    while len > 0 {
        // SAFETY: `ptr..ptr+len` is readable memory prepared before the fork.
        let n = unsafe { libc::pwrite(fd, ptr.cast(), len, off as libc::off_t) };
        if n <= 0 {
            if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return false;
        }
        let n = n as usize;
        // SAFETY: stays inside the buffer (n <= len).
        ptr = unsafe { ptr.add(n) };
        len -= n;
        off += n as u64;
    }
    true
}

/// The writer process's whole life: raw system calls on `plan`, returning an exit code.
fn write_in_child(plan: &WritePlan, ready: libc::c_int) -> i32 {
    let fd = plan.delta.as_raw_fd();
    let dir = plan.dir.as_raw_fd();
    if !pwrite_all(fd, plan.index.as_ptr(), plan.index.len(), HEADER_LEN as u64) {
        return 10;
    }
    let mut crc = crc32fast::Hasher::new();
    let mut off = plan.data_off;
    for &(addr, len) in &plan.runs {
        // SAFETY: the run is guest RAM inherited by this process (MADV_DOFORK before fork).
        crc.update(unsafe { std::slice::from_raw_parts(addr as *const u8, len) });
        if !pwrite_all(fd, addr as *const u8, len, off) {
            return 11;
        }
        off += len as u64;
    }
    let mut header = plan.header;
    seal_header(&mut header, crc.finalize());
    if !pwrite_all(fd, header.as_ptr(), header.len(), 0) {
        return 12;
    }
    // The content is complete in the page cache: children and rollbacks may map it now.
    // SAFETY: one byte from a stack buffer to our pipe.
    unsafe { libc::write(ready, [1u8].as_ptr().cast(), 1) };
    // SAFETY: plain system calls on descriptors and C strings prepared before the fork.
    unsafe {
        if libc::fsync(fd) != 0 {
            return 13;
        }
        let (tmp, fin) = &plan.delta_names;
        if libc::renameat(dir, tmp.as_ptr(), dir, fin.as_ptr()) != 0 {
            return 14;
        }
        if libc::fsync(dir) != 0 {
            return 15;
        }
        let (file, bytes, tmp, fin) = &plan.state;
        if !pwrite_all(file.as_raw_fd(), bytes.as_ptr(), bytes.len(), 0) {
            return 16;
        }
        if libc::fsync(file.as_raw_fd()) != 0 {
            return 17;
        }
        if libc::renameat(dir, tmp.as_ptr(), dir, fin.as_ptr()) != 0 {
            return 18;
        }
        if libc::fsync(dir) != 0 {
            return 19;
        }
    }
    0
}

impl Writer {
    /// Forks the writer process for `plan`. The caller has made exactly the dirty runs
    /// inheritable and keeps the VM paused until this returns.
    pub fn spawn(plan: &WritePlan) -> Result<Writer> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` has room for the two descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(Error::Memory {
                op: "create the writer's pipe",
                source: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: the child only runs `write_in_child` (raw system calls, no allocation or
        // locks) and `_exit`s; the parent continues normally.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let code = write_in_child(plan, fds[1]);
            // SAFETY: leaves the forked process without running any destructor.
            unsafe { libc::_exit(code) };
        }
        // SAFETY: the write end belongs to the child now; the read end becomes a File.
        unsafe { libc::close(fds[1]) };
        // SAFETY: fds[0] is a fresh descriptor owned by nothing else.
        let ready = unsafe { <File as std::os::unix::io::FromRawFd>::from_raw_fd(fds[0]) };
        if pid < 0 {
            return Err(Error::Memory {
                op: "fork the checkpoint writer",
                source: std::io::Error::last_os_error(),
            });
        }
        let inner = Inner { pid, ready: Mutex::new(Some(ready)), status: Mutex::new(None) };
        Ok(Writer { inner: Arc::new(inner) })
    }

    /// The writer's process id.
    pub fn pid(&self) -> u32 {
        self.inner.pid as u32
    }

    /// Blocks until the layer's content is complete (mappable), before it is durable.
    pub fn ready(&self) -> Result<()> {
        let pipe = self.inner.ready.lock().map(|mut r| r.take()).unwrap_or(None);
        if let Some(mut pipe) = pipe {
            let mut b = [0u8; 1];
            if matches!(std::io::Read::read(&mut pipe, &mut b), Ok(1)) {
                return Ok(());
            }
        }
        self.wait()
    }

    /// Blocks until the writer exits: the layer and the state file are durable and named.
    pub fn wait(&self) -> Result<()> {
        match self.inner.reap(0)? {
            Some(status) => status_result(status),
            None => Err(Error::Checkpoint("the layer writer was not reaped".into())),
        }
    }

    /// The writer's outcome if it has exited, `None` while it runs; never blocks.
    pub fn poll(&self) -> Option<Result<()>> {
        match self.inner.reap(libc::WNOHANG) {
            Ok(Some(status)) => Some(status_result(status)),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        }
    }
}

fn status_result(status: std::result::Result<(), i32>) -> Result<()> {
    status.map_err(|code| {
        Error::Checkpoint(if code < 0 {
            format!("the layer writer was killed by signal {}", -code)
        } else {
            format!("the layer writer failed to {} (exit code {code})", step(code))
        })
    })
}

impl Inner {
    /// `waitpid` with `flags`, once: the recorded outcome afterwards; `None` when `WNOHANG`
    /// found it still running.
    fn reap(&self, flags: libc::c_int) -> Result<Option<std::result::Result<(), i32>>> {
        let mut status = self.status.lock().map_err(|_| Error::Checkpoint("writer state poisoned".into()))?;
        if let Some(s) = *status {
            return Ok(Some(s));
        }
        let mut raw = 0;
        loop {
            // SAFETY: waits for our own child.
            let r = unsafe { libc::waitpid(self.pid, &mut raw, flags) };
            if r == self.pid {
                break;
            }
            if r == 0 {
                return Ok(None);
            }
            if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return Err(Error::Memory {
                    op: "wait for the checkpoint writer",
                    source: std::io::Error::last_os_error(),
                });
            }
        }
        let s = if libc::WIFEXITED(raw) && libc::WEXITSTATUS(raw) == 0 {
            Ok(())
        } else if libc::WIFEXITED(raw) {
            Err(libc::WEXITSTATUS(raw))
        } else {
            Err(-libc::WTERMSIG(raw))
        };
        *status = Some(s);
        Ok(Some(s))
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Reap the process; an unwaited checkpoint still completes on disk.
        let _ = self.reap(0);
    }
}
