#!/usr/bin/env bash
# Build the execwatch image from the real Containerfile, with no registry in reach.
#
#   dev/images.sh [DIR]           (default DIR: .cache/images)
#   dev/images.sh --check [DIR]   exit 1 unless DIR/execwatch.tar matches the sources
#
# 1. The base images the Containerfile names (docker.io/library/debian:bookworm-slim and
#    docker.io/library/python:3.11-slim-bookworm) are made here from Debian packages with
#    mmdebstrap and committed under those names into buildah's local storage. The python
#    one is Debian's python3.11 (the same 3.11 on the same bookworm), with `python` and
#    `pip` on PATH as in the official image. The host's own CA certificates
#    (/usr/local/share/ca-certificates) go into both, so that apt and pip inside the build
#    trust what the host trusts (a TLS-inspecting egress proxy, here).
# 2. `buildah build --pull=never -f Containerfile` builds the image exactly as written,
#    tagged as the chart's default image (ghcr.io/execwatch/execwatch:<appVersion>).
# 3. It is saved as DIR/execwatch.tar (docker-archive), which tests/node imports into
#    containerd's k8s.io namespace. DIR/execwatch.key records the inputs it was built from
#    (Containerfile, pyproject.toml, README.md, src/): unchanged inputs, no rebuild.
#
# Base images are cached as root filesystem tarballs in DIR (rebuilt when this script's
# BASE_VERSION changes), so a fresh clone or an emptied buildah storage costs seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_VERSION=1   # the root filesystems
IMAGE_VERSION=2  # the base images made from them
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
DEBIAN_IMAGE=docker.io/library/debian:bookworm-slim
PYTHON_IMAGE=docker.io/library/python:3.11-slim-bookworm
APP_VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/execwatch/Chart.yaml)
IMAGE=ghcr.io/execwatch/execwatch:$APP_VERSION

check=0
[ "${1:-}" = --check ] && { check=1; shift; }
out=${1:-.cache/images}
mkdir -p "$out"
out=$(cd "$out" && pwd)
log() { printf 'images: %s\n' "$*" >&2; }

inputs_key() {
  { sha256sum Containerfile pyproject.toml README.md; git ls-files -z src | xargs -0 sha256sum; } |
    sha256sum | cut -d' ' -f1
}
if [ "$check" = 1 ]; then
  [ -f "$out/execwatch.tar" ] && [ "$(cat "$out/execwatch.key" 2>/dev/null)" = "$(inputs_key)" ] && exit 0
  log "$out/execwatch.tar is missing or older than the sources: run dev/images.sh"
  exit 1
fi

for tool in buildah mmdebstrap; do
  command -v "$tool" >/dev/null || { log "$tool is missing: dev/setup.sh --test installs it"; exit 1; }
done
# No build engine daemon here: buildah runs each RUN step in a chroot on the host network.
BUILDAH_FLAGS=(--isolation=chroot --network=host)

# rootfs NAME PACKAGES...: a minbase bookworm root as $out/NAME.rootfs.tar
rootfs() {
  local name=$1 tar=$out/$1.rootfs.tar
  shift
  [ -f "$tar" ] && [ "$(cat "$out/.$name.version" 2>/dev/null)" = "$BASE_VERSION" ] && return 0
  log "mmdebstrap $name ($*)"
  # The official python image's Python is not marked externally managed (PEP 668).
  local hooks=(--customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin'
    --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED')
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    hooks+=(--customize-hook='mkdir -p "$1"/usr/local/share/ca-certificates'
      --customize-hook='cp /usr/local/share/ca-certificates/*.crt "$1"/usr/local/share/ca-certificates/'
      --customize-hook='chroot "$1" update-ca-certificates >/dev/null')
  fi
  nice -n 10 mmdebstrap --variant=minbase --mode=root --format=tar \
    --include="ca-certificates${*:+,$(IFS=,; echo "$*")}" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    "${hooks[@]}" "$SUITE" "$tar.tmp" "$MIRROR" >/dev/null
  mv "$tar.tmp" "$tar"
  echo "$BASE_VERSION" >"$out/.$name.version"
}

# base_image NAME TAG SETUP [buildah config flags...]: commit $out/NAME.rootfs.tar as TAG,
# after running the shell command SETUP in it
base_image() {
  local name=$1 tag=$2 setup=$3 ctr
  shift 3
  if buildah inspect --type image "$tag" >/dev/null 2>&1 &&
    [ "$(buildah inspect --type image --format '{{index .ImageAnnotations "execwatch.base"}}' "$tag")" = "$IMAGE_VERSION" ]; then
    return 0
  fi
  ctr=$(buildah from scratch)
  buildah add --quiet "$ctr" "$out/$name.rootfs.tar" / >/dev/null
  buildah run "${BUILDAH_FLAGS[@]}" "$ctr" -- sh -c "$setup"
  buildah config --annotation "execwatch.base=$IMAGE_VERSION" --cmd '["bash"]' \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
    --os linux --arch "$(dpkg --print-architecture)" "$@" "$ctr"
  buildah commit --quiet --rm "$ctr" "$tag" >/dev/null
  log "committed $tag"
}

# Clones share .cache: one build at a time.
exec 9>"$out/.lock"
flock 9
t0=$(date +%s)
rootfs debian
# python-is-python3: `python`, as in the official image.
rootfs python python3 python3-venv python3-pip python-is-python3
base_image debian "$DEBIAN_IMAGE" true
# The official image's interpreter is /usr/local/bin/python3 (the Containerfile names it).
base_image python "$PYTHON_IMAGE" \
  'for f in python3 python pip3 pip; do ln -sf "/usr/bin/$f" "/usr/local/bin/$f"; done' \
  --cmd '["python3"]'

key=$(inputs_key)
if [ -f "$out/execwatch.tar" ] && [ "$(cat "$out/execwatch.key" 2>/dev/null)" = "$key" ]; then
  log "$IMAGE up to date ($out/execwatch.tar)"
  exit 0
fi
log "buildah build -f Containerfile -t $IMAGE"
t1=$(date +%s)
nice -n 10 buildah build --quiet --pull=never --layers "${BUILDAH_FLAGS[@]}" \
  -f Containerfile -t "$IMAGE" . >/dev/null
rm -f "$out/execwatch.tar.tmp"
buildah push --quiet "$IMAGE" "docker-archive:$out/execwatch.tar.tmp:$IMAGE" >/dev/null
mv "$out/execwatch.tar.tmp" "$out/execwatch.tar"
echo "$key" >"$out/execwatch.key"
log "built $IMAGE in $(( $(date +%s) - t1 ))s ($(( $(date +%s) - t0 ))s with base images)"
