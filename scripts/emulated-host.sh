#!/usr/bin/env bash
# Runs a command inside an emulated hardware-virtualization host: QEMU's TCG
# with `-cpu max` emulates an AMD CPU with SVM and nested paging, a stock
# Debian kernel loads kvm_amd there, and pagefold inside it runs real Linux
# guests. For machines whose /dev/kvm cannot run a Linux guest (PVM) or that
# have no KVM at all. Everything comes from Debian packages.
#
#   scripts/emulated-host.sh [OPTIONS] [--] COMMAND [ARG...]
#
# Options:
#   --kernel 6.1|6.12|PKG  host kernel: Debian 12's cloud kernel (6.1, the
#                          default), its 6.12 cloud kernel, or any meta or
#                          versioned linux-image package whose kvm-amd loads
#   --memory SIZE          host RAM (QEMU syntax; default 4G)
#   --cpus N               host vCPUs (default: this machine's CPUs, at most 4)
#   --bin FILE             a program for the host's PATH, with the shared
#                          libraries it needs (repeatable; default
#                          target/release/pagefold when it exists)
#   --file SRC[:DST]       a file or directory to put at /in/DST (default
#                          its base name) (repeatable)
#   --guest DIR            a guest image directory (scripts/guest-image.sh),
#                          available read-only at /guest (default
#                          target/guest-img when it exists)
#   --scratch SIZE         an empty ext4 disk of SIZE (sparse here),
#                          mounted read-write at /scratch: room for files
#                          larger than the host's RAM should hold (disk
#                          copies of the Linux build benchmark)
#   --out DIR              where the files the command leaves in /out land
#                          (default: discarded)
#   --timeout SECS         stop the emulated host after SECS (default 1800)
#   --image-dir DIR        cache of host images (default target/emulated-host)
#   --quiet                do not echo the host's console (it is still in
#                          --out's console.log when --out is given)
#   --watch SECS           every SECS, print the host's processes and the
#                          kernel stacks of pagefold's threads (for hangs)
#   --stall-trace SECS     for the Linux build benchmark: when a guest's
#                          console stays silent for SECS, sample KVM's trace
#                          events and pagefold's stacks into /out, then stop
#                          pagefold (scripts/lib/stall-watch.sh)
#
# Inside the host the command runs as root under busybox sh, in /work (a
# tmpfs), with /dev/kvm, /dev/userfaultfd, KSM's sysfs, /dev/net/tun and
# the bridge module (busybox's ip and brctl make taps and bridges; the
# host has no other network) and everything a stock kernel has. Its stdout and stderr go to the console, which this
# script prints; its exit status becomes this script's. /out is an empty
# directory whose contents come back to --out (tar on a second disk).
# Exit status: the command's, or 124 on timeout, or 125 when the host
# failed to start or report.
#
# Host kind: the command sees PAGEFOLD_HOST_KIND=emulated-svm in its
# environment and /proc/cpuinfo shows svm.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DK_NAME=emulated-host
# shellcheck source=scripts/lib/debian-kernel.sh
. "$ROOT/scripts/lib/debian-kernel.sh"
log() { dk_log "$@"; }
die() { log "$*"; exit 125; }

KERNEL=6.1
MEMORY=4G
CPUS=${PAGEFOLD_EMU_CPUS:-$(nproc)}
((CPUS > 4)) && CPUS=4
BINS=()
FILES=()
GUEST=
SCRATCH=
OUTDIR=
TIMEOUT=1800
IMAGES=$ROOT/target/emulated-host
QUIET=0
WATCH=0
STALL_TRACE=0
while (($#)); do
    case $1 in
    --kernel) KERNEL=${2:?}; shift 2 ;;
    --memory) MEMORY=${2:?}; shift 2 ;;
    --cpus) CPUS=${2:?}; shift 2 ;;
    --bin) BINS+=("${2:?}"); shift 2 ;;
    --file) FILES+=("${2:?}"); shift 2 ;;
    --guest) GUEST=${2:?}; shift 2 ;;
    --scratch) SCRATCH=${2:?}; shift 2 ;;
    --out) OUTDIR=${2:?}; shift 2 ;;
    --timeout) TIMEOUT=${2:?}; shift 2 ;;
    --image-dir) IMAGES=${2:?}; shift 2 ;;
    --quiet) QUIET=1; shift ;;
    --watch) WATCH=${2:?}; shift 2 ;;
    --stall-trace) STALL_TRACE=${2:?}; shift 2 ;;
    --) shift; break ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) log "unknown option $1 (see --help)"; exit 2 ;;
    *) break ;;
    esac
