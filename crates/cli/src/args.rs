//! Command-line arguments.

use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// Refuses a snapshot name the shared naming rule refuses, before anything runs.
fn snapshot_name(s: &str) -> Result<String, String> {
    branchbox_model::Name::parse("snapshot name", s).map(|n| n.to_string()).map_err(|e| e.to_string())
}

/// Refuses a ref name the shared naming rule refuses, before anything runs.
fn ref_name(s: &str) -> Result<String, String> {
    branchbox_model::Name::parse("ref name", s).map(|n| n.to_string()).map_err(|e| e.to_string())
}

/// branchbox: sandboxes for AI agents that you can snapshot, fork and restore.
#[derive(Debug, Parser)]
#[command(name = "branchbox", version, about)]
pub struct Cli {
    /// Data directory (metadata, sandboxes, snapshots, images).
    #[arg(long, global = true, env = "BRANCHBOX_DATA")]
    pub data_dir: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Cmd,
}

/// Which backend to use.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum BackendArg {
    /// microvm where Linux guests can run, gvisor elsewhere.
    Auto,
    /// branchbox's own KVM microVMs.
    Microvm,
    /// gVisor (runsc).
    Gvisor,
}

/// Options for new sandboxes.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Isolation backend.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// Memory limit, MiB.
    #[arg(long)]
    pub memory: Option<u64>,
    /// CPU limit.
    #[arg(long)]
    pub cpus: Option<u32>,
    /// Process limit.
    #[arg(long)]
    pub pids: Option<u32>,
    /// Start from this template's last build (`branchbox template ls`); its env, workdir and
    /// user apply to every command. Limits, image and backend come from the template.
    #[arg(long, conflicts_with_all = ["memory", "cpus", "pids", "image", "network", "allow", "deny_all", "open_ports"])]
    pub template: Option<String>,
    /// Give the sandbox a network: public internet allowed; private ranges,
    /// link-local and the cloud metadata address refused (docs/network.md).
    #[arg(long)]
    pub network: bool,
    /// A network that reaches only this CIDR or host name (`pypi.org`, `*.github.com`: what
    /// the sandbox's resolver answers for it); repeatable, at most 256; implies --network.
    #[arg(long = "allow", value_name = "CIDR|HOST", conflicts_with = "deny_all")]
    pub allow: Vec<String>,
    /// A network that reaches nothing (its policy can be changed later); implies --network.
    #[arg(long)]
    pub deny_all: bool,
    /// Open the sandbox's exposed ports to every local user of the host at `branchbox host`'s
    /// address; without it only root and the service's user reach them there, everyone else
    /// through the service's proxy with its token (docs/network.md). Needs a network.
    #[arg(long)]
    pub open_ports: bool,
    /// Image: `default`, `minimal`, or a name given to `branchbox image import`.
    #[arg(long, default_value = branchbox_image::DEFAULT_IMAGE)]
    pub image: String,
}

