#!/usr/bin/env bash
# Builds the Linux test guest of pagefold from Debian packages only.
#
#   scripts/guest-image.sh OUTDIR
#
# Produces:
#   OUTDIR/bzImage      the Debian cloud kernel as shipped (vmlinuz)
#   OUTDIR/vmlinux      the ELF kernel extracted from it (extract-vmlinux method)
#   OUTDIR/initrd.img   busybox-static initramfs: loads the virtio-mmio,
#                       virtio-blk, virtio-net and virtio-balloon modules of
#                       the same kernel; with root= on the command
#                       line it mounts that disk and switches to its init=
#                       (scripts/linux-build-bench.sh); else it mounts /dev/vda
#                       if present, prints PAGEFOLD-INITRD-OK and powers off;
#                       with pagefold.agent=DEV it runs the guest agent
#                       (scripts from a mailbox disk, below) instead
#   OUTDIR/rootfs.ext4  a small ext4 image holding pagefold-test.txt
#   OUTDIR/data.ext4    104 MiB ext4: random-64m.bin, random-16m.bin (random
#                       bytes drawn once) and pagefold-test.txt, for guests
#                       that read the same files (agent tests, benchmarks);
#                       rt/: cyclictest (Debian's rt-tests) with the
#                       libraries it loads and their loader, for the latency
#                       probe of `bench linux-read` (the initramfs has no
#                       C library: run it as rt/ld-linux-x86-64.so.2
#                       --library-path /data/rt /data/rt/cyclictest)
#   OUTDIR/kernel-version
#
# Downloads (apt-get download) are cached in OUTDIR/.cache; running it again
# reuses them and rebuilds only missing outputs. Needs: apt-get, dpkg-deb, xz,
# mkfs.ext4 (e2fsprogs), and the decompressor of the kernel's payload
# (lz4 for Debian 12's kernels; xz/gzip/zstd/bzip2 for others). Root is not required
# for the build itself, but `apt-get update` (run only if the package is not
# known to apt) is.
set -euo pipefail

OUT=${1:?usage: $0 OUTDIR}
mkdir -p "$OUT/.cache"
OUT=$(cd "$OUT" && pwd)
CACHE=$OUT/.cache

DK_NAME=guest-image
# shellcheck source=scripts/lib/debian-kernel.sh
. "$(dirname "$0")/lib/debian-kernel.sh"
log() { dk_log "$@"; }

# --- 1. Resolve the versioned cloud kernel package, 2. download (cached) ---
PKG=$(dk_resolve linux-image-cloud-amd64)
log "kernel package: $PKG"
KDEB=$(dk_fetch "$PKG" "$CACHE")
BDEB=$(dk_fetch busybox-static "$CACHE")
dk_unpack "$KDEB" "$CACHE/kernel"
dk_unpack "$BDEB" "$CACHE/busybox"
# cyclictest and what it links against (the guest's latency probe).
for p in rt-tests libnuma1 libc6; do
    dk_unpack "$(dk_fetch "$p" "$CACHE")" "$CACHE/$p"
done

KVER=$(ls "$CACHE/kernel/lib/modules" | head -n1)
MODDIR=$CACHE/kernel/lib/modules/$KVER
echo "$KVER" >"$OUT/kernel-version"
log "kernel version: $KVER"

# --- 3. bzImage and vmlinux -------------------------------------------------
cmp -s "$CACHE/kernel/boot/vmlinuz-$KVER" "$OUT/bzImage" || cp -f "$CACHE/kernel/boot/vmlinuz-$KVER" "$OUT/bzImage"

is_elf() { [ "$(head -c4 "$1" | od -An -c | tr -d ' ')" = "177ELF" ]; }

le32() { # FILE OFFSET -> little-endian u32
    od -An -tu4 -j "$2" -N4 "$1" | tr -d ' '
}
# The kernel's scripts/extract-vmlinux method: find the compressed payload,
# identify its compression by magic, decompress, keep the result if it is an
# ELF file. The payload is found exactly through the boot-protocol header
# (setup_sects at 0x1f1, payload_offset/payload_length at 0x248/0x24c).
extract_vmlinux() {
    local img=$1 dst=$2
    local tmp=$dst.tmp setup_sects off len magic cmd
    setup_sects=$(od -An -tu1 -j $((0x1f1)) -N1 "$img" | tr -d ' ')
    [ "$setup_sects" -eq 0 ] && setup_sects=4
    off=$(( (setup_sects + 1) * 512 + $(le32 "$img" $((0x248))) ))
    len=$(le32 "$img" $((0x24c)))
    magic=$(od -An -tx1 -j "$off" -N6 "$img" | tr -d ' \n')
    case "$magic" in
    fd377a585a00*) cmd="xz -dc" ;;
    1f8b08*) cmd="gzip -dc" ;;
    28b52ffd*) cmd="zstd -dcq" ;;
    02214c18*) cmd="lz4 -dc" ;;
    5d000000*) cmd="xz -dc --format=lzma" ;;
    425a68*) cmd="bzip2 -dc" ;;
    *) log "unknown payload magic $magic at $off"; return 1 ;;
    esac
    log "payload: $len bytes at $off, ${cmd%% *}"
    tail -c+$((off + 1)) "$img" | head -c "$len" | $cmd >"$tmp" 2>/dev/null || true
    if [ -s "$tmp" ] && is_elf "$tmp"; then
        mv "$tmp" "$dst"
        return 0
    fi
    rm -f "$tmp"
    return 1
}
if [ ! -s "$OUT/vmlinux" ] || ! is_elf "$OUT/vmlinux" || [ "$OUT/bzImage" -nt "$OUT/vmlinux" ]; then
    log "extracting vmlinux"
    extract_vmlinux "$OUT/bzImage" "$OUT/vmlinux" || { log "no ELF payload found in bzImage"; exit 1; }
