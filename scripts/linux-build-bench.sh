#!/usr/bin/env bash
# Builds the disk image of the real-Linux build benchmark
# (`pagefold bench build --guest linux`, docs/benchmarks.md) from Debian
# packages only.
#
#   sudo scripts/linux-build-bench.sh OUTDIR [IMAGE_SIZE]
#
# Produces:
#   OUTDIR/build.ext4   ext4 root filesystem (IMAGE_SIZE, default 12G, sparse):
#                       a Debian minbase system (debootstrap) with gcc,
#                       libc6-dev, make, bc, flex, bison, libelf-dev,
#                       libssl-dev, GNU time, xz and linux-source (the
#                       kernel tree as /usr/src/linux-source-*.tar.xz), and
#                       /pagefold-build-init, the guest's init (below)
#   OUTDIR/guest/       scripts/guest-image.sh's kernel (vmlinux, bzImage)
#                       and initrd.img: the Debian cloud kernel the guests
#                       boot; its initrd loads virtio_mmio/virtio_blk and,
#                       given root=, mounts it and switches to init=
#
# Then, on a host with VMX/SVM:
#   pagefold bench build --guest linux --kernel OUTDIR/guest/vmlinux \
#       --initrd OUTDIR/guest/initrd.img --disk OUTDIR/build.ext4
#
# The guest's init mounts proc/sys/devtmpfs, unpacks the kernel tree onto
# the disk, prints `PAGEFOLD-BUILD-START nproc=N`, runs
# `make defconfig && make -j$(nproc)` under GNU time, prints
#   PAGEFOLD-BUILD-RESULT real=S user=S sys=S status=N sha256=<vmlinux hash or ->
# and powers off (after `pagefold.hold=SECONDS` from the kernel command line:
# the benchmark keeps the guest's memory in place until it has read its
# figures, then stops the VM). KBUILD_BUILD_TIMESTAMP/USER/HOST are fixed, so
# every build of the same tree yields the same vmlinux.
#
# Needs root (debootstrap chroots; mkfs.ext4 -d must read every file),
# network access to the Debian mirror, and e2fsprogs >= 1.43. debootstrap is
# used from the host if installed, else from its Debian package, downloaded
# with `apt-get download` into OUTDIR/.cache (not installed). Environment:
# PAGEFOLD_SUITE (default bookworm), PAGEFOLD_MIRROR (default
# http://deb.debian.org/debian). Reruns reuse the root tree in
# OUTDIR/.cache/root; delete it to start over.
set -euo pipefail

