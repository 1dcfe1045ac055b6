#!/usr/bin/env bash
# Fetch real binaries built for other CPU architectures from Debian, without
# touching the host's dpkg architectures: a private apt configuration in the
# cache directory downloads the .debs and dpkg-deb unpacks them.
#   usage: dev/fetch-foreign.sh [CACHE_DIR]   (default: .cache/foreign)
# Result: CACHE_DIR/<debian-arch>/root/... (unpacked packages) for each arch.
set -euo pipefail
cache=$(realpath -m "${1:-.cache/foreign}")
archs=(arm64 armhf i386 ppc64el s390x riscv64 mips64el)
pkgs=(hello busybox-static libc6)
stamp="$cache/.complete-v1"
[ -f "$stamp" ] && exit 0

mkdir -p "$cache/debs"
source "$(dirname "$0")/private-apt.sh"
private_apt "$cache/apt" "$(IFS=,; echo "${archs[*]}")" trixie bookworm
apt-get "${apt_opts[@]}" -qq update
cd "$cache/debs"
for arch in "${archs[@]}"; do
  for pkg in "${pkgs[@]}"; do
    ls "${pkg}"_*_"${arch}".deb >/dev/null 2>&1 && continue
    # The mirror can lag its own index for one suite: fall back to the other.
    apt-get "${apt_opts[@]}" -qq download "$pkg:$arch" 2>/dev/null \
      || apt-get "${apt_opts[@]}" -qq download "$pkg:$arch/bookworm" 2>/dev/null \
      || apt-get "${apt_opts[@]}" -qq download "$pkg:$arch/trixie"
  done
  mkdir -p "$cache/$arch/root"
  for deb in ./*_"${arch}".deb; do dpkg-deb -x "$deb" "$cache/$arch/root"; done
done
touch "$stamp"
echo "foreign binaries in $cache"