/// How to run a command.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Run the words as one shell line (`/bin/sh -c`).
    #[arg(long, short = 's')]
    pub shell: bool,
    /// Environment variable KEY=VALUE (repeatable).
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Working directory inside the sandbox.
    #[arg(long)]
    pub cwd: Option<String>,
    /// Kill the command's whole process group after this many seconds.
    #[arg(long)]
    pub timeout: Option<f64>,
    /// Most output bytes to return (at most 16 MiB, the default); the rest is dropped and reported.
    #[arg(long)]
    pub output_cap: Option<u64>,
    /// Pass this process's standard input to the command.
    #[arg(long, short = 'i')]
    pub stdin: bool,
    /// The command and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// What this host can run and which backend `auto` picks.
    Doctor,
    /// Serve the sandboxes as Model Context Protocol tools over stdin and stdout, for agents
    /// that speak MCP (docs/mcp.md).
    Mcp,
    /// Images.
    Image {
        #[command(subcommand)]
        command: ImageCmd,
    },
    /// Linux guests: the guest kernel and the ext4 root disk (cached by recipe hash).
    Guest {
        #[command(subcommand)]
        command: GuestCmd,
    },
    /// Create a sandbox, run one command in it, print its output and destroy it.
    Run {
        #[command(flatten)]
        create: CreateArgs,
        #[command(flatten)]
        exec: ExecArgs,
    },
    /// Create a sandbox and print its id.
    Create {
        #[command(flatten)]
        create: CreateArgs,
    },
    /// Run a command in a sandbox; exits with the command's exit code.
    Exec {
        /// Sandbox id.
        id: String,
        #[command(flatten)]
        exec: ExecArgs,
    },
    /// Start a background process in a sandbox and print its pid.
    Spawn {
        /// Sandbox id.
        id: String,
        #[command(flatten)]
        exec: ExecArgs,
    },
    /// Show a networked sandbox's egress policy and counters, or change the policy while it
    /// runs (docs/network.md).
    Egress {
        /// Sandbox id.
        id: String,
        /// Allow every public destination (private ranges stay refused).
        #[arg(long, conflicts_with_all = ["allow", "deny_all"])]
        internet: bool,
        /// Allow only this CIDR or host name (repeatable, at most 256).
        #[arg(long = "allow", value_name = "CIDR|HOST", conflicts_with = "deny_all")]
        allow: Vec<String>,
        /// Allow nothing.
        #[arg(long)]
        deny_all: bool,
    },
    /// Print the address (HOST:PORT) at which the host reaches a TCP server listening in a
    /// networked sandbox on PORT (docs/network.md).
    Host {
        /// Sandbox id.
        id: String,
        /// The port the server listens on inside the sandbox.
        port: u16,
    },
    /// List a sandbox's background processes.
    Ps {
        /// Sandbox id.
        id: String,
    },
    /// Files in a sandbox.
    Files {
        #[command(subcommand)]
        command: FilesCmd,
    },
    /// Fork a running sandbox into children that continue from its current state.
    Fork {
        /// Sandbox id.
        id: String,
        /// Number of children.
        #[arg(short = 'n', long, default_value_t = 1)]
        count: usize,
    },
    /// Capture a running sandbox's full state; it keeps running.
    Snapshot {
        /// Sandbox id.
        id: String,
        /// A name to restore it by (docs/limits.md gives the naming rule).
        #[arg(long, value_parser = snapshot_name)]
        name: Option<String>,
        /// Let `gc` delete it after this many seconds.
        #[arg(long)]
        ttl: Option<u64>,
    },
    /// Checkpoint a running sandbox for a later rollback; it keeps running.
    Checkpoint {
        /// Sandbox id.
        id: String,
        /// A name to roll back to (docs/limits.md gives the naming rule).
        #[arg(long, value_parser = snapshot_name)]
        name: Option<String>,
    },
    /// Return a running sandbox, in place, to one of its snapshots or checkpoints.
    Rollback {
        /// Sandbox id.
        id: String,
        /// Snapshot id, name or ref (taken of this sandbox).
        snapshot: String,
    },
    /// Step-history mode: every exec ends with a checkpoint, so each command is a branch point.
    History {
        /// Sandbox id.
        id: String,
        /// on or off.
        #[arg(value_parser = ["on", "off"])]
        mode: String,
    },
    /// Draw the lineage: snapshots under their parents, sandboxes under their snapshot.
    Log,
    /// Files added, changed and removed between two snapshots.
    Diff {
        /// Older snapshot (id, name or ref).
        from: String,
        /// Newer snapshot (id, name or ref).
        to: String,
    },
    /// Named refs that point at snapshots (and can be moved).
    Ref {
        #[command(subcommand)]
        command: RefCmd,
    },
    /// Report and free what nothing can reach: expired snapshots, unnamed fork points nothing
    /// reaches, interrupted snapshots, lost sandboxes, unused images.
    Gc {
        /// Only report.
        #[arg(long)]
        dry_run: bool,
    },
    /// List snapshots.
    Snapshots,
    /// Delete snapshots (each refused while other snapshots descend from it, unless --cascade).
    Rmsnap {
        /// Snapshot ids or names.
        #[arg(required = true)]
        snapshots: Vec<String>,
        /// Delete descendant snapshots too.
        #[arg(long)]
        cascade: bool,
    },
    /// Start a new sandbox from a snapshot.
    Restore {
        /// Snapshot id or name.
        snapshot: String,
    },
    /// List sandboxes.
    Ls {
        /// Also list the restore shells (sandboxes started ahead of time for forks; docs/architecture.md).
        #[arg(long)]
        all: bool,
    },
    /// The data directory's metadata databases: check, back up, restore.
    Store {
        #[command(subcommand)]
        command: StoreCmd,
    },
    /// Pause a sandbox.
    Pause {
        /// Sandbox id.
        id: String,
    },
    /// Resume a paused sandbox.
    Resume {
        /// Sandbox id.
        id: String,
    },
    /// Destroy sandboxes.
    Kill {
        /// Sandbox ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Portable snapshots in an S3-compatible store: push, pull, gc (docs/remote.md).
    Remote {
        #[command(flatten)]
        store: crate::remote_snapshots::RemoteArgs,
        #[command(subcommand)]
        command: crate::remote_snapshots::RemoteCmd,
    },
    /// Warm pools of ready sandboxes, kept by branchboxd (see docs/pools.md).
    Pool {
        #[command(subcommand)]
        command: PoolCmd,
    },
    /// Benchmarks (see docs/benchmarks.md).
    Bench {
        #[command(subcommand)]
        command: BenchCmd,
    },
    /// Templates: a base and steps, each step's result cached as a snapshot (docs/templates.md).
    Template {
        #[command(subcommand)]
        command: TemplateCmd,
    },
    /// Linux guests in the microVM engine, booted directly (see docs/boot.md).
    Vm {
        #[command(subcommand)]
        command: VmCmd,
    },
}

