#!/usr/bin/env bash
# Builds the Linux test guest of pagefold from Debian packages only.
#
#   scripts/guest-image.sh OUTDIR
#
# Produces:
#   OUTDIR/bzImage      the Debian cloud kernel as shipped (vmlinuz)
#   OUTDIR/vmlinux      the ELF kernel extracted from it (extract-vmlinux method)
#   OUTDIR/initrd.img   busybox-static initramfs: loads the virtio-mmio/blk
#                       modules of the same kernel; with root= on the command
#                       line it mounts that disk and switches to its init=
#                       (scripts/linux-build-bench.sh); else it mounts /dev/vda
#                       if present, prints PAGEFOLD-INITRD-OK and powers off
#   OUTDIR/rootfs.ext4  a small ext4 image holding pagefold-test.txt
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

log() { echo "guest-image: $*" >&2; }

# --- 1. Resolve the versioned cloud kernel package ------------------------
kernel_pkg() {
    apt-cache depends linux-image-cloud-amd64 2>/dev/null |
        awk '/Depends: linux-image-[0-9].*-cloud-amd64/ { print $2; exit }'
}
PKG=$(kernel_pkg || true)
if [ -z "$PKG" ]; then
    log "apt does not know linux-image-cloud-amd64; running apt-get update"
    apt-get update -qq
    PKG=$(kernel_pkg)
fi
[ -n "$PKG" ] || { log "cannot resolve linux-image-cloud-amd64"; exit 1; }
log "kernel package: $PKG"

# --- 2. Download (cached) --------------------------------------------------
fetch_deb() { # NAME -> prints path of the cached .deb
    local name=$1 deb
    deb=$(ls "$CACHE"/"${name}"_*.deb 2>/dev/null | head -n1 || true)
    if [ -z "$deb" ]; then
        log "downloading $name"
        (cd "$CACHE" && apt-get download -q "$name" >&2)
        deb=$(ls "$CACHE"/"${name}"_*.deb | head -n1)
    fi
    echo "$deb"
}
KDEB=$(fetch_deb "$PKG")
BDEB=$(fetch_deb busybox-static)

unpack() { # DEB DIR: extract once
    if [ ! -e "$2/.done" ]; then
        rm -rf "$2"
        mkdir -p "$2"
        dpkg-deb -x "$1" "$2"
        touch "$2/.done"
    fi
}
unpack "$KDEB" "$CACHE/kernel"
unpack "$BDEB" "$CACHE/busybox"

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
# Modules in load order, dependencies first. The package ships no
# modules.dep (depmod makes it at install time), so dependencies come from
# each module's .modinfo `depends=` line. Built-in modules (modules.builtin)
# need no loading.
declare -A SEEN=()
ORDER=()
mod_path() { # NAME -> path relative to MODDIR, or empty
    local n=${1//-/_}
    (cd "$MODDIR" && find kernel -type f \( -name "$n.ko" -o -name "$n.ko.*" \
        -o -name "${1//_/-}.ko" -o -name "${1//_/-}.ko.*" \) | head -n1)
}
mod_cat() { # REL_PATH -> module bytes, decompressed
    case "$1" in
    *.ko.xz) xz -dc "$MODDIR/$1" ;;
    *.ko.zst) zstd -dcq "$MODDIR/$1" ;;
    *.ko.gz) gzip -dc "$MODDIR/$1" ;;
    *) cat "$MODDIR/$1" ;;
    esac
}
is_builtin() { grep -q "/${1//_/[_-]}\.ko\$" "$MODDIR/modules.builtin"; }
add_mod() { # NAME
    local name=$1 rel deps dep
    [ -n "${SEEN[$name]:-}" ] && return 0
    SEEN[$name]=1
    if is_builtin "$name"; then
        log "module $name is built in"
        return 0
    fi
    rel=$(mod_path "$name")
    [ -n "$rel" ] || { log "module $name not found in $KVER"; exit 1; }
    deps=$(mod_cat "$rel" | tr '\0' '\n' | sed -n 's/^depends=//p' | head -n1 | tr ',' ' ')
    for dep in $deps; do add_mod "$dep"; done
    ORDER+=("$rel")
}
for m in virtio virtio_ring virtio_mmio virtio_blk ext4; do add_mod "$m"; done

build_initrd() {
    local root=$CACHE/initrd-root
    rm -rf "$root"
    mkdir -p "$root"/{bin,dev,proc,sys,mnt,lib/modules}
    cp "$CACHE/busybox/bin/busybox" "$root/bin/busybox"
    : >"$root/modules.order"
    for rel in "${ORDER[@]}"; do
        local name
        name=$(basename "$rel")
        name=${name%.xz}
        name=${name%.zst}
        name=${name%.gz}
        mod_cat "$rel" >"$root/lib/modules/$name"
        echo "$name" >>"$root/modules.order"
    done
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
root=
init=/sbin/init
mode=ro
for w in $(cat /proc/cmdline); do
    case $w in
    root=*) root=${w#root=} ;;
    init=*) init=${w#init=} ;;
    rw) mode=rw ;;
    esac
done
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
    # The kernel opens /dev/console for init before /init runs; the node
    # needs root to create (without it /init redirects after devtmpfs).
    mknod -m 600 "$root/dev/console" c 5 1 2>/dev/null || log "not root: no /dev/console node in the initrd"
    (cd "$root" && find . -mindepth 1 | LC_ALL=C sort |
        "$CACHE/busybox/bin/busybox" cpio -o -H newc -R 0:0 2>/dev/null) | gzip -9n >"$OUT/initrd.img.tmp"
    mv "$OUT/initrd.img.tmp" "$OUT/initrd.img"
}
if [ ! -s "$OUT/initrd.img" ] || [ "$0" -nt "$OUT/initrd.img" ] || [ "$KDEB" -nt "$OUT/initrd.img" ]; then
    log "building initrd (${#ORDER[@]} modules: ${ORDER[*]##*/})"
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

log "done: $(cd "$OUT" && ls bzImage vmlinux initrd.img rootfs.ext4 | tr '\n' ' ')"
