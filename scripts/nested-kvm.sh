#!/usr/bin/env bash
# Hardware-style KVM on hosts without it: a Linux "L1" guest under QEMU's software CPU (TCG),
# which emulates AMD SVM with nested paging, loads kvm_amd and so has a real SVM /dev/kvm. Inside
# it branchbox's VMM runs Linux microVMs on the same code path as on a hardware-KVM host (the
# same ioctls, guest kernel and devices), only much slower: all of it is emulated, so compare
# figures from one L1 run with each other, never with hardware (docs/nested-kvm.md).
#
#   scripts/nested-kvm.sh check              # kvm_amd loads in L1 and /dev/kvm answers
#   scripts/nested-kvm.sh run 'COMMAND'      # COMMAND (bash) inside L1, in this checkout
#   scripts/nested-kvm.sh conformance [--skip NAME]...   # the microvm conformance suite inside L1
#                                            # (--skip: leave a test out, counted as not run)
#
# L1 sees this host's / read-only over 9p (binaries, libraries, target/, the image cache), with
# fresh /proc, /sys, /dev, a tmpfs /tmp and /run; COMMAND runs chrooted there as root, in this
# checkout's directory. Its exit status is this script's. Settings (environment):
#   NESTED_KVM_MEM (default 6G), NESTED_KVM_SMP (default: the host's cores, at most 4),
#   NESTED_KVM_TIMEOUT seconds (default 1800), BRANCHBOX_IMAGES (the image cache, where L1's
#   kernel and initramfs are cached under nested-kvm/<recipe hash>).
#
# L1's kernel is Debian's own (the linux-image package bookworm-backports' linux-image-amd64
# depends on), downloaded and unpacked into the cache, never installed on this host.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

die() { echo "nested-kvm: $*" >&2; exit 2; }
say() { echo "nested-kvm: $*" >&2; }

export BRANCHBOX_IMAGES="${BRANCHBOX_IMAGES:-/var/lib/branchbox/images}"
mem="${NESTED_KVM_MEM:-6G}"
cores=$(nproc)
smp="${NESTED_KVM_SMP:-$(( cores < 4 ? cores : 4 ))}"
limit="${NESTED_KVM_TIMEOUT:-1800}"

