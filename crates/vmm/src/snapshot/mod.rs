//! Snapshots: one trait every stateful part implements, and the file that holds them all.
//!
//! A snapshot is a directory with a state file ([`STATE_FILE`], format in [`format`]) and the
//! memory layer files it names by relative name. The state is a tree that mirrors the VM:
//! [`MachineState`] holds the VM-wide KVM state, every vCPU's state, the memory's layer
//! reference and every device's state, each produced by that part's [`Snapshottable`] impl.

pub mod format;

use crate::devices::BusState;
use crate::error::{Error, Result};
use crate::memory::MemoryState;
use crate::vm::VmConfig;
use crate::vstate::{VcpuState, VmState};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Name of the state file inside a snapshot directory.
pub const STATE_FILE: &str = "vm.state";

/// A part of a VM whose state a snapshot must carry.
///
/// Both methods are required: a part that forgot to save its state would otherwise compile
/// and silently lose it on restore.
pub trait Snapshottable {
    /// The part's saved state.
    type State;
    /// Captures the part's state; the VM is paused.
    fn save(&mut self, ctx: &mut SaveContext) -> Result<Self::State>;
    /// Puts the part back into `state`; the VM has not run since it was built.
    fn restore(&mut self, state: &Self::State, ctx: &RestoreContext) -> Result<()>;
}

/// Where a snapshot being taken writes its files.
pub struct SaveContext {
    dir: PathBuf,
}

impl SaveContext {
    /// A context writing into the existing directory `dir`.
    pub fn new(dir: &Path) -> SaveContext {
        SaveContext { dir: dir.to_path_buf() }
    }

    /// The snapshot directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// The opened files a restore reads from, shared by every child of one snapshot.
pub struct RestoreContext {
    layer: Arc<File>,
}

impl RestoreContext {
    /// The memory layer the restored RAM maps.
    pub fn layer(&self) -> &File {
        &self.layer
    }
}

/// Everything a snapshot holds about one VM.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MachineState {
    /// Shape of the VM (RAM size, vCPU count, in-kernel irqchip).
    pub config: VmConfig,
    /// VM-wide KVM state (clock, irqchip, PIT).
    pub vm: VmState,
    /// One state per vCPU, in vCPU id order.
    pub vcpus: Vec<VcpuState>,
    /// The memory layer holding guest RAM.
    pub memory: MemoryState,
    /// Devices on the MMIO bus.
    pub mmio: BusState,
    /// Devices on the port I/O bus.
    pub pio: BusState,
}

/// A snapshot opened for restoring: its state parsed and checked, its memory layer opened.
///
/// Opening is done once; every child forked from it reuses the parsed state and the open
/// layer file, so the spawn path neither parses nor opens anything.
pub struct Snapshot {
    dir: PathBuf,
    state: MachineState,
    ctx: RestoreContext,
}

impl Snapshot {
    /// Reads and checks `dir/vm.state` and opens the memory layer it names.
    pub fn open(dir: &Path) -> Result<Snapshot> {
        let path = dir.join(STATE_FILE);
        let state = format::read_state_file(&path)?;
        let layer_path = dir.join(&state.memory.layer);
        let layer = File::open(&layer_path)
            .map_err(|source| Error::LayerMissing { path: layer_path.clone(), source })?;
        let found = layer
            .metadata()
            .map_err(|source| Error::LayerMissing { path: layer_path.clone(), source })?
            .len();
        if found != state.memory.size {
            return Err(Error::LayerSize { path: layer_path, found, expected: state.memory.size });
        }
        Ok(Snapshot { dir: dir.to_path_buf(), state, ctx: RestoreContext { layer: Arc::new(layer) } })
    }

    /// The snapshot directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The parsed machine state.
    pub fn state(&self) -> &MachineState {
        &self.state
    }

    /// The opened files restores read from.
    pub fn context(&self) -> &RestoreContext {
        &self.ctx
    }
}
