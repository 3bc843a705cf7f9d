//! A seeded random walk of guest writes, checkpoints, rollbacks, forks and live branches,
//! checked after every step against a model: each VM's memory is a map page -> seed.

mod common;

use branchbox_vmm::synthetic::testguest::{self, Command, DATA_BASE};
use branchbox_vmm::{fork, fork_live, Checkpoint, ShellPool, Snapshot, Vm, VmConfig};
use std::path::Path;

const PAGE: u64 = 4096;
/// Pages the walk writes and checks (the first qword of each).
const PAGES: usize = 48;
const MAX_VMS: usize = 4;
const STEPS_PER_SEED: usize = 300;
const SEEDS: [u64; 4] = [1, 2, 3, 4];

/// xorshift64*: a tiny seeded generator, so a failure names the seed and step to replay.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A checkpoint in the model: the snapshot once its layer is complete, the memory and
/// answer counter it froze.
struct Saved {
    checkpoint: Option<Checkpoint>,
    snapshot: Option<Snapshot>,
    memory: Vec<u64>,
    seq: u64,
}

impl Saved {
    fn snapshot(&mut self) -> &Snapshot {
        if self.snapshot.is_none() {
            let cp = self.checkpoint.as_mut().expect("a checkpoint or its snapshot");
            self.snapshot = Some(cp.ready().unwrap());
        }
        self.snapshot.as_ref().expect("set above")
    }
}

struct Modelled {
    vm: Vm,
    memory: Vec<u64>,
    seq: u64,
    saved: Vec<Saved>,
}

impl Modelled {
    fn call(&mut self, cmd: Command) -> testguest::Answer {
        let a = testguest::call(&mut self.vm, cmd).unwrap();
        self.seq += 1;
        assert_eq!(a.seq, self.seq, "answer counter (a register) diverged from the model");
        a
    }

    /// Host reads of every page, then the guest checks every run of equal seeds itself.
    fn verify(&mut self, guest: bool, what: &str) {
        for (page, &seed) in self.memory.iter().enumerate() {
            let addr = DATA_BASE + page as u64 * PAGE;
            let value = self.vm.ram().read_u64(addr).unwrap();
            assert_eq!(
                value,
                seed ^ addr,
                "{what}: page {page} holds seed {:#x}, model says {seed:#x}",
                value ^ addr
            );
        }
        if !guest {
            return;
        }
        let mut page = 0;
        while page < PAGES {
            let seed = self.memory[page];
            let len = self.memory[page..].iter().take_while(|&&s| s == seed).count();
            let base = DATA_BASE + page as u64 * PAGE;
            let a = self.call(Command::Check { base, count: len as u64, stride: PAGE, seed });
            assert_eq!(a.status, 0, "{what}: guest found {a:?} in pages {page}..{}", page + len);
            page += len;
        }
    }
}

fn walk(hv: &std::sync::Arc<branchbox_vmm::Hypervisor>, seed: u64, dir: &Path) -> usize {
    let config = VmConfig { mem_size: 8 << 20, ..common::small() };
    let mut pool = ShellPool::new(hv, config);
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut vms =
        vec![Modelled { vm: common::booted(hv, config), memory: vec![1; PAGES], seq: 1, saved: Vec::new() }];
    let first = Command::Fill { base: DATA_BASE, count: PAGES as u64, stride: PAGE, seed: 1 };
    vms[0].call(first);
    let mut names = 0u64;
    let mut fresh = 1000u64;
    for step in 0..STEPS_PER_SEED {
        let v = rng.below(vms.len());
        let what = format!("seed {seed} step {step}");
        match rng.below(10) {
            0..=3 => {
                // Mostly short runs; one write in four up to 24 pages, so rollbacks also move
                // long dirty runs out whole (`GuestRam::drop_pages`).
                let longest = if rng.below(4) == 0 { 24 } else { 8 };
                let (start, len) = (rng.below(PAGES), 1 + rng.below(longest));
                let len = len.min(PAGES - start);
                fresh += 1;
                let m = &mut vms[v];
                let base = DATA_BASE + start as u64 * PAGE;
                m.call(Command::Fill { base, count: len as u64, stride: PAGE, seed: fresh });
                m.memory[start..start + len].fill(fresh);
            }
            4 | 5 => {
                names += 1;
                let m = &mut vms[v];
                let mut cp = m.vm.checkpoint(dir, &format!("s{seed}n{names}")).unwrap();
                // Sometimes the VM runs on before the layer is complete.
                let snapshot = (rng.below(2) == 0).then(|| cp.ready().unwrap());
                m.saved.push(Saved { checkpoint: Some(cp), snapshot, memory: m.memory.clone(), seq: m.seq });
            }
            6 | 7 if !vms[v].saved.is_empty() => {
                let m = &mut vms[v];
                let i = rng.below(m.saved.len());
                let saved = &mut m.saved[i];
                let snapshot = saved.snapshot();
                m.vm.rollback(snapshot).unwrap();
                m.memory = saved.memory.clone();
                m.seq = saved.seq;
            }
            8 if !vms[v].saved.is_empty() && vms.len() < MAX_VMS => {
                let m = &mut vms[v];
                let i = rng.below(m.saved.len());
                let saved = &mut m.saved[i];
                let (memory, seq) = (saved.memory.clone(), saved.seq);
                let vm = fork(saved.snapshot(), 1, &mut pool).pop().unwrap().unwrap();
                vms.push(Modelled { vm, memory, seq, saved: Vec::new() });
            }
            9 if vms.len() < MAX_VMS => {
                names += 1;
                let m = &mut vms[v];
                let mut branch =
                    fork_live(&mut m.vm, dir, &format!("s{seed}n{names}"), 1, &mut pool).unwrap();
                let vm = branch.children.pop().unwrap().unwrap();
                let (memory, seq) = (m.memory.clone(), m.seq);
                m.saved.push(Saved {
                    checkpoint: Some(branch.checkpoint),
                    snapshot: None,
                    memory: memory.clone(),
                    seq,
                });
                vms.push(Modelled { vm, memory, seq, saved: Vec::new() });
            }
            _ if vms.len() > 1 => {
                vms.swap_remove(v);
            }
            _ => {}
        }
        let guest = step % 10 == 0;
        for (i, m) in vms.iter_mut().enumerate() {
            m.verify(guest || i == v, &what);
        }
    }
    STEPS_PER_SEED
}

#[test]
fn random_walk_of_writes_checkpoints_rollbacks_and_forks_matches_the_model() {
    let Some(hv) = common::kvm_or_skip() else { return };
    let mut steps = 0;
    for seed in SEEDS {
        let dir = tempfile::tempdir().unwrap();
        steps += walk(&hv, seed, dir.path());
    }
    assert!(steps >= 1000);
}
