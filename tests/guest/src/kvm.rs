//! Our VMM with a Linux guest: telling hardware KVM from PVM, and booting the guest to its
//! agent (shared by the hardware-KVM test and the `linux_guest` example).

use branchbox_core::host::{detect_kvm, KvmKind};
use branchbox_protocol::{AgentClient, AGENT_VSOCK_PORT};
use branchbox_vmm::linux::{connect_guest_port, LinuxVm, LinuxVmConfig, RunEnd, StopHandle};
use branchbox_vmm::Hypervisor;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The guest's CID.
pub const GUEST_CID: u64 = 3;

/// `Ok` on a host with hardware virtualization behind `/dev/kvm`; otherwise why not (the
/// same detection `branchbox doctor` reports). PVM hosts have `/dev/kvm` too, but only the
/// `kvm_pvm` module.
pub fn hardware_kvm() -> Result<(), String> {
    let kvm = detect_kvm();
    match kvm.kind {
        KvmKind::Hardware | KvmKind::Emulated => Ok(()),
        _ => Err(kvm.detail),
    }
}

/// A guest booted to its agent.
pub struct Booted {
    /// A connected, greeted agent client.
    pub agent: AgentClient<UnixStream>,
    /// From the start of VM creation to the agent's first answer.
    pub to_first_answer: Duration,
    /// Ends the guest.
    pub stop: StopHandle,
    /// The run; joins with its end.
    pub run: JoinHandle<Result<RunEnd, String>>,
    /// The serial log.
    pub serial_log: PathBuf,
    /// The vsock device's host socket.
    pub vsock_socket: PathBuf,
}

impl Booted {
    /// Stops the guest and returns how its run ended.
    pub fn shutdown(self) -> Result<RunEnd, String> {
        drop(self.agent);
        self.stop.stop();
        self.run.join().map_err(|_| "the run thread panicked".to_string())?
    }
}

/// Boots `kernel` with `disk` (read-only base, overlay in `work`) as `/dev/vda`, vsock and rng,
/// and waits up to `patience` for the agent to answer the protocol's hello.
pub fn boot_to_agent(
    hv: &std::sync::Arc<Hypervisor>,
    kernel: &Path,
    disk: &Path,
    work: &Path,
    extra_cmdline: &str,
    patience: Duration,
) -> Result<Booted, String> {
    let start = Instant::now();
    let serial_log = work.join("serial.log");
    let vsock_socket = work.join("vsock.sock");
    let overlay = work.join("overlay.img");
    let _ = std::fs::remove_file(&overlay);
    let config = LinuxVmConfig {
        kernel: kernel.to_path_buf(),
        cmdline: format!("root=/dev/vda rw console=ttyS0 init=/sbin/init pci=off {extra_cmdline}")
            .trim()
            .to_string(),
        mem_size: 512 << 20,
        vcpus: 2,
        serial_log: serial_log.clone(),
        serial_log_cap: 8 << 20,
    };
    let mut vm = LinuxVm::new(hv, config).map_err(|e| e.to_string())?;
    vm.add_block(disk, &overlay, "rootfs").map_err(|e| e.to_string())?;
    vm.add_vsock(GUEST_CID, &vsock_socket).map_err(|e| e.to_string())?;
    vm.add_rng().map_err(|e| e.to_string())?;
    vm.boot().map_err(|e| e.to_string())?;
    let stop = vm.stop_handle();
    let run = std::thread::spawn(move || vm.run().map_err(|e| e.to_string()));

    loop {
        if run.is_finished() {
            let end = run.join().map_err(|_| "the run thread panicked".to_string())?;
            let log = std::fs::read_to_string(&serial_log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect::<Vec<_>>().into_iter().rev().collect();
            return Err(format!(
                "the guest ended before its agent answered: {end:?}\nserial log tail:\n{}",
                tail.join("\n")
            ));
        }
        if start.elapsed() > patience {
            stop.stop();
            let _ = run.join();
            let log = std::fs::read_to_string(&serial_log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect::<Vec<_>>().into_iter().rev().collect();
            return Err(format!(
                "the agent did not answer within {patience:?}\nserial log tail:\n{}",
                tail.join("\n")
            ));
        }
        if let Ok(stream) = connect_guest_port(&vsock_socket, AGENT_VSOCK_PORT, Duration::from_secs(2)) {
            let mut agent = AgentClient::new(stream);
            if agent.hello().is_ok() {
                let to_first_answer = start.elapsed();
                return Ok(Booted { agent, to_first_answer, stop, run, serial_log, vsock_socket });
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
