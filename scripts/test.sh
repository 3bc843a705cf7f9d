#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what is missing, checks formatting and
# lints, runs every test (unit, agent protocol, microVM engine, devices, gVisor end to end,
# service and the Python and TypeScript SDKs, E2B's own JavaScript SDK, the Linux guest under our
# VMM and under QEMU, microvm sandboxes with Linux guests under nested KVM in QEMU's emulated SVM),
# the fuzz targets briefly, and a short run of every benchmark so they never rot. Timings are
# printed, never asserted.
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
fuzz_pid=
guest_pid=
images_pid=
walk_pid=
nested_pid=
cleanup() {
    [ -z "$nested_pid" ] || kill -- "-$nested_pid" 2>/dev/null || true
    [ -z "$kernel_pid" ] || kill -- "-$kernel_pid" 2>/dev/null || true
    [ -z "$images_pid" ] || kill "$images_pid" 2>/dev/null || true
    [ -z "$walk_pid" ] || kill "$walk_pid" 2>/dev/null || true
    [ -z "$fuzz_pid" ] || kill "$fuzz_pid" 2>/dev/null || true
    [ -z "$guest_pid" ] || kill "$guest_pid" 2>/dev/null || true
    if [ -d "$work" ]; then
        for d in "$work"/*/ "$work"/p[12]/*/; do
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
# gVisor and service tests spend much of theirs waiting), and the tests that need it run from
# the Python stage on.
stage "guest kernel (building in the background; log: $work/guest-kernel.log)"
cargo build --quiet -p branchbox --bin branchbox
# Its exit status goes to a file: the guest's tests wait for it from a background job of their
# own, which cannot `wait` for a job of this shell.
setsid nice -n 19 sh -c './target/debug/branchbox guest kernel; echo $? >"$1.rc"' sh "$work/guest-kernel" \
    >"$work/guest-kernel.log" 2>&1 &
kernel_pid=$!

stage build
cargo build --workspace --quiet

# The default image and the guest's root disk build beside clippy: debootstrap mostly waits for
# downloads and dpkg, clippy only computes. They take the agent just built.
stage "default image and guest root disk (in the background; log: $work/images.log)"
( ./target/debug/branchbox --data-dir "$work/bench" image build && ./target/debug/branchbox guest disk ) \
    >"$work/images.log" 2>&1 &
images_pid=$!

stage clippy
cargo clippy --workspace --all-targets --quiet -- -D warnings

stage "waiting for the image and guest root disk"
images_ok=0
wait "$images_pid" || images_ok=1
images_pid=
cat "$work/images.log"
[ "$images_ok" = 0 ] || { echo "the image or guest root disk build failed: its log is above"; exit 1; }

# The time-travel random walk is one test of minutes (166-295 s measured); inside its binary it
# would hold the stage up alone once the file's other tests are done, so it runs as a process
# of its own beside all the others (each test process has its own data directory, bbt-PID).
stage "tests (all but the Linux guest's, which run once its kernel is built; the random walk beside them, log: $work/walk.log)"
walk=random_walk_of_writes_checkpoints_rollbacks_and_forks_matches_a_model
# Its test binary runs directly (as cargo test would: from the package's directory), so no
# second cargo waits on the build directory's lock.
walk_bin=$(cargo test --quiet -p branchbox --test time_travel_e2e --no-run --message-format=json |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "time_travel_e2e":
        print(m["executable"])')
[ -x "$walk_bin" ] || { echo "the time-travel test binary was not found (got '$walk_bin')"; exit 1; }
(cd crates/cli && exec "$walk_bin" --exact "$walk") >"$work/walk.log" 2>&1 &
walk_pid=$!
rust_ok=0
cargo test --workspace --exclude branchbox-guest-tests --no-fail-fast -- --test-threads=2 --skip "$walk" || rust_ok=1
walk_ok=0
wait "$walk_pid" || walk_ok=1
walk_pid=
echo "--- the time-travel random walk"
cat "$work/walk.log"
[ "$walk_ok" = 0 ] || { echo "the time-travel random walk failed: its log is above"; exit 1; }
[ "$rust_ok" = 0 ] || { echo "Rust tests failed: the failures are above"; exit 1; }

# --- fuzz targets (short) -----------------------------------------------------------------------
# libFuzzer targets for guest-controlled input of the virtio devices, disk layer files, the VMM
# control protocol, image imports and template files (fuzz/, cargo-fuzz layout).
# Built with plain cargo and the coverage flags cargo-fuzz passes with `-s none` (no sanitizer,
# so no nightly), which skips installing cargo-fuzz (5 minutes here). Each target runs 10 s from
# the committed seeds (fuzz/seeds: valid requests, packets, a handshake, layer files, control
# frames); a crash fails the suite and prints the crashing input.
fuzz_stage() {
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
    template_parse dns_queries connect_requests proc_net_tcp e2b_template_steps e2b_template_archive
while [ $# -gt 0 ]; do
    fuzz_one "$1" & first=$!
    second=
    if [ $# -gt 1 ]; then fuzz_one "$2" & second=$!; fi
    failed=0
    wait "$first" || failed=1
    [ -z "$second" ] || wait "$second" || failed=1
    [ "$failed" = 0 ] || return 1
    shift; [ $# -eq 0 ] || shift
done
echo "fuzz stage: $(( $(date +%s) - fuzz_start )) s"
}
# --- end of fuzz targets -------------------------------------------------------------------------

# The fuzz targets run beside the benchmarks: the benchmarks spend most of their time waiting
# for sandboxes, the fuzzers only compute, and neither's result depends on the other's speed
# (a fuzz target runs for its 10 s, and benchmark figures here are thrown away).
stage "fuzz targets (10 s each, log: $work/fuzz.log) beside the benchmarks (short; figures are reported, not asserted)"
fuzz_stage >"$work/fuzz.log" 2>&1 &
fuzz_pid=$!
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
fuzz_ok=0
wait "$fuzz_pid" || fuzz_ok=1
fuzz_pid=
cat "$work/fuzz.log"
[ "$fuzz_ok" = 0 ] || { echo "the fuzz stage failed: its log is above"; exit 1; }

# --- branchboxd and the Python SDK -------------------------------------------------------------
# The tests start branchboxd themselves (target/debug/branchboxd on a free loopback port, fresh
# data directories under $BRANCHBOX_TEST_DIR), restart it mid-activity and stop it at the end;
# see sdk/python/tests/conftest.py. They run after the Rust tests and the benchmarks (beside the
# Rust tests a fork bomb lost its sandbox, beside the benchmarks the soak's process flood did),
# as two pytest processes at once: each test spends most of its time waiting for sandboxes
# and services, so two halves take about 55% of one run (measured: 371 s against 659 s). The
# first half is the files that bring up clusters, floods and restarts; every other file,
# a new one included, is in the second. Each half has its own services and data directories
# (and network namespaces, named by pid).
# The Linux guest's tests (they wait for its kernel, then boot it under our VMM and QEMU) run
# after the Python tests, beside the two JavaScript stages, which mostly wait for their
# sandboxes; by then the kernel, built from the suite's first minutes, is normally done.
guest_stage() {
    while [ ! -s "$work/guest-kernel.rc" ]; do
        kill -0 "$kernel_pid" 2>/dev/null || break
        sleep 2
    done
    if [ "$(cat "$work/guest-kernel.rc" 2>/dev/null)" != 0 ]; then
        tail -n 40 "$work/guest-kernel.log"
        echo "the guest kernel build failed: its log ends above"
        return 1
    fi
    tail -n 2 "$work/guest-kernel.log"
    cargo test -p branchbox-guest-tests --no-fail-fast -- --test-threads=1
}
stage "service and Python SDK (two halves at once; logs: $work/pytest-*.log)"
heavy="test_fleet.py test_store_stress.py test_load.py test_recovery.py test_stream_lifetimes.py
test_network.py test_security.py test_pools.py test_images.py test_templates.py test_module_graph.py"
first=() second=()
for f in sdk/python/tests/test_*.py; do
    case " $(echo $heavy) " in
        *" $(basename "$f") "*) first+=("$f") ;;
        *) second+=("$f") ;;
    esac
done
# Each half's directory name is short: Unix socket paths below it (sandboxes' agent sockets,
# Ray's) must fit in 107 bytes.
pytest_half() {
    local name=$1 dir=$2; shift 2
    mkdir -p "$work/$dir"
    BRANCHBOX_TEST_DIR="$work/$dir" BRANCHBOXD="$PWD/target/debug/branchboxd" \
        target/py/bin/pytest -q -p no:cacheprovider --durations=10 "$@" >"$work/pytest-$name.log" 2>&1
}
pytest_half first p1 "${first[@]}" & first_pid=$!
pytest_half second p2 "${second[@]}" & second_pid=$!
py_failed=0
wait "$first_pid" || py_failed=1
wait "$second_pid" || py_failed=1
for name in first second; do
    echo "--- pytest, $name half"
    cat "$work/pytest-$name.log"
done
[ "$py_failed" = 0 ] || { echo "Python SDK tests failed: the failures are above"; exit 1; }
# The Linux guest's tests run after the Python tests, beside the two JavaScript stages: their
# guests run emulated (PVM, QEMU's TCG) and take a core each while they run, and beside the
# Python tests the fleet's RL and load tests, which time their heartbeats and clients, failed.
stage "Linux guest: waiting for its kernel, then the boot-protocol, QEMU and hardware-KVM tests (in the background; log: $work/guest.log)"
guest_stage >"$work/guest.log" 2>&1 &
guest_pid=$!
# The microvm conformance suite with real Linux guests, under KVM inside QEMU's emulated SVM
# (docs/nested-kvm.md). QEMU's software CPU takes both cores for its few minutes, so it runs
# after the Python tests (beside them, the fleet's 3 s heartbeats were missed and RL episodes
# timed out) and beside the two JavaScript stages, which mostly wait. Left out, named: the
# tests that still fail there (issue 35).
stage "microvm conformance under nested KVM (in the background; log: $work/nested.log)"
setsid ./scripts/nested-kvm.sh conformance \
    --skip rollback_returns_files_memory_and_processes_to_the_checkpoint \
    --skip a_memory_hog_is_killed_and_the_sandbox_keeps_answering \
    --skip forks_past_the_process_limit_fail_with_eagain \
    --skip a_big_binary_file_round_trips_byte_exact \
    >"$work/nested.log" 2>&1 &
nested_pid=$!
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
guest_ok=0
wait "$guest_pid" || guest_ok=1
guest_pid=
kernel_pid=
echo "--- Linux guest"
cat "$work/guest.log"
[ "$guest_ok" = 0 ] || { echo "the Linux guest's stage failed: its log is above"; exit 1; }
nested_ok=0
wait "$nested_pid" || nested_ok=1
nested_pid=
echo "--- microvm conformance under nested KVM"
grep -v -e '^\[ ' -e 'Unhandled WRMSR' "$work/nested.log" || true
[ "$nested_ok" = 0 ] || { echo "the microvm conformance suite under nested KVM failed: its log is above"; exit 1; }
stage "all tests passed"
