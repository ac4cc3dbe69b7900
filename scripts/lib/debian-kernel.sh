# Shell functions shared by scripts/guest-image.sh and
# scripts/emulated-host.sh: fetch a Debian kernel package and busybox with
# apt (cached), resolve kernel modules with their dependencies, pack an
# initramfs. Source it; it defines functions only.
#
# Needs: apt-get, apt-cache, dpkg-deb, and the decompressors of the
# modules (xz, zstd, gzip).

dk_log() { echo "${DK_NAME:-debian-kernel}: $*" >&2; }

# dk_resolve META: the versioned package a kernel meta-package depends on
# (linux-image-cloud-amd64 -> linux-image-6.1.0-NN-cloud-amd64). Runs
# `apt-get update` once if apt does not know META yet.
dk_resolve() {
    local meta=$1 pkg
    pkg=$(apt-cache depends "$meta" 2>/dev/null |
        awk '/Depends: linux-image-[0-9].*-amd64/ { print $2; exit }' || true)
    if [ -z "$pkg" ]; then
        dk_log "apt does not know $meta; running apt-get update"
        apt-get update -qq
        pkg=$(apt-cache depends "$meta" 2>/dev/null |
            awk '/Depends: linux-image-[0-9].*-amd64/ { print $2; exit }')
    fi
    [ -n "$pkg" ] || { dk_log "cannot resolve $meta"; return 1; }
    echo "$pkg"
}

# dk_fetch NAME CACHE: prints the path of NAME's .deb in CACHE, downloading
# it with `apt-get download` the first time.
dk_fetch() {
    local name=$1 cache=$2 deb
    deb=$(ls "$cache"/"${name}"_*.deb 2>/dev/null | head -n1 || true)
    if [ -z "$deb" ]; then
        dk_log "downloading $name"
        (cd "$cache" && apt-get download -q "$name" >&2)
        deb=$(ls "$cache"/"${name}"_*.deb | head -n1)
    fi
    echo "$deb"
}

# dk_unpack DEB DIR: extracts DEB into DIR once.
dk_unpack() {
    if [ ! -e "$2/.done" ]; then
        rm -rf "$2"
        mkdir -p "$2"
        dpkg-deb -x "$1" "$2"
        touch "$2/.done"
    fi
}

# Module resolution. Call dk_modules_init MODDIR, then dk_add_mod NAME for
# each module wanted; DK_ORDER then lists their paths (relative to MODDIR)
# in load order, dependencies first. Debian's package ships no modules.dep
# (depmod makes it at install time), so dependencies come from each
# module's .modinfo `depends=` line; built-in modules (modules.builtin)
# need no loading.
dk_modules_init() {
    DK_MODDIR=$1
    DK_ORDER=()
    declare -gA DK_SEEN=()
}

dk_mod_path() { # NAME -> path relative to DK_MODDIR, or empty
    local n=${1//-/_}
    (cd "$DK_MODDIR" && find kernel -type f \( -name "$n.ko" -o -name "$n.ko.*" \
        -o -name "${1//_/-}.ko" -o -name "${1//_/-}.ko.*" \) | head -n1)
}

dk_mod_cat() { # REL_PATH -> module bytes, decompressed
    case "$1" in
    *.ko.xz) xz -dc "$DK_MODDIR/$1" ;;
    *.ko.zst) zstd -dcq "$DK_MODDIR/$1" ;;
    *.ko.gz) gzip -dc "$DK_MODDIR/$1" ;;
    *) cat "$DK_MODDIR/$1" ;;
    esac
}

dk_is_builtin() { grep -q "/${1//_/[_-]}\.ko\$" "$DK_MODDIR/modules.builtin"; }

dk_add_mod() { # NAME
    local name=$1 rel deps dep
    [ -n "${DK_SEEN[$name]:-}" ] && return 0
    DK_SEEN[$name]=1
    if dk_is_builtin "$name"; then
        dk_log "module $name is built in"
        return 0
    fi
    rel=$(dk_mod_path "$name")
    [ -n "$rel" ] || { dk_log "module $name not found in $DK_MODDIR"; return 1; }
    deps=$(dk_mod_cat "$rel" | tr '\0' '\n' | sed -n 's/^depends=//p' | head -n1 | tr ',' ' ')
    for dep in $deps; do dk_add_mod "$dep" || return 1; done
    DK_ORDER+=("$rel")
}

# dk_install_modules ROOT: writes the modules of DK_ORDER, decompressed,
# to ROOT/lib/modules and their names in load order to ROOT/modules.order.
dk_install_modules() {
    local root=$1 rel name
    mkdir -p "$root/lib/modules"
    : >"$root/modules.order"
    for rel in "${DK_ORDER[@]}"; do
        name=$(basename "$rel")
        name=${name%.xz}
        name=${name%.zst}
        name=${name%.gz}
        dk_mod_cat "$rel" >"$root/lib/modules/$name"
        echo "$name" >>"$root/modules.order"
    done
}

# dk_pack_initrd ROOT BUSYBOX OUT: a gzip'd newc cpio of ROOT (owned by
# root, sorted, reproducible), written atomically to OUT. The kernel opens
# /dev/console for init before /init runs; the node needs root to create
# (without it /init redirects once devtmpfs is mounted).
dk_pack_initrd() {
    local root=$1 busybox=$2 out=$3
    mkdir -p "$root/dev"
    mknod -m 600 "$root/dev/console" c 5 1 2>/dev/null || dk_log "not root: no /dev/console node in the initrd"
    (cd "$root" && find . -mindepth 1 | LC_ALL=C sort |
        "$busybox" cpio -o -H newc -R 0:0 2>/dev/null) | gzip -9n >"$out.tmp"
    mv "$out.tmp" "$out"
}
