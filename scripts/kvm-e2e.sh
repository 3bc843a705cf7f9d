#!/usr/bin/env bash
# End to end on hardware KVM, in one run: installs what the build needs, builds the binaries,
# the guest kernel and the root disk (cached by recipe hash: a second run only checks them),
# boots the guest to its agent N times with our VMM, prints boot-to-first-answer figures
# (target <= 100 ms), runs the gated end-to-end test (agent answers, Python runs) and the
# conformance suite against the microvm backend.
#
#   scripts/kvm-e2e.sh [RUNS]        (default 10; BRANCHBOX_IMAGES picks the image cache)
#
# Needs hardware virtualization behind /dev/kvm (vmx/svm and kvm_intel/kvm_amd); on the PVM
# hosts we build on it says so and exits 2 (see docs/boot.md for what those hosts prove).
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-10}"

if ! grep -qwE 'vmx|svm' /proc/cpuinfo || ! { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; } \
    || [ ! -e /dev/kvm ]; then
    echo "kvm-e2e: this host has no hardware KVM (no vmx/svm flag or no kvm_intel/kvm_amd module); nothing to measure" >&2
    exit 2
fi

export BRANCHBOX_IMAGES="${BRANCHBOX_IMAGES:-/var/lib/branchbox/images}"
t() { date +%s%N; }
since() { echo "$(( ($(t) - $1) / 1000000 )) ms"; }

s=$(t); ./scripts/setup.sh; echo "kvm-e2e: setup $(since "$s")"
s=$(t); cargo build --release -p branchbox -p branchbox-agent -p branchbox-guest-tests --example linux_guest
echo "kvm-e2e: binaries $(since "$s")"
bb=target/release/branchbox

s=$(t); kdir=$("$bb" guest kernel --print-path); echo "kvm-e2e: kernel $(since "$s") ($kdir)"
s=$(t); disk=$("$bb" guest disk --print-path); echo "kvm-e2e: disk $(since "$s") ($disk)"
kernel="$kdir"; [ -d "$kdir" ] && kernel="$kdir/vmlinux"

target/release/examples/linux_guest --kernel "$kernel" --disk "$disk" --runs "$runs"
target/release/examples/linux_guest --kernel "$kernel" --disk "$disk" --runs "$runs" --cmdline-extra quiet

BRANCHBOX_KERNEL="$kernel" BRANCHBOX_GUEST_DISK="$disk" \
    cargo test --release -p branchbox-guest-tests --test linux_kvm -- --nocapture

# The conformance suite against the microvm backend (docs/conformance.md): it needs the debug
# binaries the suite finds beside its test binary.
cargo build --workspace
cargo test -p branchbox-conformance -- microvm:: --nocapture
