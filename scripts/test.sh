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

# --- fuzz targets (short) -----------------------------------------------------------------------
# libFuzzer targets for guest-controlled input of the virtio devices (fuzz/, cargo-fuzz layout).
# Built with plain cargo and the coverage flags cargo-fuzz passes with `-s none` (no sanitizer,
# so no nightly), which skips installing cargo-fuzz (5 minutes here). Each target runs 10 s from
# the committed seeds (fuzz/seeds: valid requests, packets, a handshake); a crash fails the suite and prints the crashing input.
echo "== fuzz targets (10 s each)"
fuzz_start=$(date +%s)
(
    cd fuzz
    RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing" \
        CARGO_PROFILE_DEV_DEBUG=0 CARGO_TARGET_DIR="$PWD/target" \
        cargo build --locked --quiet --target x86_64-unknown-linux-gnu --bins
)
mkdir -p "$work/fuzz-artifacts"
for t in mmio_registers blk_requests vsock_packets rng_chains; do
    mkdir -p "$work/fuzz-corpus/$t"
    log="$work/fuzz-$t.log"
    if ! "fuzz/target/x86_64-unknown-linux-gnu/debug/$t" -max_total_time=10 -rss_limit_mb=1024 \
        -artifact_prefix="$work/fuzz-artifacts/" "$work/fuzz-corpus/$t" "fuzz/seeds/$t" \
        >"$log" 2>&1; then
        tail -n 40 "$log"
        echo "fuzz target $t failed: the crashing input is printed above (Base64); save it to a"
        echo "file and replay it with fuzz/target/x86_64-unknown-linux-gnu/debug/$t FILE"
        exit 1
    fi
    echo "$t: $(grep -E '^Done' "$log")"
done
echo "fuzz stage: $(( $(date +%s) - fuzz_start )) s"
# --- end of fuzz targets -------------------------------------------------------------------------

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
