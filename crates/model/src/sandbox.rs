//! Sandboxes, snapshots and images as the metadata store records them.

use crate::ids::{SandboxId, SnapshotId};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// How a sandbox is isolated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// branchbox's own KVM VMM.
    Microvm,
    /// gVisor's runsc.
    Gvisor,
}

impl BackendKind {
    /// The name used on the command line and in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Microvm => "microvm",
            BackendKind::Gvisor => "gvisor",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BackendKind {
    type Err = crate::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "microvm" => Ok(BackendKind::Microvm),
            "gvisor" => Ok(BackendKind::Gvisor),
            _ => {
                Err(crate::Error::InvalidInput(format!("unknown backend {s:?}: use microvm, gvisor or auto")))
            }
        }
    }
}

/// Resource limits of one sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Memory, MiB.
    pub memory_mib: u64,
    /// CPUs (a CFS quota of this many CPUs).
    pub cpus: u32,
    /// Most processes and threads.
    pub pids: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { memory_mib: 1024, cpus: 1, pids: 512 }
    }
}

impl Limits {
    /// Refuses limits no sandbox can run with.
    pub fn validate(&self) -> crate::Result<()> {
        if !(64..=1024 * 1024).contains(&self.memory_mib) {
            return Err(crate::Error::InvalidInput(format!(
                "memory limit {} MiB is out of range (64 MiB .. 1 TiB)",
                self.memory_mib
            )));
        }
        if !(1..=1024).contains(&self.cpus) {
            return Err(crate::Error::InvalidInput(format!(
                "cpu limit {} is out of range (1..1024)",
                self.cpus
            )));
        }
        if !(16..=1_000_000).contains(&self.pids) {
            return Err(crate::Error::InvalidInput(format!(
                "pids limit {} is out of range (16..1000000)",
                self.pids
            )));
        }
        Ok(())
    }
}

/// Lifecycle state of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Running.
    Running,
    /// Paused: its processes are stopped, its state kept.
    Paused,
    /// Its runtime is gone (host reboot, crash); only its record remains.
    Lost,
}

impl SandboxState {
    /// The name used in the store and in output.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
            SandboxState::Lost => "lost",
        }
    }
}

impl FromStr for SandboxState {
    type Err = crate::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "running" => Ok(SandboxState::Running),
            "paused" => Ok(SandboxState::Paused),
            "lost" => Ok(SandboxState::Lost),
            _ => Err(crate::Error::Store(format!("unknown sandbox state {s:?}"))),
        }
    }
}

/// A sandbox as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sandbox {
    /// Its id.
    pub id: SandboxId,
    /// Its backend.
    pub backend: BackendKind,
    /// The image it runs.
    pub image: String,
    /// Current state.
    pub state: SandboxState,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_ms: i64,
    /// The snapshot it was restored or forked from.
    pub parent_snapshot: Option<SnapshotId>,
    /// Its limits.
    pub limits: Limits,
    /// Step-history mode: every exec ends with a checkpoint.
    pub history: bool,
}

/// Why a snapshot was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotKind {
    /// Asked for by name or by `snapshot`.
    Snapshot,
    /// Taken for a later rollback of the same sandbox.
    Checkpoint,
    /// Taken to fork children.
    ForkPoint,
}

impl SnapshotKind {
    /// The name used in the store and in output.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotKind::Snapshot => "snapshot",
            SnapshotKind::Checkpoint => "checkpoint",
            SnapshotKind::ForkPoint => "fork_point",
        }
    }
}

impl FromStr for SnapshotKind {
    type Err = crate::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "snapshot" => Ok(SnapshotKind::Snapshot),
            "checkpoint" => Ok(SnapshotKind::Checkpoint),
            "fork_point" => Ok(SnapshotKind::ForkPoint),
            _ => Err(crate::Error::Store(format!("unknown snapshot kind {s:?}"))),
        }
    }
}

/// An immutable snapshot as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Its id.
    pub id: SnapshotId,
    /// The snapshot the source sandbox itself came from, if any (the lineage edge).
    pub parent: Option<SnapshotId>,
    /// The sandbox it was taken of.
    pub source: Option<SandboxId>,
    /// Backend that can restore it.
    pub backend: BackendKind,
    /// The image its sandbox ran.
    pub image: String,
    /// Why it was taken.
    pub kind: SnapshotKind,
    /// Optional human name.
    pub name: Option<String>,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_ms: i64,
    /// Bytes on disk.
    pub size_bytes: u64,
    /// The source's limits, which its children inherit.
    pub limits: Limits,
    /// When it may be garbage-collected, milliseconds since the Unix epoch.
    pub expires_ms: Option<i64>,
    /// When its data was deleted (the row stays while others name it as parent).
    pub deleted_ms: Option<i64>,
}
