//! What this host can run: which KVM it has, whether Linux microVMs can boot, whether runsc
//! works, and which backend `auto` picks.

use branchbox_model::BackendKind;
use serde::Serialize;
use std::path::Path;

/// The kind of KVM behind `/dev/kvm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvmKind {
    /// Hardware virtualization (VMX or SVM), on bare metal or nested in a virtual machine
    /// whose own CPU is hardware-virtualized.
    Hardware,
    /// VMX or SVM emulated by a software CPU (QEMU's TCG, as `scripts/nested-kvm.sh` runs):
    /// Linux guests run on the real KVM path, correct but all of it emulated, so slowly.
    Emulated,
    /// PVM: software nested virtualization; guest kernels need PVM support.
    Pvm,
    /// No usable `/dev/kvm`.
    None,
}

/// Facts about the host's virtualization.
#[derive(Debug, Clone, Serialize)]
pub struct KvmFacts {
    /// Which KVM.
    pub kind: KvmKind,
    /// How that was decided.
    pub detail: String,
}

/// Reads `/dev/kvm`, `/sys/module` and `/proc/cpuinfo`.
pub fn detect_kvm() -> KvmFacts {
    let dev = std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm");
    if let Err(e) = dev {
        return KvmFacts { kind: KvmKind::None, detail: format!("/dev/kvm cannot be opened: {e}") };
    }
    let module = |m: &str| Path::new("/sys/module").join(m).exists();
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let hw_flag = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    if module("kvm_pvm") && !(module("kvm_intel") || module("kvm_amd")) {
        return KvmFacts {
            kind: KvmKind::Pvm,
            detail: "/dev/kvm is served by kvm_pvm (software nested virtualization, no VMX/SVM)".into(),
        };
    }
    if hw_flag || module("kvm_intel") || module("kvm_amd") {
        if let Some(model) = emulated_cpu(&cpuinfo) {
            return KvmFacts {
                kind: KvmKind::Emulated,
                detail: format!(
                    "/dev/kvm with VMX/SVM emulated by a software CPU ({model}): nested KVM, correct but slow"
                ),
            };
        }
        return KvmFacts {
            kind: KvmKind::Hardware,
            detail: "/dev/kvm with hardware virtualization (VMX/SVM)".into(),
        };
    }
    KvmFacts { kind: KvmKind::None, detail: "/dev/kvm opens but no KVM module was identified".into() }
}

/// The CPU model when `cpuinfo` shows a software-emulated CPU under a hypervisor (QEMU's TCG
/// names itself in the model: "QEMU TCG CPU version ..."), else `None`.
fn emulated_cpu(cpuinfo: &str) -> Option<String> {
    let first = |key: &str| {
        cpuinfo
            .lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == key))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    let under_hypervisor = first("flags").is_some_and(|f| f.split_whitespace().any(|x| x == "hypervisor"));
    let model = first("model name")?;
    (under_hypervisor && model.contains("TCG")).then_some(model)
}

/// Why Linux microVMs cannot run here, or `None` when they can.
pub fn linux_microvm_blocker(kvm: &KvmFacts) -> Option<String> {
    match kvm.kind {
        KvmKind::None => Some(format!("no usable KVM: {}", kvm.detail)),
        KvmKind::Pvm => Some(
            "PVM emulates guest kernel code ~1000x slower: a Linux kernel stops at its first unsupported \
             instruction (`branchbox vm boot` shows how far it gets), and a PVM guest kernel fails the same way"
                .into(),
        ),
        KvmKind::Hardware | KvmKind::Emulated => None,
    }
}

/// Why `auto` does not pick microvm even where Linux microVMs run: its snapshot, restore, fork
/// and rollback have not run end to end on hardware KVM (`docs/microvm.md`, "The microvm
/// backend").
pub const MICROVM_NOT_AUTO: &str = "the microvm backend runs sandboxes here (create, exec, files, snapshot, \
     restore, fork, rollback, kill with --backend microvm), but its snapshots and rollbacks have not been \
     verified end to end on hardware KVM";

/// The backend `auto` resolves to, and why.
pub fn auto_backend(kvm: &KvmFacts) -> (BackendKind, String) {
    if kvm.kind == KvmKind::Emulated {
        return (
            BackendKind::Gvisor,
            "gvisor, because VMX/SVM is emulated by a software CPU here: microVMs run correctly but far slower \
             (use --backend microvm to run them anyway)"
                .into(),
        );
    }
    match linux_microvm_blocker(kvm) {
        None => (BackendKind::Gvisor, format!("gvisor, because {MICROVM_NOT_AUTO}")),
        Some(why) => (BackendKind::Gvisor, format!("gvisor, because microvm cannot run Linux here: {why}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(kind: KvmKind) -> KvmFacts {
        KvmFacts { kind, detail: "test".into() }
    }

    #[test]
    fn a_tcg_cpu_under_a_hypervisor_is_told_apart_from_hardware() {
        let tcg = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: QEMU TCG CPU version 2.5+\nflags\t\t: fpu svm hypervisor\n";
        assert_eq!(emulated_cpu(tcg).as_deref(), Some("QEMU TCG CPU version 2.5+"));
        let cloud = "model name\t: AMD EPYC 7B13\nflags\t\t: fpu svm hypervisor\n";
        assert_eq!(emulated_cpu(cloud), None, "hardware-assisted nesting is hardware");
        let metal = "model name\t: QEMU TCG CPU\nflags\t\t: fpu svm\n";
        assert_eq!(emulated_cpu(metal), None, "no hypervisor flag: not a guest");
        assert_eq!(emulated_cpu(""), None);
        assert_eq!(linux_microvm_blocker(&facts(KvmKind::Emulated)), None);
        let (kind, why) = auto_backend(&facts(KvmKind::Emulated));
        assert_eq!(kind, BackendKind::Gvisor);
        assert!(why.contains("emulated"), "{why}");
    }

    #[test]
    fn hardware_kvm_allows_microvm_but_auto_keeps_gvisor_until_snapshots_exist() {
        assert_eq!(linux_microvm_blocker(&facts(KvmKind::Hardware)), None);
        let (kind, why) = auto_backend(&facts(KvmKind::Hardware));
        assert_eq!(kind, BackendKind::Gvisor);
        assert!(why.contains("not been verified end to end on hardware KVM"), "{why}");
        for other in [KvmKind::Pvm, KvmKind::None] {
            assert!(linux_microvm_blocker(&facts(other)).is_some());
            assert_eq!(auto_backend(&facts(other)).0, BackendKind::Gvisor);
        }
    }
}
