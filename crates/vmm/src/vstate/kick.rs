//! Stopping a vCPU that is inside `KVM_RUN`, from another thread.
//!
//! The pausing thread sets a flag and sends the vCPU thread a real-time signal. The signal's
//! handler sets `immediate_exit` in that thread's `kvm_run`, so whether the signal lands
//! before, during or just after `KVM_RUN`, the next or current `KVM_RUN` returns `EINTR`
//! and the run loop sees the flag.

use kvm_bindings::kvm_run;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once};

thread_local! {
    /// The `kvm_run` of the vCPU this thread is running, or null.
    static RUNNING: Cell<*mut kvm_run> = const { Cell::new(std::ptr::null_mut()) };
}

/// The signal used to kick vCPU threads (SIGRTMIN + 1; SIGRTMIN itself is often taken).
fn kick_signal() -> libc::c_int {
    libc::SIGRTMIN() + 1
}

extern "C" fn on_kick(_: libc::c_int) {
    // Only async-signal-safe work: one thread-local read and one volatile store.
    let run = RUNNING.with(Cell::get);
    if !run.is_null() {
        // SAFETY: the pointer is set only while this thread runs the vCPU whose mapping it
        // points into, and cleared before that vCPU can be dropped.
        unsafe { std::ptr::addr_of_mut!((*run).immediate_exit).write_volatile(1) };
    }
}

fn install_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: installs a handler that only touches a thread-local and kvm_run.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_kick as *const () as usize;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(kick_signal(), &act, std::ptr::null_mut());
        }
    });
}

#[derive(Default)]
struct KickState {
    requested: AtomicBool,
    thread: Mutex<Option<libc::pthread_t>>,
}

/// A handle that pauses a running vCPU from any thread.
#[derive(Clone)]
pub struct PauseHandle(Arc<KickState>);

impl Default for PauseHandle {
    /// A handle for one vCPU. Installs the kick signal's handler (once per process) here,
    /// during setup, so that a vCPU thread confined by its seccomp filter, which refuses
    /// `rt_sigaction`, never has to install it when it first runs.
    fn default() -> PauseHandle {
        install_handler();
        PauseHandle(Arc::default())
    }
}

impl PauseHandle {
    /// Asks the vCPU to stop: its run loop returns `RunOutcome::Paused`
    /// promptly if it is running, or as soon as it is next run.
    pub fn request_pause(&self) {
        self.0.requested.store(true, Ordering::SeqCst);
        let thread = self.0.thread.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = *thread {
            // SAFETY: `t` is registered only while that thread is inside the run loop and is
            // removed under this same lock before the loop returns, so the thread is alive.
            unsafe { libc::pthread_kill(t, kick_signal()) };
        }
    }

    /// Takes a pending pause request, if any.
    pub(crate) fn take_request(&self) -> bool {
        self.0.requested.swap(false, Ordering::SeqCst)
    }

    /// Registers the calling thread as running the vCPU whose `kvm_run` is `run`.
    pub(crate) fn arm(&self, run: *mut kvm_run) -> ArmedGuard<'_> {
        install_handler();
        RUNNING.with(|c| c.set(run));
        // SAFETY: pthread_self has no preconditions.
        let me = unsafe { libc::pthread_self() };
        *self.0.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(me);
        ArmedGuard(self)
    }
}

/// Undoes [`PauseHandle::arm`] when the run loop returns, however it returns.
pub(crate) struct ArmedGuard<'a>(&'a PauseHandle);

impl Drop for ArmedGuard<'_> {
    fn drop(&mut self) {
        *self.0 .0.thread.lock().unwrap_or_else(|e| e.into_inner()) = None;
        RUNNING.with(|c| c.set(std::ptr::null_mut()));
    }
}
