#!/usr/bin/env bash
# Builds the Debian package of pagefold from the release binary, with
# dpkg-deb only (no debhelper): target/debian/pagefold_VERSION_amd64.deb.
#
#   /usr/bin/pagefold                          the binary (no benchmarks)
#   /lib/systemd/system/pagefold.service       the unit, ExecStart=/usr/bin/pagefold
#   /usr/share/man/man1/pagefold*.1.gz         `pagefold man`
#   /usr/share/bash-completion/completions/pagefold, zsh and fish completions
#   /usr/share/pagefold/prometheus/            the example rules and their tests
#   /usr/share/doc/pagefold/                   README.md, docs/metrics.md, copyright
#
# The service is installed but neither enabled nor started: dedup and VMs
# are the operator's decision (`systemctl enable --now pagefold`).
#   scripts/deb.sh            # builds the release binary first if needed
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --bin pagefold
BIN=target/release/pagefold
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
[[ -n $VERSION ]] || { echo "deb.sh: no version in Cargo.toml" >&2; exit 1; }
COMMIT=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
# Every GLIBC symbol version the binary needs is at most this one.
GLIBC=$(objdump -T "$BIN" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -Vu | tail -n1)

OUT=target/debian
ROOT=$OUT/root
rm -rf "$ROOT"
install -d "$ROOT/DEBIAN" "$ROOT/usr/bin" "$ROOT/lib/systemd/system" \
    "$ROOT/usr/share/man/man1" "$ROOT/usr/share/bash-completion/completions" \
    "$ROOT/usr/share/zsh/vendor-completions" "$ROOT/usr/share/fish/vendor_completions.d" \
    "$ROOT/usr/share/pagefold/prometheus" "$ROOT/usr/share/doc/pagefold"
install -m 0755 "$BIN" "$ROOT/usr/bin/pagefold"
sed 's|/usr/local/bin/pagefold|/usr/bin/pagefold|g' scripts/systemd/pagefold.service \
    >"$ROOT/lib/systemd/system/pagefold.service"
chmod 0644 "$ROOT/lib/systemd/system/pagefold.service"
"$BIN" man --dir "$ROOT/usr/share/man/man1" >/dev/null
gzip -9n "$ROOT"/usr/share/man/man1/*.1
"$BIN" completions bash >"$ROOT/usr/share/bash-completion/completions/pagefold"
"$BIN" completions zsh >"$ROOT/usr/share/zsh/vendor-completions/_pagefold"
"$BIN" completions fish >"$ROOT/usr/share/fish/vendor_completions.d/pagefold.fish"
install -m 0644 scripts/prometheus/pagefold.rules.yml scripts/prometheus/pagefold.rules.test.yml \
    "$ROOT/usr/share/pagefold/prometheus/"
install -m 0644 README.md docs/metrics.md "$ROOT/usr/share/doc/pagefold/"
{
    echo "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
    echo "Upstream-Name: pagefold"
    echo
    echo "Files: *"
    echo "License: Apache-2.0"
    echo " On Debian systems, the full text of the Apache License 2.0 is in"
    echo " /usr/share/common-licenses/Apache-2.0."
} >"$ROOT/usr/share/doc/pagefold/copyright"
find "$ROOT/usr/share" -type f -exec chmod 0644 {} +

cat >"$ROOT/DEBIAN/control" <<CONTROL
Package: pagefold
Version: $VERSION
Architecture: amd64
Maintainer: pagefold developers <pagefold@localhost>
Depends: libc6 (>= $GLIBC), libgcc-s1
Recommends: systemd
Section: admin
Priority: optional
Installed-Size: $(du -sk "$ROOT" | cut -f1)
Description: KVM virtual machine monitor with guest-memory deduplication
 pagefold runs KVM virtual machines (Linux kernels or small workload
 guests), several per process, and merges identical guest pages
 copy-on-write in the VMM, only when memory is short if asked (auto mode).
 It serves an HTTP API on a Unix socket and Prometheus metrics.
 Built from commit $COMMIT.
CONTROL
# systemd learns of the unit; nothing is enabled or started.
cat >"$ROOT/DEBIAN/postinst" <<'SH'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
SH
# A running daemon stops (its VMs with it) before its binary goes away.
cat >"$ROOT/DEBIAN/prerm" <<'SH'
#!/bin/sh
set -e
if [ -d /run/systemd/system ] && [ "$1" = remove ]; then
    systemctl stop pagefold.service || true
fi
SH
cat >"$ROOT/DEBIAN/postrm" <<'SH'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
SH
chmod 0755 "$ROOT/DEBIAN/postinst" "$ROOT/DEBIAN/prerm" "$ROOT/DEBIAN/postrm"
DEB=$OUT/pagefold_${VERSION}_amd64.deb
dpkg-deb --root-owner-group --build "$ROOT" "$DEB" >/dev/null
echo "$DEB"
