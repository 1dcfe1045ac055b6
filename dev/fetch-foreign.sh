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
missing() {  # the pkg:arch names without a .deb yet, each with the suffix $1
  local arch pkg
  for arch in "${archs[@]}"; do for pkg in "${pkgs[@]}"; do
    ls "${pkg}"_*_"${arch}".deb >/dev/null 2>&1 || echo "$pkg:$arch$1"
  done; done
}
# Few apt-get calls: each rebuilds apt's cache from ~270 MB of package lists (a minute
# under load; one call per package took 20 minutes on a fresh machine). The mirror can lag
# its own index for one suite: what the newest candidate lacks comes from one suite, then
# the other.
for suite in "" /bookworm /trixie; do
  mapfile -t want < <(missing "$suite")
  [ "${#want[@]}" -eq 0 ] && break
  apt-get "${apt_opts[@]}" -qq download "${want[@]}" 2>/dev/null || true
done
mapfile -t want < <(missing "")
[ "${#want[@]}" -eq 0 ] || { echo "fetch-foreign: cannot download ${want[*]}" >&2; exit 1; }
for arch in "${archs[@]}"; do
  mkdir -p "$cache/$arch/root"
  for deb in ./*_"${arch}".deb; do dpkg-deb -x "$deb" "$cache/$arch/root"; done
done
touch "$stamp"
echo "foreign binaries in $cache"
