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
apt_root="$cache/apt"
mkdir -p "$apt_root"/{lists/partial,archives/partial,etc/preferences.d,state} "$cache/debs"
cat > "$apt_root/etc/sources.list" <<SRC
deb [trusted=yes] http://deb.debian.org/debian trixie main
SRC
: > "$apt_root/state/status"
opts=(
  -o "Dir::Etc::sourcelist=$apt_root/etc/sources.list"
  -o "Dir::Etc::sourceparts=-"
  -o "Dir::Etc::preferencesparts=$apt_root/etc/preferences.d"
  -o "Dir::State::lists=$apt_root/lists"
  -o "Dir::State::status=$apt_root/state/status"
  -o "Dir::Cache::archives=$apt_root/archives"
  -o "Dir::Cache=$apt_root"
  -o "APT::Architectures=$arch"
  -o "Acquire::Languages=none"
  -o "Debug::NoLocking=1"
  -o "APT::Sandbox::User=root"
)
apt-get "${opts[@]}" -qq update
cd "$cache/debs"
for pkg in "${pkgs[@]}"; do
  ls "${pkg}"_*.deb >/dev/null 2>&1 || apt-get "${opts[@]}" -qq download "$pkg:$arch"
  rm -rf "${cache:?}/$pkg"
  dpkg-deb -x "$(ls "${pkg}"_*.deb | head -1)" "$cache/$pkg"
done
touch "$stamp"
echo "newer binaries in $cache"