/// Options of the time-travel benchmarks.
#[derive(Debug, Args)]
pub struct TravelArgs {
    /// Backend to measure.
    #[arg(long, value_enum, default_value_t = BackendArg::Gvisor)]
    pub backend: BackendArg,
    /// Timed runs per figure (gvisor).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// A short version for CI.
    #[arg(long)]
    pub short: bool,
}

/// `branchbox store` subcommands (docs/architecture.md, "Metadata store").
#[derive(Debug, Subcommand)]
pub enum StoreCmd {
    /// Run SQLite's structural check over meta.db and service/service.db; exits 1 when one is corrupt.
    Check,
    /// Copy each database to `<name>.backup` now (branchboxd and every command do it after changes).
    Backup,
    /// Put each corrupt database's backup back (the corrupt file is kept beside it); stop branchboxd first.
    Restore {
        /// Restore even databases that pass their check, and even when branchboxd's url file is present.
        #[arg(long)]
        force: bool,
    },
}

/// Ref subcommands.
#[derive(Debug, Subcommand)]
pub enum RefCmd {
    /// Point a ref at a snapshot (moves it when it exists).
    Set {
        /// Ref name (docs/limits.md gives the naming rule).
        #[arg(value_parser = ref_name)]
        name: String,
        /// Snapshot id or name.
        snapshot: String,
    },
    /// List refs.
    Ls,
    /// Remove refs.
    Rm {
        /// Ref names.
        #[arg(required = true)]
        names: Vec<String>,
    },
}

/// Image subcommands.
#[derive(Debug, Subcommand)]
pub enum ImageCmd {
    /// Build an image (cached by recipe hash; a cache hit takes milliseconds).
    Build {
        /// `default` (python3, pip, venv, git, curl, Node.js, npm), `minimal` (python3), or an
        /// imported name (gets the current agent).
        #[arg(default_value = branchbox_image::DEFAULT_IMAGE)]
        name: String,
    },
    /// Import an OCI image layout (directory or tarball) or a `docker save` tarball as NAME.
    /// No registry is contacted.
    Import {
        /// The name to give it (replaces an import of that name).
        name: String,
        /// The layout directory or tarball.
        path: PathBuf,
        /// Most bytes the layers may unpack to, MiB.
        #[arg(long, default_value_t = 8192)]
        max_mib: u64,
    },
    /// List image names.
    Ls,
    /// Remove an imported image: its name, and its unpacked tree once no other name records
    /// it. Refused for the built-in images and while a live sandbox or a template uses it.
    Rm {
        /// The imported image's name.
        name: String,
    },
}

