#!/usr/bin/env bash
# Installs what branchbox needs on a fresh Debian 12 machine (run as root): gVisor's runsc and
# debootstrap for the sandbox image; Debian's kernel source and the tools that build the Linux
# guest's kernel and root disk (docs/guest.md); with --test also QEMU (the vhost-user test boots
# the guest under software emulation) and the Python SDK and its test tools. Checks
# the tools themselves, so it is a no-op when they are present and never skipped because some
# cache exists.
set -euo pipefail

need=()
command -v runsc >/dev/null 2>&1 || need+=(runsc)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
# The guest kernel (`branchbox guest kernel`): Debian's 6.12 source and its build tools.
[ -f /usr/src/linux-source-6.12.tar.xz ] || need+=(linux-source-6.12)
for tool in make:make gcc:gcc bc:bc flex:flex bison:bison xz:xz-utils; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool#*:}")
done
[ -f /usr/include/libelf.h ] || need+=(libelf-dev)
# The root disk (`branchbox guest disk`): mkfs.ext4 -d, e2fsck.
command -v mkfs.ext4 >/dev/null 2>&1 || need+=(e2fsprogs)
if [ "${1:-}" = "--test" ]; then
    command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
fi
command -v cargo >/dev/null 2>&1 || { echo "setup: cargo is missing; install a Rust toolchain (rustup)" >&2; exit 1; }

if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "setup: ${need[*]} missing and not root; run as root or: apt-get install ${need[*]}" >&2
        exit 1
    fi
    echo "setup: installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q "${need[@]}" >/dev/null
fi
echo "setup: $(runsc --version | head -1); debootstrap $(dpkg-query -W -f='${Version}' debootstrap 2>/dev/null || echo present)"
echo "setup: linux-source-6.12 $(dpkg-query -W -f='${Version}' linux-source-6.12 2>/dev/null || echo present); $(mkfs.ext4 -V 2>&1 | head -1)"

# --- branchboxd and the Python SDK (with --test) -----------------------------------------------
[ "${1:-}" = "--test" ] || exit 0
# A virtual environment under target/py with the SDK (editable) and its pinned test tools from
# PyPI; checked by importing them, so an existing environment is reused only when complete.
(
    cd "$(dirname "$0")/.."
    py=target/py
    if ! "$py/bin/python" -c "import branchbox, httpx, pytest, schemathesis, openapi_spec_validator" 2>/dev/null; then
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
    fi
    echo "setup: $("$py/bin/python" --version), pytest $("$py/bin/python" -c 'import pytest; print(pytest.__version__)')"
)
# --- end of branchboxd and the Python SDK ------------------------------------------------------
