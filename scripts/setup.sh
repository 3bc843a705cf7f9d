#!/usr/bin/env bash
# Installs what branchbox needs on a fresh Debian 12 machine (run as root): gVisor's runsc and
# debootstrap for the sandbox image. Checks the tools themselves, so it is a no-op when they are
# present and never skipped because some cache exists.
set -euo pipefail

need=()
command -v runsc >/dev/null 2>&1 || need+=(runsc)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
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
