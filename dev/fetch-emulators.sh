#!/usr/bin/env bash
# Fetch Debian's user-mode QEMU for the emulation tests, without installing it: the
# package's postinst would register its interpreters in the host's binfmt_misc table.
#   usage: dev/fetch-emulators.sh [CACHE_DIR]   (default: .cache/emulators)
# Result: CACHE_DIR/qemu-<arch>-static for the architectures below.
set -euo pipefail
cache=$(realpath -m "${1:-.cache/emulators}")
archs=(aarch64)
stamp="$cache/.complete-v1"
[ -f "$stamp" ] && exit 0

mkdir -p "$cache/deb"
cd "$cache/deb"
if ! ls qemu-user-static_*.deb >/dev/null 2>&1; then
  apt-get -qq download qemu-user-static 2>/dev/null || {
    apt-get update -qq
    apt-get -qq download qemu-user-static 2>/dev/null
  }
fi
rm -rf unpacked
dpkg-deb -x qemu-user-static_*.deb unpacked
for arch in "${archs[@]}"; do
  install -m 0755 "unpacked/usr/bin/qemu-$arch-static" "$cache/qemu-$arch-static"
done
rm -rf unpacked qemu-user-static_*.deb
touch "$stamp"
echo "emulators in $cache"
