#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what is missing, checks formatting and
# lints, runs every test (unit, agent protocol, microVM engine, devices, gVisor end to end,
# service and the Python and TypeScript SDKs, E2B's own JavaScript SDK, the Linux guest under our VMM and under QEMU), the fuzz targets briefly, and
# a short run of every benchmark so they never rot. Timings are printed, never asserted.
set -euo pipefail
cd "$(dirname "$0")/.."

suite_start=$(date +%s)
# Each stage prints when it began, so a slow CI run shows where its time went.
stage() { echo "== $* (at $(( $(date +%s) - suite_start )) s)"; }

./scripts/setup.sh --test
stage fmt
cargo fmt --all -- --check

# The image cache persists between runs (keyed by recipe and agent hash); everything else is a
# fresh directory removed at the end.
export BRANCHBOX_IMAGES="${BRANCHBOX_IMAGES:-/var/lib/branchbox/images}"
work=$(mktemp -d /tmp/bbtest.XXXXXX)
export BRANCHBOX_TEST_DIR="$work"
kernel_pid=
cleanup() {
    [ -z "$kernel_pid" ] || kill -- "-$kernel_pid" 2>/dev/null || true
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

# The Linux guest's kernel, built by the project's own command into the image cache: a cold
# build is about 20 CPU-minutes, a cached one milliseconds (docs/guest.md). It builds in the
# background at the lowest priority, on the CPU time the rest of the suite leaves idle (the
# gVisor and service tests spend much of theirs waiting), and the tests that need it run last.
stage "guest kernel (building in the background; log: $work/guest-kernel.log)"
cargo build --quiet -p branchbox --bin branchbox
setsid nice -n 19 ./target/debug/branchbox guest kernel >"$work/guest-kernel.log" 2>&1 &
kernel_pid=$!

stage clippy
cargo clippy --workspace --all-targets --quiet -- -D warnings

stage build
cargo build --workspace --quiet

stage image and guest root disk
./target/debug/branchbox --data-dir "$work/bench" image build
./target/debug/branchbox guest disk

stage "tests (all but the Linux guest's, which run once its kernel is built)"
cargo test --workspace --exclude branchbox-guest-tests --no-fail-fast -- --test-threads=2

# --- fuzz targets (short) -----------------------------------------------------------------------
# libFuzzer targets for guest-controlled input of the virtio devices, disk layer files, the VMM
# control protocol, image imports and template files (fuzz/, cargo-fuzz layout).
# Built with plain cargo and the coverage flags cargo-fuzz passes with `-s none` (no sanitizer,
# so no nightly), which skips installing cargo-fuzz (5 minutes here). Each target runs 10 s from
# the committed seeds (fuzz/seeds: valid requests, packets, a handshake, layer files, control
# frames); a crash fails the suite and prints the crashing input.
stage "fuzz targets (10 s each)"
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
# Two targets at a time, one per core: each runs for its 10 s whatever else runs.
fuzz_one() {
    local t=$1 log="$work/fuzz-$1.log"
    mkdir -p "$work/fuzz-corpus/$t"
    if ! "fuzz/target/x86_64-unknown-linux-gnu/debug/$t" -max_total_time=10 -rss_limit_mb=1024 \
        -artifact_prefix="$work/fuzz-artifacts/$t-" "$work/fuzz-corpus/$t" "fuzz/seeds/$t" \
        >"$log" 2>&1; then
        tail -n 40 "$log"
        echo "fuzz target $t failed: the crashing input is printed above (Base64); save it to a"
        echo "file and replay it with fuzz/target/x86_64-unknown-linux-gnu/debug/$t FILE"
        return 1
    fi
    echo "$t: $(grep -E '^Done' "$log")"
}
set -- mmio_registers blk_requests vsock_packets net_frames rng_chains layer_file process_frames image_import \
    template_parse dns_queries connect_requests proc_net_tcp
while [ $# -gt 0 ]; do
    fuzz_one "$1" & first=$!
    second=
    if [ $# -gt 1 ]; then fuzz_one "$2" & second=$!; fi
    failed=0
    wait "$first" || failed=1
    [ -z "$second" ] || wait "$second" || failed=1
    [ "$failed" = 0 ] || exit 1
    shift; [ $# -eq 0 ] || shift
done
echo "fuzz stage: $(( $(date +%s) - fuzz_start )) s"
# --- end of fuzz targets -------------------------------------------------------------------------

stage "benchmarks (short; figures are reported, not asserted)"
bb="./target/debug/branchbox --data-dir $work/bench"
$bb bench exec --runs 20 >/dev/null
$bb bench fork --backend gvisor --short >/dev/null
$bb bench fork --backend microvm --short >/dev/null
$bb bench density --short >/dev/null
$bb bench claim --short >/dev/null
$bb bench soak --short >/dev/null
$bb bench net --short >/dev/null
for b in checkpoint rollback branch chain; do
    $bb bench $b --backend gvisor --short >/dev/null
    $bb bench $b --backend microvm --short >/dev/null
done

# --- branchboxd and the Python SDK -------------------------------------------------------------
# The tests start branchboxd themselves (target/debug/branchboxd on a free loopback port, fresh
# data directories under $BRANCHBOX_TEST_DIR), restart it mid-activity and stop it at the end;
# see sdk/python/tests/conftest.py. They run alone: beside the Rust tests a fork bomb lost its
# sandbox, and beside the benchmarks the soak's process flood did.
stage "service and Python SDK"
BRANCHBOXD="$PWD/target/debug/branchboxd" target/py/bin/pytest -q -p no:cacheprovider --durations=15 sdk/python/tests
# The TypeScript SDK's tests start one branchboxd of their own the same way (test/run.ts) and
# run node:test's files against it; its dependencies come from the committed package-lock.json,
# installed again when node_modules is missing or older than the lock file.
stage "TypeScript SDK"
(
    cd sdk/typescript
    if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
        npm ci --no-audit --no-fund
    fi
    BRANCHBOXD="$OLDPWD/target/debug/branchboxd" npm test
)
# E2B's own JavaScript SDK (npm `e2b`, pinned with its lock file in sdk/e2b-js-test) against a
# branchboxd of its own (test/run.mjs), configured only by E2B's three settings (docs/e2b.md).
stage "E2B's JavaScript SDK"
(
    cd sdk/e2b-js-test
    if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
        npm ci --no-audit --no-fund
    fi
    BRANCHBOXD="$OLDPWD/target/debug/branchboxd" npm test
)
stage "Linux guest: waiting for its kernel, then the boot-protocol, QEMU and hardware-KVM tests"
if ! wait "$kernel_pid"; then
    kernel_pid=
    tail -n 40 "$work/guest-kernel.log"
    echo "the guest kernel build failed: its log ends above"
    exit 1
fi
kernel_pid=
tail -n 2 "$work/guest-kernel.log"
cargo test -p branchbox-guest-tests --no-fail-fast -- --test-threads=1
stage "all tests passed"
