#!/usr/bin/env bash
# Prepare this machine to build and run execwatch: Debian packages, a virtualenv
# with the package installed in editable mode, and the compiled BPF object.
#   dev/setup.sh          what `execwatch trace` needs
#   dev/setup.sh --test   plus everything the test suite runs against
set -euo pipefail
cd "$(dirname "$0")/.."

runtime_pkgs=(clang llvm libbpf-dev libbpf1 linux-libc-dev make python3-venv)
test_pkgs=(bpftool bpftrace runc containerd musl musl-tools prometheus file pax-utils binutils busybox-static gcc libc6-dev qemu-system-x86 libfuse3-3 skopeo python3-pyelftools groff-base)

want=("${runtime_pkgs[@]}")
[ "${1:-}" = "--test" ] && want+=("${test_pkgs[@]}")

missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Downloads and Go builds are kept outside the clone, so that a fresh clone on the same
# machine (as CI makes) reuses them; .cache in the clone points there.
cache=${EXECWATCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/execwatch}
mkdir -p "$cache"
if [ ! -e .cache ]; then
  ln -s "$cache" .cache
elif [ ! -L .cache ]; then
  echo "note: .cache is a directory here, not a link to $cache: downloads are not shared"
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
extra=""
[ "${1:-}" = "--test" ] && extra="[dev]"
.venv/bin/pip install -q --disable-pip-version-check -e ".${extra}"
make -s bpf

if [ "${1:-}" = "--test" ]; then
  dev/fetch-foreign.sh .cache/foreign
  dev/fetch-newer.sh .cache/newer
  dev/fetch-kernels.sh .cache/kernels
  dev/k8s-tools.sh .cache/k8s-bin
  dev/registry-tool.sh .cache/registry-bin
fi
