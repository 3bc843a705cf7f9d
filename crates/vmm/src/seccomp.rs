//! Seccomp filters for the threads of the VMM process: each kind of thread may make only the
//! system calls its work needs, so a guest that takes over a device's code in one thread
//! cannot open files, start programs or reach the network from it.
//!
//! # Use
//!
//! A thread confines itself once its setup is done (files opened, sockets bound, the vCPU
//! created), before it serves the guest:
//!
//! ```no_run
//! use branchbox_vmm::seccomp::{self, ThreadKind};
//! // at the top of a vCPU thread, after the vCPU fd exists:
//! seccomp::apply(ThreadKind::Vcpu)?;
//! # Ok::<(), branchbox_vmm::Error>(())
//! ```
//!
//! [`filter`] builds a filter without installing it; [`Filter::apply`] then installs it
//! without allocating, for threads that must not allocate (a child right after `fork`). A
//! filter applies to the calling thread only and cannot be lifted; threads it creates inherit
//! it. Once applied, `execve` is impossible anyway (`no_new_privs` is set).
//!
//! # Kinds
//!
//! Both kinds may: read and write descriptors they already hold, wait on futexes, sleep,
//! read the clock, allocate memory (`mmap`/`mprotect` never with `PROT_EXEC`, `munmap`,
//! `mremap`, `madvise`, `brk`), return from signal handlers, send the vCPU kick signal with
//! `tgkill`, get random bytes and exit.
//!
//! - [`ThreadKind::Vcpu`]: additionally `ioctl` with the KVM vCPU requests the run loop and
//!   a state save or restore issue (`KVM_RUN`, `KVM_GET_*`/`KVM_SET_*` of registers, MSRs,
//!   XSAVE, LAPIC, events, MP state, CPUID), `KVM_KVMCLOCK_CTRL`, and the VM requests a device
//!   emulated on the vCPU thread uses to raise or wire interrupts (`KVM_IRQ_LINE`,
//!   `KVM_SIGNAL_MSI`, `KVM_IRQFD`, `KVM_IOEVENTFD`).
//! - [`ThreadKind::Vmm`] (the device/event-loop thread): additionally `epoll_*`, `eventfd2`,
//!   positioned and vectored file I/O, `lseek`, `fsync`/`fdatasync`, `fallocate`, `fstat` of
//!   an open descriptor, `fcntl` on descriptor flags, Unix-domain sockets only (`socket`
//!   with `AF_UNIX`, `connect`, `accept4`, `send*`/`recv*`, `shutdown`), `ioctl` with
//!   `FIONBIO` and the interrupt requests above.
//! - [`ThreadKind::VcpuDevices`]: both lists, for a vCPU thread that processes virtio queues
//!   on its MMIO exits (block I/O and vsock are synchronous on the notifying thread).
//!
//! Neither may open a file (`open`/`openat`), create other sockets, `execve`, `fork`/`clone`,
//! `ptrace`, `kill` another process, or `mount`.
//!
//! # What a forbidden call does
//!
//! It kills the whole process (`SECCOMP_RET_KILL_PROCESS`, the process ends with `SIGSYS`).
//! Refusing with `EPERM` would let a thread a guest has taken over carry on and try other
//! ways, and would turn a call missing from a list into an error some code path might
//! swallow; killing stops the VMM at the first such call and shows which one in the kernel's
//! audit log (`type=SECCOMP ... syscall=N`).

use crate::error::{Error, Result};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    TargetArch,
};
use std::collections::BTreeMap;

/// The kinds of thread of a VMM process, each with its own allow-list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadKind {
    /// A thread running one vCPU's `KVM_RUN` loop and the devices it reaches by MMIO/PIO.
    Vcpu,
    /// The VMM's device or event-loop thread: epoll, eventfds, disk files, Unix sockets.
    Vmm,
    /// A vCPU thread that also serves devices on its MMIO exits (a virtio queue notified by
    /// an MMIO write is processed on the vCPU thread): the union of the two lists above.
    VcpuDevices,
}

impl ThreadKind {
    fn name(self) -> &'static str {
        match self {
            ThreadKind::Vcpu => "vCPU",
            ThreadKind::Vmm => "VMM",
            ThreadKind::VcpuDevices => "vCPU with devices",
        }
    }
}

