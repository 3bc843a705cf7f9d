//! Host-side cost of a Linux guest's snapshot and restore, in one process (no VMM process
//! or control socket on the clock): boots the project's kernel, pauses it once its serial log
//! shows `Command line:` (mid-boot: works under PVM too), then times
//!
//! - **pause**: `StopHandle::pause` until every vCPU is parked;
//! - **save**: `Snapshotter::save` (CPU and device state, disk freeze, memory file, state
//!   file, all durable);
//! - **restore**: `LinuxVm::restore` (map the memory file, build the VM and its devices, fork
//!   the disk, load state) plus starting the run, until the vCPUs run the guest again;
//!
//! and, as the floor, copying the memory file's data (its holes skipped: `SEEK_DATA`) to a
//! new sparse file with `fsync` (what any save writing the same bytes durably costs at least) and `KVM_CREATE_VM` plus its RAM slot.
//!
//! ```text
//! linux_snapshot_bench [--mem-mib 64] [--runs 5] [--dir DIR]
//! ```
//! Printed, not asserted. `DIR` (default: a temporary directory under /tmp) holds the
//! snapshots and the disk store.

use branchbox_disk::{LayeredBackend, Store};
use branchbox_guest_tests::artifacts;
use branchbox_vmm::linux::{LinuxRestore, LinuxVm, LinuxVmConfig, DEFAULT_SERIAL_LOG_CAP};
use branchbox_vmm::Hypervisor;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