/// Guest subcommands.
#[derive(Debug, Subcommand)]
pub enum GuestCmd {
    /// Build the guest kernel (vmlinux and bzImage) from Debian's linux-source-6.12 and the
    /// fragments in images/kernel/, or find it in the cache. With BRANCHBOX_KERNEL set, report
    /// that kernel instead and build nothing.
    Kernel {
        /// Print only the kernel's cache directory (vmlinux, bzImage, config, build.log), or
        /// the file BRANCHBOX_KERNEL names.
        #[arg(long)]
        print_path: bool,
        /// Build from this kernel source tarball instead of Debian's package.
        #[arg(long, value_name = "TARBALL")]
        source: Option<PathBuf>,
        /// Build nothing: report the cached kernel, or fail naming the command that builds it.
        #[arg(long)]
        cached: bool,
    },
    /// Build the ext4 root disk from an image with the agent as /sbin/init, or find it in the
    /// cache. Never write the cached file: copy it (or layer over it) per guest.
    Disk {
        /// The image (`default` unless given, as for `create`).
        #[arg(long, default_value = branchbox_image::DEFAULT_IMAGE)]
        image: String,
        /// Print only the path of the cached rootfs.ext4.
        #[arg(long)]
        print_path: bool,
        /// Build nothing: report the cached disk, or fail naming the command that builds it.
        #[arg(long)]
        cached: bool,
    },
}

/// File subcommands.
#[derive(Debug, Subcommand)]
pub enum FilesCmd {
    /// Copy a file out of a sandbox (to stdout when LOCAL is `-` or absent).
    Get {
        /// Sandbox id.
        id: String,
        /// Path in the sandbox.
        path: String,
        /// Local destination.
        local: Option<PathBuf>,
    },
    /// Copy a file into a sandbox (from stdin when LOCAL is `-`).
    Put {
        /// Sandbox id.
        id: String,
        /// Local source.
        local: PathBuf,
        /// Path in the sandbox.
        path: String,
        /// Permission bits, octal.
        #[arg(long)]
        mode: Option<String>,
    },
    /// List a directory in a sandbox.
    Ls {
        /// Sandbox id.
        id: String,
        /// Directory path.
        #[arg(default_value = "/")]
        path: String,
    },
}

