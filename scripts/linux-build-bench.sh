#!/usr/bin/env bash
# Builds the disk image of the real-Linux build benchmark
# (`pagefold bench build --guest linux`, docs/benchmarks.md) from Debian
# packages only.
#
#   sudo scripts/linux-build-bench.sh OUTDIR [IMAGE_SIZE]
#
# Produces:
#   OUTDIR/build.ext4   ext4 root filesystem (IMAGE_SIZE, default 3G, sparse):
#                       a Debian minbase system (debootstrap) with gcc,
#                       libc6-dev, make, bc, flex, bison, libelf-dev,
#                       libssl-dev and GNU time; the Debian kernel tree
#                       (linux-source) unpacked in /build, configured
#                       (`make ARCH=x86_64 tinyconfig`) and prepared
#                       (`make prepare`: generated headers, objtool), with
#                       the sources no tinyconfig build reads removed; and
#                       /pagefold-build-init, the guest's init (below)
#   OUTDIR/guest/       scripts/guest-image.sh's kernel (vmlinux, bzImage)
#                       and initrd.img: the Debian cloud kernel the guests
#                       boot; its initrd loads virtio_mmio/virtio_blk and,
#                       given root=, mounts it and switches to init=
#
# Then, on a host with VMX/SVM (or inside scripts/emulated-host.sh):
#   pagefold bench build --guest linux --kernel OUTDIR/guest/vmlinux \
#       --initrd OUTDIR/guest/initrd.img --disk OUTDIR/build.ext4
#
# The guest's init mounts proc/sys/devtmpfs, prints
# `PAGEFOLD-BUILD-START nproc=N`, runs `make ARCH=x86_64 -j$(nproc) TARGETS`
# in the tree under GNU time, prints
#   PAGEFOLD-BUILD-RESULT real=S user=S sys=S status=N sha256=<objects hash or ->
# and powers off (after `pagefold.hold=SECONDS` from the kernel command line:
# the benchmark keeps the guest's memory in place until it has read its
# figures, then stops the VM). TARGETS are kbuild targets (directories, or
# vmlinux for the whole kernel): `pagefold.make=a/,b/` on the kernel command
# line, else the image's default, PAGEFOLD_BUILD_TARGETS when it was made
# (default `init/`: 6 objects, about 2 s of one CPU natively and 80 s
# under the emulated host, so that one run of every system fits in 30
# minutes there; `mm/`, 47 objects, took over 20 minutes per system
# there). docs/benchmarks.md says why this tree. The hash covers every
# object file under a directory target and a file target itself, in name
# order; KBUILD_BUILD_TIMESTAMP/USER/HOST are fixed, so every build of the
# same tree yields the same objects.
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
SIZE=${2:-3G}
SUITE=${PAGEFOLD_SUITE:-bookworm}
MIRROR=${PAGEFOLD_MIRROR:-http://deb.debian.org/debian}
TARGETS=${PAGEFOLD_BUILD_TARGETS:-init/}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT/.cache"
OUT=$(cd "$OUT" && pwd)
CACHE=$OUT/.cache
ROOT=$CACHE/root
PKGS=gcc,libc6-dev,make,bc,flex,bison,libelf-dev,libssl-dev,linux-source,xz-utils,time,perl
# The same build flags for every guest build: the objects are identical.
KBUILD_ENV=(KBUILD_BUILD_TIMESTAMP="Thu Feb  7 00:00:00 UTC 2019" KBUILD_BUILD_USER=pagefold
    KBUILD_BUILD_HOST=pagefold KBUILD_BUILD_VERSION=1)

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

# --- 4. The kernel tree, configured and prepared -------------------------------
# Unpacking 1.5 GB and running kconfig in every guest would cost more than
# the build under emulation, so both happen once, here, in the image's own
# toolchain (chroot). The sources outside what an x86_64 tinyconfig build
# reads (other architectures, drivers, sound, networking, documentation)
# are removed, except the Kconfig and Makefile files kbuild checks: 261 MB
# instead of 1.5 GB to copy per VM and run.
if [ ! -e "$ROOT/.pagefold-tree-done" ]; then
    src=$(ls "$ROOT"/usr/src/linux-source-*.tar.* 2>/dev/null | head -n1)
    [ -n "$src" ] || die "no /usr/src/linux-source-*.tar.* in the root tree"
    log "unpacking $(basename "$src") into $ROOT/build"
    rm -rf "$ROOT/build"
    mkdir -p "$ROOT/build"
    tar -C "$ROOT/build" -xf "$src"
    tree=$(cd "$ROOT/build" && ls -d linux-source-* | head -n1)
    mounted=()
    unmount_chroot() {
        local m
        for m in "${mounted[@]}"; do umount "$m" 2>/dev/null || true; done
    }
    trap unmount_chroot EXIT
    for m in proc sys dev; do
        mount --bind "/$m" "$ROOT/$m"
        mounted=("$ROOT/$m" "${mounted[@]}")
    done
    log "configuring $tree: make ARCH=x86_64 tinyconfig prepare"
    chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C \
        "${KBUILD_ENV[@]}" sh -c "cd /build/$tree && make -s ARCH=x86_64 tinyconfig >/dev/null &&
            make -s ARCH=x86_64 -j$(nproc) prepare" || die "configuring the kernel tree failed"
    unmount_chroot
    mounted=()
    trap - EXIT
    (
        cd "$ROOT/build/$tree"
        for d in Documentation drivers sound net samples arch/*; do
            [ "$d" = arch/x86 ] && continue
            [ -e "$d" ] || continue
            find "$d" -type f ! -name 'Kconfig*' ! -name 'Makefile*' ! -name 'Kbuild*' -delete
        done
    )
    # The tarball itself is not needed in the image.
    rm -f "$src"
    touch "$ROOT/.pagefold-tree-done"
fi

# --- 5. The guest's init -------------------------------------------------------------
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
targets="@TARGETS@"
for w in $(cat /proc/cmdline); do
    case $w in pagefold.make=*) targets=$(echo "${w#pagefold.make=}" | tr , " ") ;; esac
done
cd /build/linux-source-* || { echo "pagefold-build: no kernel tree in /build"; result 1; }
# Same tree, same config, same path and these: the same objects every time.
export KBUILD_BUILD_TIMESTAMP="Thu Feb  7 00:00:00 UTC 2019"
export KBUILD_BUILD_USER=pagefold KBUILD_BUILD_HOST=pagefold KBUILD_BUILD_VERSION=1
n=$(nproc)
sync
echo "PAGEFOLD-BUILD-START nproc=$n targets=$targets"
# A line a minute on the console: how far the build is (the host shows
# the consoles' last lines when a run fails or hangs).
(while sleep 60; do
    echo "pagefold-build: $(grep -c '^  CC' /tmp/make.log) objects compiled"
done) &
progress=$!
/usr/bin/time -f "%e %U %S" -o /tmp/time make ARCH=x86_64 -j"$n" $targets >/tmp/make.log 2>&1
status=$?
kill "$progress"
# GNU time writes "Command exited with non-zero status N" first on failure.
times=$(tail -n1 /tmp/time)
hash=-
if [ "$status" -eq 0 ]; then
    # A directory target: its objects; a file target (vmlinux): the file.
    hash=$(for t in $targets; do
        if [ -d "$t" ]; then find "$t" -name '*.o'; else echo "$t"; fi
    done | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d" " -f1)
else
    tail -n 30 /tmp/make.log
fi
set -- $times
result "$status" "$1" "$2" "$3" "$hash"
EOF
sed -i "s|@TARGETS@|$TARGETS|" "$ROOT/pagefold-build-init"
chmod 755 "$ROOT/pagefold-build-init"

# --- 6. The image ----------------------------------------------------------------------
if [ ! -s "$OUT/build.ext4" ] || [ "$ROOT/pagefold-build-init" -nt "$OUT/build.ext4" ] ||
    [ "$0" -nt "$OUT/build.ext4" ]; then
    log "making $OUT/build.ext4 ($SIZE)"
    rm -f "$OUT/build.ext4.tmp"
    mkfs.ext4 -q -F -L pfbuild -d "$ROOT" "$OUT/build.ext4.tmp" "$SIZE"
    mv "$OUT/build.ext4.tmp" "$OUT/build.ext4"
fi
log "done: $OUT/build.ext4, $OUT/guest/{vmlinux,bzImage,initrd.img}"
