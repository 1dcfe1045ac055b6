#!/usr/bin/env bash
# Fetch Debian's kernels for the kernel matrix (tests/kernels): the newest
# linux-image-amd64 of each release below, through a private apt configuration
# per release (the host's apt is not touched), unpacked down to what a QEMU boot
# needs: the kernel image and the virtio/9p modules.
#   usage: dev/fetch-kernels.sh [CACHE_DIR]   (default: .cache/kernels)
# Result: CACHE_DIR/<release>/{vmlinuz,version,modules/...}; a kernel that cannot be
# fetched fails the script (and so `make test`).
set -euo pipefail
source "$(dirname "$0")/private-apt.sh"
cache=$(realpath -m "${1:-.cache/kernels}")
mirror=http://deb.debian.org
# release name -> apt sources (one per line)
declare -A sources=(
  [bullseye]="deb [trusted=yes] $mirror/debian bullseye main
deb [trusted=yes] $mirror/debian-security bullseye-security main"
  [bookworm]="deb [trusted=yes] $mirror/debian bookworm main
deb [trusted=yes] $mirror/debian-security bookworm-security main"
  [trixie]="deb [trusted=yes] $mirror/debian trixie main
deb [trusted=yes] $mirror/debian-security trixie-security main"
  [sid]="deb [trusted=yes] $mirror/debian sid main"
)
releases=(bullseye bookworm trixie sid)
# What the guest's initramfs loads to mount the host over 9p, and binfmt_misc for the
# emulation test (tests/support/kernels/vm.py).
module_dirs=(drivers/virtio net/9p fs/9p fs/netfs fs/fscache "fs/binfmt_misc.ko*")

fetch() {
  local release=$1 dir="$cache/$1" apt_root="$cache/apt/$1"
  [ -f "$dir/.complete-v2" ] && return 0
  private_apt "$apt_root" amd64
  printf '%s\n' "${sources[$release]}" > "$apt_root/etc/sources.list"
  local opts=("${apt_opts[@]}")
  apt-get "${opts[@]}" -qq update
  # The metapackage names the current ABI's image package (signed or not, same kernel).
  local image
  image=$(apt-cache "${opts[@]}" show --no-all-versions linux-image-amd64 \
    | sed -n 's/^Depends: //p' | grep -o 'linux-image-[^ ,]*' | head -1)
  [ -n "$image" ] || { echo "fetch-kernels: no linux-image-amd64 in $release" >&2; return 1; }
  # Newer kernels split the image package into linux-binary-* and linux-modules-*.
  local pkgs
  pkgs=("$image" $(apt-cache "${opts[@]}" show --no-all-versions "$image" \
    | sed -n 's/^Depends: //p' | grep -oE 'linux-(binary|modules)-[^ ,]*' || true))
  rm -rf "$dir" && mkdir -p "$dir/unpack"
  (cd "$apt_root/archives" && rm -f ./*.deb && apt-get "${opts[@]}" -qq download "${pkgs[@]}")
  local deb
  for deb in "$apt_root"/archives/*.deb; do
    dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$dir/unpack" --wildcards --no-wildcards-match-slash \
      --ignore-failed-read './boot/vmlinuz-*' './usr/lib/modules/*/vmlinuz' "${module_dirs[@]/#/./lib/modules/*/kernel/}" \
      "${module_dirs[@]/#/./usr/lib/modules/*/kernel/}" 2>/dev/null || true
    rm -f "$deb"
  done
  local vmlinuz version
  for vmlinuz in "$dir"/unpack/boot/vmlinuz-* "$dir"/unpack/usr/lib/modules/*/vmlinuz; do
    [ -f "$vmlinuz" ] || continue
    case $vmlinuz in
      */boot/vmlinuz-*) version=${vmlinuz##*/vmlinuz-} ;;
      *) version=$(basename "$(dirname "$vmlinuz")") ;;
    esac
    mv "$vmlinuz" "$dir/vmlinuz"
    echo "$version" > "$dir/version"
  done
  [ -f "$dir/vmlinuz" ] || { echo "fetch-kernels: $image has no vmlinuz" >&2; return 1; }
  local kernel_dir
  for kernel_dir in "$dir"/unpack/{usr/,}lib/modules/*/kernel; do
    [ -d "$kernel_dir" ] && mv "$kernel_dir" "$dir/modules"
  done
  [ -d "$dir/modules/fs/9p" ] || { echo "fetch-kernels: $image has no 9p module" >&2; return 1; }
  rm -rf "$dir/unpack" "$apt_root"
  touch "$dir/.complete-v2"
  echo "kernel $release: $(cat "$dir/version")"
}

mkdir -p "$cache"
pids=()
for release in "${releases[@]}"; do
  fetch "$release" & pids+=($!)
done
status=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { echo "fetch-kernels: ${releases[$i]} failed" >&2; status=1; }
done
exit $status
