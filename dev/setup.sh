#!/usr/bin/env bash
# Prepare this machine to build and run execwatch: Debian packages, a virtualenv
# with the package installed in editable mode, and the compiled BPF object.
#   dev/setup.sh                      what `execwatch trace` needs
#   dev/setup.sh --test               plus everything the test suite runs against
#   dev/setup.sh --test --no-go-tools the same but the Go tools (dev/go-tools.sh), which
#                                     `make test` (dev/test.sh) builds in the background
#   dev/setup.sh --link-cache         only the .cache link (below)
set -euo pipefail
cd "$(dirname "$0")/.."

test=0 go_tools=1 link_only=0
for arg in "$@"; do
  case $arg in
    --test) test=1 ;;
    --no-go-tools) go_tools=0 ;;
    --link-cache) link_only=1 ;;
    *) echo "setup: unknown option $arg (--test, --no-go-tools, --link-cache)" >&2; exit 2 ;;
  esac
done

# Downloads and Go builds are kept outside the clone, so that a fresh clone on the same
# machine (as CI makes) reuses them; .cache in the clone points there.
cache=${EXECWATCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/execwatch}
mkdir -p "$cache"
if [ ! -e .cache ]; then
  ln -s "$cache" .cache
elif [ ! -L .cache ] && [ "$link_only" = 0 ]; then
  echo "note: .cache is a directory here, not a link to $cache: downloads are not shared"
fi
[ "$link_only" = 1 ] && exit 0

runtime_pkgs=(clang llvm libbpf-dev libbpf1 linux-libc-dev make python3-venv musl-tools)
test_pkgs=(bpftool bpftrace runc containerd musl musl-tools prometheus file pax-utils binutils busybox-static gcc libc6-dev qemu-system-x86 libfuse3-3 skopeo python3-pyelftools groff-base
  buildah mmdebstrap containernetworking-plugins iptables
  docker.io podman crun conmon catatonit uidmap slirp4netns fuse-overlayfs)

want=("${runtime_pkgs[@]}")
[ "$test" = 1 ] && want+=("${test_pkgs[@]}")

missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
extra=""
[ "$test" = 1 ] && extra="[dev]"
.venv/bin/pip install -q --disable-pip-version-check -e ".${extra}"
make -s bpf guest-init

if [ "$test" = 1 ]; then
  dev/fetch-foreign.sh .cache/foreign
  dev/fetch-newer.sh .cache/newer
  dev/build-foreign-os.sh .cache/foreign-os
  dev/fetch-kernels.sh .cache/kernels
  dev/fetch-emulators.sh .cache/emulators
  [ "$go_tools" = 1 ] && dev/go-tools.sh
  dev/images.sh .cache/images
fi