/// A compiled filter for one kind of thread, ready to install.
#[derive(Debug, Clone)]
pub struct Filter {
    kind: ThreadKind,
    program: BpfProgram,
}

impl Filter {
    /// Installs this filter on the calling thread. Does not allocate.
    pub fn apply(&self) -> Result<()> {
        seccompiler::apply_filter(&self.program).map_err(|e| Error::Seccomp {
            thread: self.kind.name(),
            reason: format!("{e}; run on a Linux kernel built with CONFIG_SECCOMP_FILTER"),
        })
    }

    /// The kind of thread this filter is for.
    pub fn kind(&self) -> ThreadKind {
        self.kind
    }
}

/// Builds and installs the filter for `kind` on the calling thread.
pub fn apply(kind: ThreadKind) -> Result<()> {
    filter(kind)?.apply()
}

/// Builds the filter for `kind` without installing it.
pub fn filter(kind: ThreadKind) -> Result<Filter> {
    let fail = |e: &dyn std::fmt::Display| Error::Seccomp { thread: kind.name(), reason: e.to_string() };
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| fail(&e))?;
    let rules = rules(kind).map_err(|e| fail(&e))?;
    let filter = SeccompFilter::new(rules, SeccompAction::KillProcess, SeccompAction::Allow, arch)
        .map_err(|e| fail(&e))?;
    let program: BpfProgram = filter.try_into().map_err(|e: seccompiler::BackendError| fail(&e))?;
    Ok(Filter { kind, program })
}

type Rules = BTreeMap<i64, Vec<SeccompRule>>;

/// A rule matching when argument `arg` equals `value` (compared as 32 or 64 bits).
fn arg_is(arg: u8, len: SeccompCmpArgLen, value: u64) -> seccompiler::Result<SeccompRule> {
    Ok(SeccompRule::new(vec![SeccompCondition::new(arg, len, SeccompCmpOp::Eq, value)?])?)
}

/// Rules allowing a call when argument `arg` (32-bit) is one of `values`.
fn any_of(arg: u8, values: &[u64]) -> seccompiler::Result<Vec<SeccompRule>> {
    values.iter().map(|&v| arg_is(arg, SeccompCmpArgLen::Dword, v)).collect()
}

/// Allows `syscalls` whatever their arguments.
fn allow(rules: &mut Rules, syscalls: &[libc::c_long]) {
    for &s in syscalls {
        rules.insert(s, Vec::new());
    }
}