struct Args {
    mem_mib: u64,
    runs: usize,
    dir: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args { mem_mib: 64, runs: 5, dir: None };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
        match a.as_str() {
            "--mem-mib" => args.mem_mib = v.parse().map_err(|_| format!("--mem-mib {v}: not a number"))?,
            "--runs" => {
                args.runs = v.parse().ok().filter(|n| (1..=100).contains(n)).ok_or("--runs: 1 to 100")?
            }
            "--dir" => args.dir = Some(v.into()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn summary(name: &str, mut v: Vec<f64>) {
    v.sort_by(f64::total_cmp);
    println!(
        "{name:>28}: min {:8.2} ms  median {:8.2} ms  max {:8.2} ms",
        v[0],
        v[v.len() / 2],
        v[v.len() - 1]
    );
}

fn wait_for(log: &Path, line: &str) -> Result<(), String> {
    let start = Instant::now();
    while !String::from_utf8_lossy(&std::fs::read(log).unwrap_or_default()).contains(line) {
        if start.elapsed() > Duration::from_secs(120) {
            return Err(format!("no {line:?} in {} after 120 s", log.display()));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

/// Copies the data of sparse file `from` (holes skipped) into a new file `to`, durably.
fn copy_data(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    let src = std::fs::File::open(from)?;
    let dst = std::fs::File::create(to)?;
    let len = src.metadata()?.len();
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    while at < len {
        let seek = |from: u64, whence| -> std::io::Result<u64> {
            // SAFETY: lseek on an open descriptor; the offset is within the file.
            let r = unsafe { libc::lseek(src.as_raw_fd(), from as libc::off_t, whence) };
            if r < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(r as u64)
            }
        };
        let data = match seek(at, libc::SEEK_DATA) {
            Ok(d) => d,
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => break,
            Err(e) => return Err(e),
        };
        at = data;
        let hole = seek(at, libc::SEEK_HOLE)?;
        while at < hole {
            let n = buf.len().min((hole - at) as usize);
            src.read_exact_at(&mut buf[..n], at)?;
            dst.write_all_at(&buf[..n], at)?;
            at += n as u64;
        }
    }
    dst.set_len(len)?;
    dst.sync_all()
}

fn main() -> Result<(), String> {
    let args = parse_args()?;
    let kernel = artifacts::vmlinux()?;
    let disk = artifacts::root_disk()?;
    let scratch = tempfile::tempdir_in("/tmp").map_err(|e| e.to_string())?;
    let dir = args.dir.clone().unwrap_or_else(|| scratch.path().to_path_buf());
    let hv = Hypervisor::open().map_err(|e| e.to_string())?;
    let store = Store::open(&dir.join("disk")).map_err(|e| e.to_string())?;
    let mem_size = args.mem_mib << 20;
    let (mut pause, mut save, mut restore, mut copy, mut shell) = (vec![], vec![], vec![], vec![], vec![]);
    let mut file_bytes = 0;
    for run in 0..args.runs {
        let work = dir.join(format!("run{run}"));
        let snap = work.join("snap");
        std::fs::create_dir_all(&snap).map_err(|e| e.to_string())?;
        let log = work.join("serial.log");
        let config = LinuxVmConfig {
            kernel: kernel.clone(),
            cmdline: "console=ttyS0 earlyprintk=serial,ttyS0,115200 pci=off".into(),
            mem_size,
            vcpus: 1,
            serial_log: log.clone(),
            serial_log_cap: DEFAULT_SERIAL_LOG_CAP,
        };
        let mut vm = LinuxVm::new(&hv, config).map_err(|e| e.to_string())?;
        let chain =
            LayeredBackend::create(&store, &format!("source{run}"), &disk).map_err(|e| e.to_string())?;
        vm.add_layered_block(store.clone(), chain, "rootfs").map_err(|e| e.to_string())?;
        vm.boot().map_err(|e| e.to_string())?;
        let stop = vm.stop_handle();
        let snapshotter = vm.snapshotter();
        let source = std::thread::spawn(move || vm.run());
        wait_for(&log, "Command line:")?;

        let t = Instant::now();
        stop.pause(Duration::from_secs(10))?;
        pause.push(ms(t.elapsed()));
        let t = Instant::now();
        snapshotter.save(&snap).map_err(|e| e.to_string())?;
        save.push(ms(t.elapsed()));
        stop.stop();
        let _ = source.join();

        let memory = snap.join("memory.bin");
        file_bytes =
            std::fs::metadata(&memory).map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512).unwrap_or(0);
        let t = Instant::now();
        let copied = work.join("memory.copy");
        copy_data(&memory, &copied).map_err(|e| format!("copy {}: {e}", memory.display()))?;
        copy.push(ms(t.elapsed()));

        let t = Instant::now();
        let bare = LinuxVm::new(
            &hv,
            LinuxVmConfig {
                kernel: kernel.clone(),
                cmdline: String::new(),
                mem_size,
                vcpus: 1,
                serial_log: work.join("bare.log"),
                serial_log_cap: DEFAULT_SERIAL_LOG_CAP,
            },
        )
        .map_err(|e| e.to_string())?;
        shell.push(ms(t.elapsed()));
        drop(bare);

        let opts = LinuxRestore {
            serial_log: work.join("restored.log"),
            serial_log_cap: DEFAULT_SERIAL_LOG_CAP,
            vsock_socket: None,
            disk_store: work.join("restored-disk"),
            disk_chain: "restored".into(),
            net: None,
        };
        let t = Instant::now();
        let vm = LinuxVm::restore(&hv, &snap, &opts).map_err(|e| e.to_string())?;
        let stop = vm.stop_handle();
        let restored = std::thread::spawn(move || vm.run());
        restore.push(ms(t.elapsed()));
        // The restored guest goes on printing where the source stopped.
        wait_for(&work.join("restored.log"), "\n")?;
        stop.stop();
        let _ = restored.join();
        let _ = writeln!(std::io::stderr(), "run {run} done");
    }
    println!(
        "Linux guest snapshot, {} MiB RAM, {} runs (memory file: {} MiB allocated)",
        args.mem_mib,
        args.runs,
        file_bytes >> 20
    );
    summary("pause (vCPUs parked)", pause);
    summary("save (pause -> files)", save);
    summary("floor: copy data + fsync", copy);
    summary("restore (files -> running)", restore);
    summary("floor: a bare Linux VM", shell);
    Ok(())
}
