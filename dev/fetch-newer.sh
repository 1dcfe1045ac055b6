#!/usr/bin/env bash
# Fetch binaries of a newer Debian release (trixie) for this host's architecture, through
# a private apt configuration (as dev/fetch-foreign.sh does), without touching the host's
# apt state. The early-death tests run them against the host's older glibc and libcurl.
#   usage: dev/fetch-newer.sh [CACHE_DIR]   (default: .cache/newer)
# Result: CACHE_DIR/<pkg>/... (each package unpacked in its own directory).
set -euo pipefail
cache=$(realpath -m "${1:-.cache/newer}")
pkgs=(hello curl)
stamp="$cache/.complete-v1"
[ -f "$stamp" ] && exit 0

arch=$(dpkg --print-architecture)
mkdir -p "$cache/debs"
source "$(dirname "$0")/private-apt.sh"
private_apt "$cache/apt" "$arch" trixie
apt-get "${apt_opts[@]}" -qq update
cd "$cache/debs"
for pkg in "${pkgs[@]}"; do
  ls "${pkg}"_*.deb >/dev/null 2>&1 || apt-get "${apt_opts[@]}" -qq download "$pkg:$arch"
  rm -rf "${cache:?}/$pkg"
  dpkg-deb -x "$(ls "${pkg}"_*.deb | head -1)" "$cache/$pkg"
done
touch "$stamp"
echo "newer binaries in $cache"