fi

# --- 4. initrd ----------------------------------------------------------------
dk_modules_init "$MODDIR"
for m in virtio virtio_ring virtio_mmio virtio_blk virtio_net virtio_balloon ext4; do dk_add_mod "$m"; done

build_initrd() {
    local root=$CACHE/initrd-root
    rm -rf "$root"
    mkdir -p "$root"/{bin,dev,proc,sys,mnt,tmp}
    cp "$CACHE/busybox/bin/busybox" "$root/bin/busybox"
    dk_install_modules "$root"
    cat >"$root/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# Without a /dev/console node in the archive the kernel starts us with no
# stdio; devtmpfs has one now.
exec </dev/console >/dev/console 2>&1
echo "pagefold initrd: $(uname -r)"
for m in $(cat /modules.order); do
    insmod /lib/modules/$m || echo "pagefold initrd: insmod $m failed"
done
# Give the virtio-mmio probe a moment to create the disk node.
i=0
while [ ! -b /dev/vda ] && [ $i -lt 10 ]; do sleep 0.2; i=$((i + 1)); done
# root=DEV on the command line: mount it (read-write with "rw") and hand
# over to its init= (default /sbin/init), as a distribution's initramfs
# does; the Linux build benchmark boots its disk this way.
# pagefold.agent=DEV: run the guest agent on mailbox disk DEV (below),
# with pagefold.data=DEV mounted read-only at /data.
root=
init=/sbin/init
mode=ro
agent=
data=
for w in $(cat /proc/cmdline); do
    case $w in
    root=*) root=${w#root=} ;;
    init=*) init=${w#init=} ;;
    rw) mode=rw ;;
    pagefold.agent=*) agent=${w#pagefold.agent=} ;;
    pagefold.data=*) data=${w#pagefold.data=} ;;
    esac
done
if [ -n "$agent" ]; then
    i=0
    while [ ! -b "$agent" ] && [ $i -lt 25 ]; do sleep 0.2; i=$((i + 1)); done
    mkdir -p /tmp && mount -t tmpfs tmpfs /tmp
    mkdir -p /data
    if [ -n "$data" ]; then
        mount -t ext4 -o ro "$data" /data || echo "pagefold initrd: cannot mount $data"
    fi
    exec sh /agent.sh "$agent"
fi
if [ -n "$root" ]; then
    mkdir -p /newroot
    if mount -t ext4 -o $mode "$root" /newroot; then
        for d in dev proc sys; do mount -o move /$d /newroot/$d; done
        echo "pagefold initrd: switching to $root ($mode), $init"
        exec switch_root /newroot "$init"
    fi
    echo "pagefold initrd: cannot mount root $root"
fi
if [ -b /dev/vda ]; then
    if mount -t ext4 -o ro /dev/vda /mnt; then
        echo "PAGEFOLD-DISK: $(cat /mnt/pagefold-test.txt)"
        umount /mnt
    else
        echo "pagefold initrd: mounting /dev/vda failed"
    fi
else
    echo "pagefold initrd: no /dev/vda"
fi
echo PAGEFOLD-INITRD-OK
sync
poweroff -f
# Without an ACPI S5 path the kernel halts; try a reset so the VMM exits.
reboot -f
EOF
    chmod 755 "$root/init"
    # The guest agent: runs the scripts a host test or benchmark writes to
    # a mailbox disk (vmm/src/linux/agent.rs has the host side). Its first
    # 64 KiB read "PFAGENT <seq> <CRC-32 of the script, 8 hex digits>", a
    # newline, the script, NUL padding; they are read with O_DIRECT, so
    # each poll sees the file as the host last wrote it. A new sequence
    # number whose checksum matches (a read torn by the host's write does
    # not) runs once; its output on the console sits between
    # PAGEFOLD-AGENT-BEGIN <seq> and PAGEFOLD-AGENT-END <seq> <status>.
    # While it runs, PAGEFOLD-AGENT-BUSY <seq> <ticks> lines every 10 s
    # give the CPU time the guest has spent busy (user, nice, system, irq
    # and softirq ticks of /proc/stat): the host tells a slow command,
    # whose count grows, from a stuck one, whose count stands still.
    cat >"$root/agent.sh" <<'EOF'
mbox=$1
last=
busy() {
    read -r _ user nice system idle iowait irq softirq _ </proc/stat
    echo $((user + nice + system + irq + softirq))
}
echo "PAGEFOLD-AGENT-READY $(uname -r)"
while :; do
    if dd if="$mbox" of=/tmp/mbox bs=65536 count=1 iflag=direct 2>/dev/null; then
        set -- $(head -n 1 /tmp/mbox | tr -d '\0')
        if [ "$1" = PFAGENT ] && [ -n "$2" ] && [ "$2" != "$last" ]; then
            tail -n +2 /tmp/mbox | tr -d '\0' >/tmp/cmd.sh
            if [ "$(crc32 </tmp/cmd.sh)" = "$3" ]; then
                last=$2
                echo "PAGEFOLD-AGENT-BEGIN $2"
                (while :; do echo "PAGEFOLD-AGENT-BUSY $2 $(busy)"; sleep 10; done) &
                beat=$!
                (cd /tmp && sh /tmp/cmd.sh)
                status=$?
                kill $beat
                wait $beat 2>/dev/null
                echo "PAGEFOLD-AGENT-END $2 $status"
            fi
        fi
    fi
    sleep 0.3
done
EOF
    dk_pack_initrd "$root" "$CACHE/busybox/bin/busybox" "$OUT/initrd.img"
}
if [ ! -s "$OUT/initrd.img" ] || [ "$0" -nt "$OUT/initrd.img" ] || [ "$KDEB" -nt "$OUT/initrd.img" ]; then
    log "building initrd (${#DK_ORDER[@]} modules: ${DK_ORDER[*]##*/})"
    build_initrd