// KVM request numbers (kvm-ioctls keeps its own private), from linux/kvm.h.
vmm_sys_util::ioctl_io_nr!(KVM_RUN, kvm_bindings::KVMIO, 0x80);
vmm_sys_util::ioctl_ior_nr!(KVM_GET_REGS, kvm_bindings::KVMIO, 0x81, kvm_bindings::kvm_regs);
vmm_sys_util::ioctl_iow_nr!(KVM_SET_REGS, kvm_bindings::KVMIO, 0x82, kvm_bindings::kvm_regs);
vmm_sys_util::ioctl_ior_nr!(KVM_GET_SREGS, kvm_bindings::KVMIO, 0x83, kvm_bindings::kvm_sregs);
vmm_sys_util::ioctl_iow_nr!(KVM_SET_SREGS, kvm_bindings::KVMIO, 0x84, kvm_bindings::kvm_sregs);
vmm_sys_util::ioctl_iowr_nr!(KVM_GET_MSRS, kvm_bindings::KVMIO, 0x88, kvm_bindings::kvm_msrs);
vmm_sys_util::ioctl_iow_nr!(KVM_SET_MSRS, kvm_bindings::KVMIO, 0x89, kvm_bindings::kvm_msrs);
vmm_sys_util::ioctl_ior_nr!(KVM_GET_LAPIC, kvm_bindings::KVMIO, 0x8e, kvm_bindings::kvm_lapic_state);
vmm_sys_util::ioctl_iow_nr!(KVM_SET_LAPIC, kvm_bindings::KVMIO, 0x8f, kvm_bindings::kvm_lapic_state);
vmm_sys_util::ioctl_iow_nr!(KVM_SET_CPUID2, kvm_bindings::KVMIO, 0x90, kvm_bindings::kvm_cpuid2);
vmm_sys_util::ioctl_iowr_nr!(KVM_GET_CPUID2, kvm_bindings::KVMIO, 0x91, kvm_bindings::kvm_cpuid2);
vmm_sys_util::ioctl_ior_nr!(KVM_GET_MP_STATE, kvm_bindings::KVMIO, 0x98, kvm_bindings::kvm_mp_state);
vmm_sys_util::ioctl_iow_nr!(KVM_SET_MP_STATE, kvm_bindings::KVMIO, 0x99, kvm_bindings::kvm_mp_state);
vmm_sys_util::ioctl_ior_nr!(KVM_GET_VCPU_EVENTS, kvm_bindings::KVMIO, 0x9f, kvm_bindings::kvm_vcpu_events);
vmm_sys_util::ioctl_iow_nr!(KVM_SET_VCPU_EVENTS, kvm_bindings::KVMIO, 0xa0, kvm_bindings::kvm_vcpu_events);
vmm_sys_util::ioctl_ior_nr!(KVM_GET_DEBUGREGS, kvm_bindings::KVMIO, 0xa1, kvm_bindings::kvm_debugregs);
vmm_sys_util::ioctl_iow_nr!(KVM_SET_DEBUGREGS, kvm_bindings::KVMIO, 0xa2, kvm_bindings::kvm_debugregs);
vmm_sys_util::ioctl_ior_nr!(KVM_GET_XSAVE, kvm_bindings::KVMIO, 0xa4, kvm_bindings::kvm_xsave);
vmm_sys_util::ioctl_iow_nr!(KVM_SET_XSAVE, kvm_bindings::KVMIO, 0xa5, kvm_bindings::kvm_xsave);
vmm_sys_util::ioctl_ior_nr!(KVM_GET_XCRS, kvm_bindings::KVMIO, 0xa6, kvm_bindings::kvm_xcrs);
vmm_sys_util::ioctl_iow_nr!(KVM_SET_XCRS, kvm_bindings::KVMIO, 0xa7, kvm_bindings::kvm_xcrs);
vmm_sys_util::ioctl_io_nr!(KVM_KVMCLOCK_CTRL, kvm_bindings::KVMIO, 0xad);
vmm_sys_util::ioctl_iow_nr!(KVM_IRQ_LINE, kvm_bindings::KVMIO, 0x61, kvm_bindings::kvm_irq_level);
vmm_sys_util::ioctl_iow_nr!(KVM_IRQFD, kvm_bindings::KVMIO, 0x76, kvm_bindings::kvm_irqfd);
vmm_sys_util::ioctl_iow_nr!(KVM_IOEVENTFD, kvm_bindings::KVMIO, 0x79, kvm_bindings::kvm_ioeventfd);
vmm_sys_util::ioctl_iow_nr!(KVM_SIGNAL_MSI, kvm_bindings::KVMIO, 0xa5, kvm_bindings::kvm_msi);

/// VM requests a device uses to raise or wire interrupts, from either kind of thread.
fn interrupt_requests() -> Vec<u64> {
    vec![KVM_IRQ_LINE(), KVM_SIGNAL_MSI(), KVM_IRQFD(), KVM_IOEVENTFD()]
}

/// What every thread of the VMM needs.
fn common(rules: &mut Rules) -> seccompiler::Result<()> {
    allow(
        rules,
        &[
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_readv,
            libc::SYS_writev,
            libc::SYS_close,
            libc::SYS_futex,
            libc::SYS_sched_yield,
            libc::SYS_nanosleep,
            libc::SYS_clock_nanosleep,
            libc::SYS_clock_gettime,
            libc::SYS_gettid,
            libc::SYS_getpid,
            libc::SYS_getrandom,
            libc::SYS_munmap,
            libc::SYS_mremap,
            libc::SYS_madvise,
            libc::SYS_brk,
            libc::SYS_rt_sigreturn,
            libc::SYS_rt_sigprocmask,
            libc::SYS_sigaltstack,
            libc::SYS_restart_syscall,
            libc::SYS_exit,
            libc::SYS_exit_group,
        ],
    );
    // Memory may be mapped and re-protected, never made executable: a thread that maps
    // code is running code the VMM did not ship.
    let no_exec = || -> seccompiler::Result<Vec<SeccompRule>> {
        let cond = SeccompCondition::new(
            2,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::MaskedEq(libc::PROT_EXEC as u64),
            0,
        )?;
        Ok(vec![SeccompRule::new(vec![cond])?])
    };
    rules.insert(libc::SYS_mmap, no_exec()?);
    rules.insert(libc::SYS_mprotect, no_exec()?);
    // Signals only as the vCPU kick (`vstate::kick`), which a VMM thread sends to a vCPU
    // thread.
    rules.insert(libc::SYS_tgkill, vec![arg_is(2, SeccompCmpArgLen::Dword, libc::SIGRTMIN() as u64 + 1)?]);
    Ok(())
}