/// Benchmark subcommands.
#[derive(Debug, Subcommand)]
pub enum BenchCmd {
    /// Exec round trip through the agent.
    Exec {
        /// Timed runs.
        #[arg(long, default_value_t = 100)]
        runs: usize,
    },
    /// Fork of 1 and N children (gvisor: a Python process holding 50 MiB; microvm: the synthetic
    /// guest with 512 MiB touched, n = 1, 10, 100, against bare-VM shells built in the same run).
    Fork {
        /// Backend to measure.
        #[arg(long, value_enum, default_value_t = BackendArg::Gvisor)]
        backend: BackendArg,
        /// Touched memory of the source, MiB (default: 50 for gvisor, 512 for microvm).
        #[arg(long)]
        mib: Option<u64>,
        /// Width of the widest fork (default: 10 for gvisor, 100 for microvm).
        #[arg(long)]
        children: Option<usize>,
        /// Timed runs per width.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// A short version for CI (small memory, few children).
        #[arg(long)]
        short: bool,
        /// microvm only: fork into pre-started VMM processes (one per child) and compare with
        /// the in-process fork (`branchbox-vmm` must sit next to this program, or be named by
        /// BRANCHBOX_VMM).
        #[arg(long)]
        processes: bool,
    },
    /// Checkpoint in place with 1, 10, 100 MiB dirtied since the last one.
    Checkpoint(TravelArgs),
    /// Rollback in place with 1, 10, 100 MiB dirtied since the checkpoint.
    Rollback(TravelArgs),
    /// Ten one-child branches in a row from a live source, with its pause window.
    Branch(TravelArgs),
    /// Spawn from snapshots at chain depth 0, 1, 2, 3.
    Chain(TravelArgs),
    /// Sandboxes under a random mix of normal and hostile workloads, forks, checkpoints,
    /// rollbacks and kills (gvisor); fails if a sandbox was lost or anything leaked.
    Soak {
        /// Sandboxes alive at once.
        #[arg(long, default_value_t = 20)]
        sandboxes: usize,
        /// How long, seconds.
        #[arg(long, default_value_t = 600)]
        seconds: u64,
        /// Seed of the random mix (default: from the clock; the report names it).
        #[arg(long)]
        seed: Option<u64>,
        /// A short version for CI (4 sandboxes, 20 s).
        #[arg(long)]
        short: bool,
    },
    /// What a network adds to create and fork, and connection setup and throughput from inside
    /// a sandbox against its router namespace over the same uplink (gvisor, root; the uplinks
    /// end in a namespace of the benchmark's own).
    Net {
        /// Creates and forks with and without a network, each.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Connections timed from each side.
        #[arg(long, default_value_t = 50)]
        connects: usize,
        /// MiB of each bulk transfer.
        #[arg(long, default_value_t = 256)]
        mib: u64,
        /// Bulk transfers from each side.
        #[arg(long, default_value_t = 3)]
        transfers: usize,
        /// A short version for CI (2 runs, 10 connects, one 16 MiB transfer).
        #[arg(long)]
        short: bool,
    },
    /// Claims from a warm pool of paused microVM children (synthetic guest): a fresh identity
    /// written, then the guest's first answer, against a ping to a running child. gvisor pools
    /// live in branchboxd: `branchbox pool bench`.
    Claim {
        /// Guest RAM of the pooled snapshot, MiB.
        #[arg(long, default_value_t = 512)]
        mib: u64,
        /// Children kept ready in the pool.
        #[arg(long, default_value_t = 16)]
        pool: usize,
        /// Timed claims.
        #[arg(long, default_value_t = 200)]
        claims: usize,
        /// A short version for CI.
        #[arg(long)]
        short: bool,
    },
    /// Host memory each idle microVM child adds (synthetic guest).
    Density {
        /// Guest RAM of the parent, MiB.
        #[arg(long, default_value_t = 512)]
        mib: u64,
        /// Idle children.
        #[arg(long, default_value_t = 100)]
        children: usize,
        /// A short version for CI.
        #[arg(long)]
        short: bool,
    },
}