fi

# --- 5. rootfs ------------------------------------------------------------------
if [ ! -s "$OUT/rootfs.ext4" ] || [ "$0" -nt "$OUT/rootfs.ext4" ]; then
    log "building rootfs.ext4"
    rm -rf "$CACHE/rootfs-root"
    mkdir -p "$CACHE/rootfs-root"
    echo "hello from the pagefold test disk" >"$CACHE/rootfs-root/pagefold-test.txt"
    rm -f "$OUT/rootfs.ext4.tmp"
    mkfs.ext4 -q -F -L pagefold -d "$CACHE/rootfs-root" "$OUT/rootfs.ext4.tmp" 16M
    mv "$OUT/rootfs.ext4.tmp" "$OUT/rootfs.ext4"
fi

# --- 6. data disk: files two guests read alike (agent tests, benchmarks) --------
# 64 MiB of random bytes (one draw, kept: every VM reads the same disk), a
# second 16 MiB random file, the test file and the latency probe (rt/), on
# a 104 MiB ext4 disk.
if [ ! -s "$OUT/data.ext4" ] || [ "$0" -nt "$OUT/data.ext4" ]; then
    log "building data.ext4"
    rm -rf "$CACHE/data-root"
    mkdir -p "$CACHE/data-root"
    head -c 64M /dev/urandom >"$CACHE/data-root/random-64m.bin"
    head -c 16M /dev/urandom >"$CACHE/data-root/random-16m.bin"
    echo "hello from the pagefold test disk" >"$CACHE/data-root/pagefold-test.txt"
    rt=$CACHE/data-root/rt
    mkdir -p "$rt"
    cp "$CACHE/rt-tests/usr/bin/cyclictest" "$rt/"
    # The loader and every library cyclictest names (readelf: librt,
    # libpthread, libnuma, libc), resolved through their symlinks.
    for l in lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 lib/x86_64-linux-gnu/libc.so.6 \
        lib/x86_64-linux-gnu/librt.so.1 lib/x86_64-linux-gnu/libpthread.so.0; do
        cp -L "$CACHE/libc6/$l" "$rt/"
    done
    cp -L "$CACHE/libnuma1/usr/lib/x86_64-linux-gnu/libnuma.so.1" "$rt/"
    rm -f "$OUT/data.ext4.tmp"
    mkfs.ext4 -q -F -L pagefold-data -d "$CACHE/data-root" "$OUT/data.ext4.tmp" 104M
    mv "$OUT/data.ext4.tmp" "$OUT/data.ext4"
    rm -rf "$CACHE/data-root"
fi

log "done: $(cd "$OUT" && ls bzImage vmlinux initrd.img rootfs.ext4 data.ext4 | tr '\n' ' ')"
