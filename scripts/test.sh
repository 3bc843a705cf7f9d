#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what is missing, checks formatting and
# lints, runs every test (unit, agent protocol, microVM engine, gVisor end to end) and a short
# run of every benchmark so they never rot. Timings are printed, never asserted.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh --test
echo "== fmt and clippy"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings

echo "== build"
cargo build --workspace --quiet

# The image cache persists between runs (keyed by recipe and agent hash); everything else is a
# fresh directory removed at the end.
export BRANCHBOX_IMAGES="${BRANCHBOX_IMAGES:-/var/lib/branchbox/images}"
work=$(mktemp -d /tmp/bbtest.XXXXXX)
export BRANCHBOX_TEST_DIR="$work"
cleanup() {
    if [ -d "$work" ]; then
        for d in "$work"/*/; do
            [ -d "$d/sandboxes" ] || continue
            ids=$(ls "$d/sandboxes" 2>/dev/null || true)
            [ -z "$ids" ] || ./target/debug/branchbox --data-dir "$d" kill $ids >/dev/null 2>&1 || true
        done
        rm -rf "$work"
    fi
}
trap cleanup EXIT

echo "== image"
./target/debug/branchbox --data-dir "$work/bench" image build

# The Linux guest's kernel and root disk, built by the project's own commands into the image
# cache: a cold kernel build takes minutes, a cached one milliseconds (docs/guest.md).
echo "== guest kernel and root disk"
./target/debug/branchbox guest kernel
./target/debug/branchbox guest disk

echo "== tests"
cargo test --workspace --no-fail-fast -- --test-threads=2

echo "== benchmarks (short; figures are reported, not asserted)"
bb="./target/debug/branchbox --data-dir $work/bench"
$bb bench exec --runs 20 >/dev/null
$bb bench fork --backend gvisor --short >/dev/null
$bb bench fork --backend microvm --short >/dev/null
$bb bench density --short >/dev/null
$bb bench soak --short >/dev/null
for b in checkpoint rollback branch chain; do
    $bb bench $b --backend gvisor --short >/dev/null
    $bb bench $b --backend microvm --short >/dev/null
done

# --- branchboxd and the Python SDK -------------------------------------------------------------
# The tests start branchboxd themselves (target/debug/branchboxd on a free loopback port, fresh
# data directories under $BRANCHBOX_TEST_DIR), restart it mid-activity and stop it at the end;
# see sdk/python/tests/conftest.py.
echo "== service and Python SDK"
BRANCHBOXD="$PWD/target/debug/branchboxd" target/py/bin/pytest -q -p no:cacheprovider sdk/python/tests
# --- end of branchboxd and the Python SDK ------------------------------------------------------
echo "== all tests passed"