done
(($#)) || { log "no command given (see --help)"; exit 2; }
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 is missing: apt-get install qemu-system-x86"
command -v mkfs.ext4 >/dev/null || die "mkfs.ext4 is missing: apt-get install e2fsprogs"
if ((${#BINS[@]} == 0)) && [ -x "$ROOT/target/release/pagefold" ]; then
    BINS=("$ROOT/target/release/pagefold")
fi
if [ -z "$GUEST" ] && [ -d "$ROOT/target/guest-img" ]; then
    GUEST=$ROOT/target/guest-img
fi

case $KERNEL in
6.1) META=linux-image-cloud-amd64 ;;
6.12) META=linux-image-6.12-cloud-amd64 ;;
*) META=$KERNEL ;;
esac

# --- The host image: kernel + initramfs, cached per kernel package --------
mkdir -p "$IMAGES/.cache"
# One emulated host at a time: it fills the machine's CPUs, and two would
# make each other's timings meaningless (and race on the image cache).
exec 9>"$IMAGES/.run.lock"
if ! flock -n 9; then
    log "waiting for another emulated host (lock $IMAGES/.run.lock)"
    flock 9
fi
# The image cache lock is per checkout; the run lock is per machine, for
# emulated hosts started from other checkouts.
exec 8>"${TMPDIR:-/tmp}/pagefold-emulated-host.lock"
if ! flock -n 8; then
    log "waiting for another emulated host on this machine"
    flock 8
fi
CACHE=$IMAGES/.cache
# A meta package depends on its versioned image package; a versioned one
# on none.
PKG=$(dk_resolve "$META" 2>/dev/null) || PKG=$META
KDEB=$(dk_fetch "$PKG" "$CACHE")
BDEB=$(dk_fetch busybox-static "$CACHE")
dk_unpack "$KDEB" "$CACHE/$PKG"
dk_unpack "$BDEB" "$CACHE/busybox"
KVER=$(ls "$CACHE/$PKG/lib/modules" | head -n1)
HOST=$IMAGES/$KVER
mkdir -p "$HOST"
cmp -s "$CACHE/$PKG/boot/vmlinuz-$KVER" "$HOST/bzImage" || cp -f "$CACHE/$PKG/boot/vmlinuz-$KVER" "$HOST/bzImage"

build_host_initrd() {
    local root=$CACHE/initrd-$KVER
    rm -rf "$root"
    mkdir -p "$root"/{bin,dev,proc,sys,in,guest,out,work,tmp,run,etc,lib64,lib/x86_64-linux-gnu}
    cp "$CACHE/busybox/bin/busybox" "$root/bin/busybox"
    dk_modules_init "$CACHE/$PKG/lib/modules/$KVER"
    # Disks (virtio-pci), ext4 for them, KVM for AMD, and taps and a
    # bridge for the guests' virtio-net devices.
    for m in virtio_pci virtio_blk ext4 kvm_amd tun bridge; do dk_add_mod "$m"; done
    dk_install_modules "$root"
    echo "root:x:0:0:root:/work:/bin/sh" >"$root/etc/passwd"
    cat >"$root/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /work
for m in $(cat /modules.order); do
    insmod /lib/modules/$m 2>/dev/null || echo "emulated-host: insmod $m failed"
done
i=0
while [ ! -b /dev/vdb ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
mount -t ext4 -o ro /dev/vda /in || { echo "emulated-host: cannot mount the input disk"; poweroff -f; }
# The optional disks, named on the command line by the script that
# attached them (their letters depend on which are present).
for w in $(cat /proc/cmdline); do
    case $w in
    pagefold.guest=*) mount -t ext4 -o ro /dev/${w#*=} /guest ;;
    pagefold.scratch=*) mkdir -p /scratch && mount -t ext4 /dev/${w#*=} /scratch ;;
    esac
done
# The programs' shared libraries, where their ELF interpreter looks.
for f in /in/.lib/*; do
    [ -e "$f" ] || continue
    case ${f##*/} in
    ld-linux-x86-64.so.*) ln -sf "$f" /lib64/ ;;
    esac
    ln -sf "$f" /lib/x86_64-linux-gnu/
done
[ -e /dev/kvm ] || echo "emulated-host: no /dev/kvm (kvm_amd did not load)"
export PATH=/in/.bin:/bin HOME=/work PAGEFOLD_HOST_KIND=emulated-svm
cd /work
echo "EMULATED-HOST-READY $(uname -r)"
sh /in/.cmd
status=$?
echo "$status" >/out/.exit-status
sync
tar -cf /dev/vdb -C /out . || echo "emulated-host: cannot write the output disk"
sync
echo "EMULATED-HOST-EXIT $status"
poweroff -f
EOF
    chmod 755 "$root/init"
    dk_pack_initrd "$root" "$CACHE/busybox/bin/busybox" "$HOST/initrd.img"
}
if [ ! -s "$HOST/initrd.img" ] || [ "$0" -nt "$HOST/initrd.img" ] ||
    [ "$ROOT/scripts/lib/debian-kernel.sh" -nt "$HOST/initrd.img" ]; then
    log "building the host initramfs for $KVER"
    build_host_initrd
fi

# --- This run's disks: input (programs, files, the command), output --------
RUN=$(mktemp -d "${TMPDIR:-/tmp}/emulated-host.XXXXXX")
QEMU_PID=
cleanup() {
    [ -n "$QEMU_PID" ] && kill "$QEMU_PID" 2>/dev/null || true
    rm -rf "$RUN"
}
trap cleanup EXIT
IN=$RUN/in
mkdir -p "$IN/.bin" "$IN/.lib"
for b in "${BINS[@]}"; do
    [ -x "$b" ] || die "not an executable: $b"
    cp "$b" "$IN/.bin/"
    # Debug info is most of a release build of pagefold; the host needs none.
    strip --strip-debug "$IN/.bin/$(basename "$b")" 2>/dev/null || true
    # Shared libraries: ldd's "=> /path" and the interpreter's own path.
    ldd "$b" 2>/dev/null | awk '/=> \// { print $3 } /^\t\/.*ld-linux/ { print $1 }' |
        while read -r lib; do cp -L "$lib" "$IN/.lib/"; done
done
for f in "${FILES[@]}"; do
    src=${f%%:*}
    dst=${f#*:}
    [ "$dst" = "$f" ] && dst=$(basename "$src")
    [ -e "$src" ] || die "no such file: $src"
    mkdir -p "$(dirname "$IN/$dst")"
    cp -a "$src" "$IN/$dst"
done
if ((STALL_TRACE > 0)); then
    cp "$ROOT/scripts/lib/stall-watch.sh" "$IN/.stall-watch.sh"
fi
{
    printf 'exec 0</dev/null\n'
    if ((WATCH > 0)); then
        # shellcheck disable=SC2016
        printf '(while sleep %d; do echo "== watch $(cat /proc/uptime)"; ps -o pid,stat,time,comm; grep -E "MemFree|MemAvailable" /proc/meminfo; for t in /proc/[0-9]*/task/*; do case $(cat $t/comm 2>/dev/null) in pagefold*|*vcpu*|*scan*|*uffd*|*api*) echo "-- $t $(cat $t/comm) $(cut -d" " -f3 $t/stat)"; cat $t/stack 2>/dev/null | head -8;; esac; done; done) &\n' "$WATCH"
    fi
    if ((STALL_TRACE > 0)); then
        printf 'sh /in/.stall-watch.sh %d &\n' "$STALL_TRACE"
    fi
    printf '%q ' "$@"
    printf '\n'
} >"$IN/.cmd"
size_mb() { echo $(($(du -sm "$1" | cut -f1) * 5 / 4 + 32)); }
mkfs.ext4 -q -F -L pf-in -d "$IN" "$RUN/in.ext4" "$(size_mb "$IN")M" >/dev/null
truncate -s 1G "$RUN/out.tar"
DRIVES=(
    -drive "file=$RUN/in.ext4,if=virtio,format=raw,readonly=on"
    -drive "file=$RUN/out.tar,if=virtio,format=raw"
)
if [ -n "$GUEST" ]; then
    # The guest images as they are, read-only: a copy of the directory
    # without its download cache.
    mkdir -p "$RUN/guest"
    for f in "$GUEST"/*; do
        [ -f "$f" ] || continue
        ln "$f" "$RUN/guest/" 2>/dev/null || cp "$f" "$RUN/guest/"
    done
    mkfs.ext4 -q -F -L pf-guest -d "$RUN/guest" "$RUN/guest.ext4" "$(size_mb "$RUN/guest")M" >/dev/null
    DRIVES+=(-drive "file=$RUN/guest.ext4,if=virtio,format=raw,readonly=on")
fi
# virtio disks take letters in the order they are given: vda in, vdb out.
disk_letters=(c d)
EXTRA_APPEND=
if [ -n "$GUEST" ]; then
    EXTRA_APPEND+=" pagefold.guest=vd${disk_letters[0]}"
    disk_letters=("${disk_letters[@]:1}")
fi
if [ -n "$SCRATCH" ]; then
    truncate -s "$SCRATCH" "$RUN/scratch.ext4"
    mkfs.ext4 -q -F -L pf-scratch "$RUN/scratch.ext4" >/dev/null
    DRIVES+=(-drive "file=$RUN/scratch.ext4,if=virtio,format=raw")
    EXTRA_APPEND+=" pagefold.scratch=vd${disk_letters[0]}"
fi

# --- Run ---------------------------------------------------------------
# nox2apic: with the host kernel's x2APIC, a reschedule IPI sometimes
# reached a CPU in the few instructions between a guest's exit and KVM's
# VMLOAD of the host state, and the host kernel died in that interrupt
# with the guest's GS base (a stack guard page hit in exc_page_fault under
# sysvec_reschedule_ipi in svm_vcpu_enter_exit): within one or two runs of
# two guests in 4 of 5 sessions (QEMU 7.2 and 10.0, host 6.1). With the
# xAPIC, 10 runs of two guests booting had none; it still happens
# under two guests whose memory is merged (docs/linux-guests.md).
# mem-merge=off: QEMU would otherwise make its RAM mergeable for this
# machine's KSM, which the KSM tests and benchmarks here measure.
log "host $KVER, $CPUS vCPUs, $MEMORY; running: $*"
CONSOLE=$RUN/console.log
qemu-system-x86_64 -accel "tcg,thread=${PAGEFOLD_EMU_THREAD:-multi}" -cpu "${PAGEFOLD_EMU_CPU:-max}" -smp "$CPUS" -m "$MEMORY" \
    -machine q35,mem-merge=off -nodefaults -no-reboot -display none \
    -kernel "$HOST/bzImage" -initrd "$HOST/initrd.img" \
    -append "console=ttyS0 rdinit=/init panic=-1 quiet loglevel=3 nox2apic$EXTRA_APPEND ${PAGEFOLD_EMU_APPEND:-}" \
    "${DRIVES[@]}" -serial "file:$CONSOLE" </dev/null &
QEMU_PID=$!
# Echo the console as it grows; stop QEMU on the timeout.
tail_pid=
if ((QUIET == 0)); then
    tail -n +1 -F --pid="$QEMU_PID" "$CONSOLE" 2>/dev/null &
    tail_pid=$!
fi
deadline=$(($(date +%s) + TIMEOUT))
timed_out=0
while kill -0 "$QEMU_PID" 2>/dev/null; do
    if (($(date +%s) >= deadline)); then
        log "timeout after ${TIMEOUT}s: stopping the emulated host"
        kill "$QEMU_PID"
        timed_out=1
        break
    fi
    sleep 0.5
done
wait "$QEMU_PID" 2>/dev/null || true
QEMU_PID=
# tail reads to the end once QEMU is gone, then exits.
[ -n "$tail_pid" ] && { wait "$tail_pid" 2>/dev/null || true; }

mkdir -p "$RUN/outfiles"
tar -xf "$RUN/out.tar" -C "$RUN/outfiles" 2>/dev/null || true
if [ -n "$OUTDIR" ]; then
    mkdir -p "$OUTDIR"
    cp -a "$RUN/outfiles/." "$OUTDIR/"
    cp "$CONSOLE" "$OUTDIR/console.log"
fi
((timed_out)) && exit 124
if [ ! -s "$RUN/outfiles/.exit-status" ]; then
    log "the emulated host ended without reporting the command's status"
    ((QUIET)) && tail -n 40 "$CONSOLE" >&2
    exit 125
fi
exit "$(cat "$RUN/outfiles/.exit-status")"