/// Pool subcommands.
#[derive(Debug, Subcommand)]
pub enum PoolCmd {
    /// Create a pool of ready sandboxes restored from a snapshot (or a template).
    Create {
        /// Pool name.
        name: String,
        /// Snapshot id or name the pool's sandboxes are restored from.
        #[arg(long, conflicts_with = "template", required_unless_present = "template")]
        snapshot: Option<String>,
        /// Template whose final snapshot the pool's sandboxes are restored from.
        #[arg(long)]
        template: Option<String>,
        /// Ready sandboxes to keep.
        #[arg(long)]
        size: u32,
        /// Replace ready sandboxes older than this, seconds (service default: 3600).
        #[arg(long)]
        max_idle: Option<f64>,
        /// Keep ready sandboxes paused instead of running idle (a claim then resumes one).
        #[arg(long)]
        paused: bool,
    },
    /// Change a pool's size or idle age: a smaller size destroys the oldest ready sandboxes
    /// beyond it (claimed ones stay), a larger one starts a refill.
    #[command(group(ArgGroup::new("change").required(true).multiple(true).args(["size", "max_idle"])))]
    Set {
        /// Pool name.
        name: String,
        /// Ready sandboxes to keep.
        #[arg(long)]
        size: Option<u32>,
        /// Replace ready sandboxes older than this, seconds.
        #[arg(long)]
        max_idle: Option<f64>,
    },
    /// List pools with how full they are.
    Ls,
    /// Delete a pool and destroy its ready sandboxes (claimed ones stay).
    Rm {
        /// Pool name.
        name: String,
    },
    /// Claim a ready sandbox (fresh identity, then env, metadata and files); prints its id.
    Claim {
        /// Pool name.
        name: String,
        /// Environment for every command run through the service, KEY=VALUE (repeatable).
        #[arg(long = "env")]
        env: Vec<String>,
        /// Metadata, KEY=VALUE (repeatable).
        #[arg(long = "meta")]
        meta: Vec<String>,
        /// A file to write into the sandbox, LOCAL_PATH:SANDBOX_PATH (repeatable).
        #[arg(long = "file")]
        file: Vec<String>,
        /// Wait this long for a ready sandbox when the pool is empty, seconds (service default: 30).
        #[arg(long)]
        wait: Option<f64>,
        /// When the pool is empty, start a sandbox at once (reported as `source: cold`).
        #[arg(long)]
        allow_cold: bool,
        /// The claimed sandbox's timeout, seconds (service default applies otherwise).
        #[arg(long)]
        timeout: Option<f64>,
    },
    /// Benchmark a pool: refill rate, memory per ready sandbox, and claim-to-agent-answer
    /// latency next to a bare agent round trip through the service (docs/benchmarks.md).
    Bench {
        /// Snapshot id or name to pool.
        #[arg(long)]
        snapshot: String,
        /// Ready sandboxes in the pool.
        #[arg(long, default_value_t = 4)]
        size: u32,
        /// Timed claims (each from a full pool).
        #[arg(long, default_value_t = 20)]
        claims: usize,
    },
}

/// Template subcommands.
#[derive(Debug, Subcommand)]
pub enum TemplateCmd {
    /// Build a template, reusing every cached step before the first changed one.
    Build {
        /// Template name (required for a Dockerfile; overrides a TOML file's `name`).
        name: Option<String>,
        /// The definition: a `.toml` template file, or a Dockerfile (FROM, RUN, COPY, ENV,
        /// WORKDIR, USER).
        #[arg(short = 'f', long = "file", value_name = "FILE")]
        file: PathBuf,
        /// Directory uploads and COPY read from (default: the file's directory).
        #[arg(long, value_name = "DIR")]
        context: Option<PathBuf>,
    },
    /// List templates.
    Ls,
    /// Remove templates and release their cached steps.
    Rm {
        /// Template names.
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Print the log of a template's last build.
    Log {
        /// Template name.
        name: String,
    },
}

/// MicroVM subcommands.
#[derive(Debug, Subcommand)]
pub enum VmCmd {
    /// Boot a Linux guest (vmlinux) until it resets, powers off, fails or the timeout ends it.
    Boot(BootArgs),
}

/// Options of `vm boot`.
#[derive(Debug, Args)]
pub struct BootArgs {
    /// The uncompressed kernel (vmlinux ELF), e.g. from `branchbox guest kernel --print-path`.
    #[arg(long)]
    pub kernel: PathBuf,
    /// Root disk (ext4), used read-only under an overlay in the work directory (/dev/vda).
    #[arg(long)]
    pub disk: Option<PathBuf>,
    /// Kernel command line (the virtio-mmio devices are described in the ACPI tables).
    #[arg(long, default_value = "console=ttyS0 pci=off")]
    pub cmdline: String,
    /// Guest RAM, MiB.
    #[arg(long, default_value_t = 512)]
    pub mem_mib: u64,
    /// vCPUs.
    #[arg(long, default_value_t = 1)]
    pub vcpus: u8,
    /// Directory for the serial log, the disk overlay and the vsock socket (`vsock.sock`:
    /// connect, send `CONNECT <port>\n`). A temporary one when absent.
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Stop the guest after this many seconds.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
}