/// The KVM vCPU requests the run loop and a state save or restore issue.
fn vcpu_requests() -> Vec<u64> {
    vec![
        KVM_RUN(),
        KVM_GET_REGS(),
        KVM_SET_REGS(),
        KVM_GET_SREGS(),
        KVM_SET_SREGS(),
        KVM_GET_MSRS(),
        KVM_SET_MSRS(),
        KVM_GET_LAPIC(),
        KVM_SET_LAPIC(),
        KVM_GET_CPUID2(),
        KVM_SET_CPUID2(),
        KVM_GET_MP_STATE(),
        KVM_SET_MP_STATE(),
        KVM_GET_VCPU_EVENTS(),
        KVM_SET_VCPU_EVENTS(),
        KVM_GET_DEBUGREGS(),
        KVM_SET_DEBUGREGS(),
        KVM_GET_XSAVE(),
        KVM_SET_XSAVE(),
        KVM_GET_XCRS(),
        KVM_SET_XCRS(),
        KVM_KVMCLOCK_CTRL(),
    ]
}

/// What a thread serving devices needs beyond [`common`]: epoll, eventfds, I/O on open
/// files, Unix sockets.
fn device_rules(rules: &mut Rules) -> seccompiler::Result<()> {
    allow(
        rules,
        &[
            libc::SYS_epoll_create1,
            libc::SYS_epoll_ctl,
            libc::SYS_epoll_wait,
            libc::SYS_epoll_pwait,
            libc::SYS_eventfd2,
            libc::SYS_pread64,
            libc::SYS_pwrite64,
            libc::SYS_preadv,
            libc::SYS_pwritev,
            libc::SYS_lseek,
            libc::SYS_fsync,
            libc::SYS_fdatasync,
            libc::SYS_fallocate,
            libc::SYS_fstat,
            libc::SYS_connect,
            libc::SYS_accept4,
            libc::SYS_sendto,
            libc::SYS_sendmsg,
            libc::SYS_recvfrom,
            libc::SYS_recvmsg,
            libc::SYS_shutdown,
        ],
    );
    // glibc's fstat is newfstatat(fd, "", buf, AT_EMPTY_PATH): allowed for an open
    // descriptor only, never for a path.
    rules.insert(libc::SYS_newfstatat, vec![arg_is(3, SeccompCmpArgLen::Dword, libc::AT_EMPTY_PATH as u64)?]);
    rules.insert(
        libc::SYS_fcntl,
        any_of(1, &[libc::F_GETFL, libc::F_SETFL, libc::F_GETFD, libc::F_SETFD].map(|c| c as u64))?,
    );
    rules.insert(libc::SYS_socket, vec![arg_is(0, SeccompCmpArgLen::Dword, libc::AF_UNIX as u64)?]);
    Ok(())
}

fn rules(kind: ThreadKind) -> seccompiler::Result<Rules> {
    let mut rules = Rules::new();
    common(&mut rules)?;
    let mut requests = interrupt_requests();
    if matches!(kind, ThreadKind::Vcpu | ThreadKind::VcpuDevices) {
        requests.extend(vcpu_requests());
    }
    if matches!(kind, ThreadKind::Vmm | ThreadKind::VcpuDevices) {
        device_rules(&mut rules)?;
        requests.push(libc::FIONBIO);
    }
    rules.insert(libc::SYS_ioctl, any_of(1, &requests)?);
    Ok(rules)
}
