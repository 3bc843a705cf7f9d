#!/usr/bin/env bash
# The branchbox demo, from a fresh machine: installs what is missing, builds, builds the sandbox
# image (cached after the first run), then creates a sandbox, runs Python in it, starts a
# counting process, forks it into three children and shows them continuing from the source's
# count while their files diverge.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh --demo
# Only the three programs the demo runs: the CLI, the shim that owns each sandbox's agent, and
# the agent itself (branchboxd, the VMM and the test crates are not needed here).
echo "== building branchbox, branchbox-shim and branchbox-agent (release; about 5 minutes on 2 cores the first time, seconds after)"
cargo build --release --quiet -p branchbox --bin branchbox -p branchbox-gvisor --bin branchbox-shim \
    -p branchbox-agent --bin branchbox-agent
bb=./target/release/branchbox
export BRANCHBOX_DATA="${BRANCHBOX_DATA:-/var/lib/branchbox}"

echo "== host"
$bb doctor || true
echo "== image: Debian 12 with python3 (debootstrap the first time, about 2 minutes; then cached)"
$bb image build minimal

sandboxes=()
forkpoint=
cleanup() {
    [ ${#sandboxes[@]} -eq 0 ] || $bb kill "${sandboxes[@]}" >/dev/null 2>&1 || true
    [ -z "$forkpoint" ] || $bb rmsnap --cascade "$forkpoint" >/dev/null 2>&1 || true
}
trap cleanup EXIT

echo "== create a sandbox and run Python in it"
src=$($bb create --image minimal)
sandboxes+=("$src")
echo "sandbox $src"
$bb exec "$src" -- python3 -c 'import platform, sys; print("python", platform.python_version(), "on", sys.platform)'

echo "== start a counting process (it keeps its count in memory and writes it every 0.1 s)"
$bb exec "$src" -s -- 'cat > /root/count.py <<PY
import time
n = 0
while True:
    n += 1
    open("/tmp/count", "w").write(str(n))
    time.sleep(0.1)
PY'
$bb spawn "$src" -- python3 /root/count.py >/dev/null
sleep 1.5
echo "source count before the fork: $($bb exec "$src" -- cat /tmp/count)"

echo "== fork 3 children"
start=$(date +%s%N)
mapfile -t kids < <($bb fork "$src" -n 3)
echo "forked ${#kids[@]} children in $(( ($(date +%s%N) - start) / 1000000 )) ms: ${kids[*]}"
sandboxes+=("${kids[@]}")
for i in "${!kids[@]}"; do
    $bb exec "${kids[$i]}" -s -- "echo 'written only in child $i' > /root/mine"
done
sleep 1
for i in "${!kids[@]}"; do
    k=${kids[$i]}
    echo "child $i ($k): count $($bb exec "$k" -- cat /tmp/count), hostname $($bb exec "$k" -- hostname), /root/mine: $($bb exec "$k" -- cat /root/mine)"
done
echo "source: count $($bb exec "$src" -- cat /tmp/count), /root/mine: $($bb exec "$src" -s -- 'cat /root/mine 2>/dev/null || echo absent')"
forkpoint=$($bb --json ls | python3 -c "import json,sys; print([s['parent_snapshot'] for s in json.load(sys.stdin) if s['id']=='$src'][0])")
echo "== lineage (the fork point with the source and its three children)"
$bb log | grep -A4 "$forkpoint"
echo "== done (sandboxes are destroyed on exit)"
cat <<NEXT
== next
  $bb --help            # every command: snapshot, restore, checkpoint, rollback, templates, gc
  # The service (HTTP API, console at /ui, E2B's wire); its setup adds node for the console:
  ./scripts/setup.sh && cargo build --release -p branchbox-service && ./target/release/branchboxd &
  # The Python SDK against it:
  pip install ./sdk/python
  BRANCHBOX_URL=http://127.0.0.1:7420 BRANCHBOX_TOKEN=\$(cat $BRANCHBOX_DATA/service/token) \\
      python3 -c 'from branchbox import Sandbox; print(Sandbox.create().commands.run("echo hi").stdout)'
  # E2B's own SDKs against it: E2B_API_URL=http://127.0.0.1:7420/e2b (docs/e2b.md)
NEXT