OUT=${1:?usage: $0 OUTDIR [IMAGE_SIZE]}
SIZE=${2:-12G}
SUITE=${PAGEFOLD_SUITE:-bookworm}
MIRROR=${PAGEFOLD_MIRROR:-http://deb.debian.org/debian}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT/.cache"
OUT=$(cd "$OUT" && pwd)
CACHE=$OUT/.cache
ROOT=$CACHE/root
PKGS=gcc,libc6-dev,make,bc,flex,bison,libelf-dev,libssl-dev,linux-source,xz-utils,time,perl

log() { echo "linux-build-bench: $*" >&2; }
die() { log "$*"; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (debootstrap chroots; mkfs.ext4 -d reads every file)"

# --- 1. The guests' kernel and initrd ----------------------------------------
"$HERE/guest-image.sh" "$OUT/guest"

# --- 2. debootstrap ------------------------------------------------------------
if command -v debootstrap >/dev/null; then
    DEBOOTSTRAP=(debootstrap)
else
    if [ ! -e "$CACHE/debootstrap/.done" ]; then
        log "debootstrap is not installed: using its Debian package unpacked in $CACHE"
        rm -rf "$CACHE/debootstrap"
        mkdir -p "$CACHE/debootstrap"
        (cd "$CACHE" && apt-get download -q debootstrap >&2)
        dpkg-deb -x "$(ls "$CACHE"/debootstrap_*.deb | head -n1)" "$CACHE/debootstrap"
        touch "$CACHE/debootstrap/.done"
    fi
    export DEBOOTSTRAP_DIR=$CACHE/debootstrap/usr/share/debootstrap
    DEBOOTSTRAP=("$CACHE/debootstrap/usr/sbin/debootstrap")
fi

# --- 3. The root tree ------------------------------------------------------------
if [ ! -e "$ROOT/.pagefold-done" ]; then
    log "debootstrap $SUITE (minbase + $PKGS) into $ROOT"
    rm -rf "$ROOT"
    "${DEBOOTSTRAP[@]}" --variant=minbase --include="$PKGS" "$SUITE" "$ROOT" "$MIRROR"
    # The downloaded packages and lists are not needed in the image.
    rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/*
    ls "$ROOT"/usr/src/linux-source-*.tar.* >/dev/null 2>&1 || die "no /usr/src/linux-source-*.tar.* in the root tree"
    touch "$ROOT/.pagefold-done"
fi

# --- 4. The guest's init -------------------------------------------------------------
cat >"$ROOT/pagefold-build-init" <<'EOF'
#!/bin/sh
# PID 1 of a pagefold Linux build guest (scripts/linux-build-bench.sh).
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LC_ALL=C
mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sysfs /sys
mountpoint -q /dev || mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
mount -o remount,rw / || echo "pagefold-build: cannot remount / read-write"
mount -t tmpfs tmpfs /tmp

hold=0
for w in $(cat /proc/cmdline); do
    case $w in pagefold.hold=*) hold=${w#pagefold.hold=} ;; esac
done
finish() {
    sync
    if [ "$hold" -gt 0 ] 2>/dev/null; then
        echo "pagefold-build: holding for $hold s (the host stops the VM)"
        sleep "$hold"
    fi
    # minbase has no init system: power off through the kernel (ACPI S5).
    echo o >/proc/sysrq-trigger
    sleep 10
    echo b >/proc/sysrq-trigger
}
result() { # STATUS [REAL USER SYS] [HASH]
    echo "PAGEFOLD-BUILD-RESULT real=${2:-0} user=${3:-0} sys=${4:-0} status=$1 sha256=${5:--}"
    finish
}

echo "pagefold-build: $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ {print $2}' /proc/meminfo) kB"
src=$(ls /usr/src/linux-source-*.tar.* 2>/dev/null | head -n1)
[ -n "$src" ] || { echo "pagefold-build: no kernel source tarball"; result 1; }
rm -rf /build
mkdir -p /build
echo "pagefold-build: unpacking $src"
tar -C /build -xf "$src" || { echo "pagefold-build: unpacking failed"; result 1; }
cd /build/linux-source-* || result 1
# Same tree, same config, same path and these: the same vmlinux every time.
export KBUILD_BUILD_TIMESTAMP="Thu Feb  7 00:00:00 UTC 2019"
export KBUILD_BUILD_USER=pagefold KBUILD_BUILD_HOST=pagefold KBUILD_BUILD_VERSION=1
n=$(nproc)
sync
echo "PAGEFOLD-BUILD-START nproc=$n"
/usr/bin/time -f "%e %U %S" -o /tmp/time sh -c "make defconfig && make -j$n" >/build/make.log 2>&1
status=$?
# GNU time writes "Command exited with non-zero status N" first on failure.
times=$(tail -n1 /tmp/time)
hash=-
if [ "$status" -eq 0 ]; then
    hash=$(sha256sum vmlinux | cut -d" " -f1)
else
    tail -n 30 /build/make.log
fi
set -- $times
result "$status" "$1" "$2" "$3" "$hash"
EOF
chmod 755 "$ROOT/pagefold-build-init"

# --- 5. The image ----------------------------------------------------------------------
if [ ! -s "$OUT/build.ext4" ] || [ "$ROOT/pagefold-build-init" -nt "$OUT/build.ext4" ] ||
    [ "$0" -nt "$OUT/build.ext4" ]; then
    log "making $OUT/build.ext4 ($SIZE)"
    rm -f "$OUT/build.ext4.tmp"
    mkfs.ext4 -q -F -L pfbuild -d "$ROOT" "$OUT/build.ext4.tmp" "$SIZE"
    mv "$OUT/build.ext4.tmp" "$OUT/build.ext4"
fi
log "done: $OUT/build.ext4, $OUT/guest/{vmlinux,bzImage,initrd.img}"