# --- host tools -------------------------------------------------------------------------------
# QEMU 7.2 (bookworm) and 10.0 (bookworm-backports) both emulate SVM under TCG; whichever is
# installed is used. busybox-static makes L1's userland before the chroot, kmod's depmod its
# module index, cpio and gzip its initramfs.
install_tools() {
    local need=()
    command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
    # L1's userland is /bin/busybox itself: it must be the static build, with modprobe.
    if ! { [ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -qx modprobe &&
        ! ldd /bin/busybox >/dev/null 2>&1; }; then
        need+=(busybox-static)
    fi
    command -v depmod >/dev/null 2>&1 || need+=(kmod)
    command -v cpio >/dev/null 2>&1 || need+=(cpio)
    command -v xz >/dev/null 2>&1 || need+=(xz-utils)
    [ ${#need[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || die "${need[*]} missing and not root: apt-get install ${need[*]}"
    say "installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
}

# The kernel package: what bookworm-backports' linux-image-amd64 depends on (a 6.12 kernel,
# whose kvm_amd was measured under TCG's SVM), else the default suite's.
kernel_package() {
    local suite dep
    for suite in bookworm-backports ""; do
        dep=$(apt-cache depends ${suite:+-t "$suite"} linux-image-amd64 2>/dev/null |
            sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-amd64\)$/\1/p' | head -1)
        if [ -n "$dep" ]; then
            local ver
            ver=$(apt-cache policy "$dep" | sed -n 's/^ *Candidate: //p')
            [ -n "$ver" ] && [ "$ver" != "(none)" ] && { echo "$dep $ver"; return 0; }
        fi
    done
    return 1
}

# /init of L1's initramfs: busybox, the modules, the 9p mounts, then the chrooted command.
l1_init() {
    cat <<'INIT'
#!/bin/sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
echo "nested-kvm L1: up at $(cut -d' ' -f1 /proc/uptime) s"
for m in kvm_amd 9p 9pnet_virtio tun veth bridge overlay; do
    modprobe "$m" 2>&1 | sed "s/^/modprobe $m: /"
done
[ -e /dev/kvm ] || echo "nested-kvm L1: no /dev/kvm after loading kvm_amd (is SVM emulated?)"
echo "nested-kvm L1: kvm_amd nested=$(cat /sys/module/kvm_amd/parameters/nested 2>/dev/null) npt=$(cat /sys/module/kvm_amd/parameters/npt 2>/dev/null)"
mkdir -p /host /out
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /host || echo "nested-kvm L1: the host's / did not mount"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 out /out || echo "nested-kvm L1: the output share did not mount"
H=/host
mount -t proc proc $H/proc; mount -t sysfs sys $H/sys; mount -t devtmpfs dev $H/dev
mkdir -p $H/dev/pts $H/dev/shm 2>/dev/null; mount -t devpts devpts $H/dev/pts 2>/dev/null
mount -t tmpfs -o size=90% tmp $H/tmp; mount -t tmpfs run $H/run; mount -t tmpfs shm $H/dev/shm
mount -t cgroup2 cgroup2 $H/sys/fs/cgroup 2>/dev/null
mkdir -p $H/tmp/nested-out; mount --bind /out $H/tmp/nested-out
ip link set lo up 2>/dev/null
echo "nested-kvm L1: running the command at $(cut -d' ' -f1 /proc/uptime) s"
chroot $H /bin/bash /tmp/nested-out/cmd </dev/null
echo $? > /out/rc
sync
echo "nested-kvm L1: done at $(cut -d' ' -f1 /proc/uptime) s"
poweroff -f
INIT
}

# Builds L1's kernel and initramfs into $1 from the unpacked package $2.
build_l1() {
    local dir=$1 pkgroot=$2 kver root m closure
    kver=$(ls "$pkgroot/lib/modules")
    depmod -b "$pkgroot" "$kver"
    root=$(mktemp -d)
    mkdir -p "$root"/{bin,dev,proc,sys,tmp,host,out,etc,lib/modules/"$kver"}
    cp /bin/busybox "$root/bin/busybox"
    ln -s busybox "$root/bin/sh"
    # The modules /init loads and everything they depend on (modules.dep), decompressed.
    closure=$(for m in kvm-amd 9p 9pnet_virtio tun veth bridge overlay; do
        modprobe -d "$pkgroot" -S "$kver" --show-depends "$m" 2>/dev/null | sed -n 's/^insmod //p' | awk '{print $1}'
    done | sort -u)
    [ -n "$closure" ] || { rm -rf "$root"; die "no modules found in the kernel package"; }
    for m in $closure; do
        local rel=${m#"$pkgroot"/lib/modules/"$kver"/}
        mkdir -p "$root/lib/modules/$kver/$(dirname "$rel")"
        case "$rel" in
            *.xz) xz -dc "$m" >"$root/lib/modules/$kver/${rel%.xz}" ;;
            *) cp "$m" "$root/lib/modules/$kver/$rel" ;;
        esac
    done
    cp "$pkgroot/lib/modules/$kver/modules.builtin" "$pkgroot/lib/modules/$kver/modules.order" \
        "$root/lib/modules/$kver/" 2>/dev/null || true
    depmod -b "$root" "$kver"
    l1_init >"$root/init"
    chmod +x "$root/init"
    (cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$dir/initramfs.cpio.gz.tmp"
    cp "$pkgroot/boot/vmlinuz-$kver" "$dir/vmlinuz.tmp"
    rm -rf "$root"
    mv "$dir/vmlinuz.tmp" "$dir/vmlinuz"
    mv "$dir/initramfs.cpio.gz.tmp" "$dir/initramfs.cpio.gz"
}

# The cached L1 (kernel + initramfs) for this recipe: the kernel package and version, the
# build functions' text and busybox's version. Prints its directory.
ensure_l1() {
    local pkg ver recipe hash dir deb work
    read -r pkg ver < <(kernel_package) || die "no linux-image-amd64 in apt's lists: run apt-get update"
    recipe="$pkg $ver
$(declare -f l1_init build_l1)
$(/bin/busybox 2>&1 | head -1)"
    hash=$(printf '%s' "$recipe" | sha256sum | cut -c1-16)
    dir="$BRANCHBOX_IMAGES/nested-kvm/$hash"
    if [ -s "$dir/vmlinuz" ] && [ -s "$dir/initramfs.cpio.gz" ]; then
        echo "$dir"; return 0
    fi
    mkdir -p "$dir" "$BRANCHBOX_IMAGES/nested-kvm/debs"
    deb="$BRANCHBOX_IMAGES/nested-kvm/debs/${pkg}_${ver//:/%3a}_amd64.deb"
    if [ ! -s "$deb" ]; then
        say "downloading $pkg $ver (not installed: unpacked into the cache)"
        work=$(mktemp -d)
        chmod 755 "$work"   # apt's download user writes there
        (cd "$work" && apt-get download "$pkg=$ver" >/dev/null) || { rm -rf "$work"; die "apt-get download $pkg=$ver failed"; }
        mv "$work"/*.deb "$deb.tmp" && mv "$deb.tmp" "$deb"
        rm -rf "$work"
    fi
    work=$(mktemp -d)
    dpkg-deb -x "$deb" "$work/pkg"
    say "building L1's initramfs ($pkg $ver) into $dir"
    build_l1 "$dir" "$work/pkg"
    rm -rf "$work"
    printf '%s\n' "$recipe" >"$dir/recipe"
    echo "$dir"
}

# L1's shared output directory (/tmp/nested-out inside), removed when this script ends.
out=
trap '[ -z "$out" ] || rm -rf "$out"' EXIT

# Boots L1 and runs the bash script $1 in it; returns its exit status.
run_l1() {
    local script=$1 dir rc
    install_tools
    dir=$(ensure_l1)
    out=$(mktemp -d /tmp/nested-kvm.XXXXXX)
    cp "$script" "$out/cmd"
    say "booting L1 (TCG, -cpu max with SVM, $smp vCPUs, $mem; kernel $(sed -n 1p "$dir/recipe"))"
    local start=$SECONDS
    set +e
    timeout --foreground "$limit" qemu-system-x86_64 -accel tcg,thread=multi -M q35 -cpu max \
        -smp "$smp" -m "$mem" -nographic -no-reboot -nic none -serial stdio -monitor none \
        -display none -kernel "$dir/vmlinuz" -initrd "$dir/initramfs.cpio.gz" \
        -append "console=ttyS0 panic=-1 loglevel=3 quiet" \
        -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on \
        -virtfs "local,path=$out,mount_tag=out,security_model=none" </dev/null
    rc=$?
    set -e
    if [ "$rc" = 124 ]; then
        say "L1 ran past NESTED_KVM_TIMEOUT=$limit s and was stopped"
    elif [ ! -f "$out/rc" ]; then
        say "L1 ended (QEMU status $rc) before the command finished: its console is above"
        rc=2
    else
        rc=$(cat "$out/rc")
    fi
    say "L1 done in $(( SECONDS - start )) s, command status $rc"
    return "$rc"
}

# A script run in L1: in this checkout, with the image cache, PATH and HOME set.
l1_script() {
    local f
    f=$(mktemp)
    cat >"$f" <<EOF
set -uo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp/home
export BRANCHBOX_IMAGES=$BRANCHBOX_IMAGES BRANCHBOX_TEST_DIR=/tmp/bbtest
mkdir -p /tmp/home /tmp/bbtest
cd $repo
$1
EOF
    echo "$f"
}

cmd="${1:-}"
case "$cmd" in
    check)
        s=$(l1_script 'grep -m1 -o -w svm /proc/cpuinfo && ls -l /dev/kvm && ./target/debug/branchbox doctor')
        [ -x target/debug/branchbox ] || cargo build --quiet -p branchbox --bin branchbox
        run_l1 "$s"
        ;;
    run)
        shift
        [ $# -ge 1 ] || die "usage: scripts/nested-kvm.sh run 'COMMAND'"
        s=$(l1_script "$*")
        run_l1 "$s"
        ;;
    conformance)
        shift
        skips=()
        while [ $# -gt 0 ]; do
            [ "$1" = --skip ] && [ $# -ge 2 ] || die "usage: scripts/nested-kvm.sh conformance [--skip NAME]..."
            skips+=(--skip "$2"); shift 2
        done
        # The suite's binaries are built here (L1 only runs them), and the guest's kernel and
        # root disk come from the image cache, built by the project's own commands.
        cargo build --quiet --workspace
        ./target/debug/branchbox guest kernel >/dev/null
        ./target/debug/branchbox guest disk >/dev/null
        bin=$(cargo test --quiet -p branchbox-conformance --no-run --message-format=json |
            python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])' | head -1)
        [ -x "$bin" ] || die "the conformance test binary was not found"
        # Run from the package's directory, as cargo test would; SKIP lines go to stderr.
        s=$(l1_script "cd tests/conformance && $bin --test-threads=${NESTED_KVM_THREADS:-1} microvm:: ${skips[*]} 2>&1 | tee /tmp/nested-out/log")
        rc=0
        run_l1 "$s" || rc=$?
        log="$out/log"
        [ -f "$log" ] || { echo "microvm conformance: 0 passed, 1 failed, 0 skipped"; exit 1; }
        skipped=$(grep -c '^SKIP microvm ' "$log" || true)
        ok=$(grep -cE '^test microvm::[a-z0-9_]+ \.\.\. ok$' "$log" || true)
        failed=$(grep -cE '^test microvm::[a-z0-9_]+ \.\.\. FAILED$' "$log" || true)
        passed=$(( ok - skipped ))
        # Where L1 runs, a skipped microvm test fails the stage: the host check decided wrongly.
        echo "microvm conformance: $passed passed, $failed failed, $skipped skipped"
        [ ${#skips[@]} -eq 0 ] || echo "not run (--skip): $(( ${#skips[@]} / 2 )): $(printf '%s ' "${skips[@]}" | sed 's/--skip //g')"
        [ "$rc" = 0 ] && [ "$failed" = 0 ] && [ "$skipped" = 0 ] && [ "$passed" -gt 0 ]
        ;;
    *)
        sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
        exit 2
        ;;
esac
