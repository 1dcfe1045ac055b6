#!/usr/bin/env bash
# Build the CNCF distribution registry (the reference OCI registry) that the registry and
# audit tests push images to, through the Go module proxy, at a pinned release.
#
#   dev/registry-tool.sh [DIR]   build DIR/registry (default: .cache/registry-bin)
#
# A binary already built at the pinned version is kept (a stamp file records it).
set -euo pipefail
cd "$(dirname "$0")/.."

REGISTRY_VERSION=${REGISTRY_VERSION:-v3.1.2}
out=${1:-$PWD/.cache/registry-bin}
mkdir -p "$out"
out=$(cd "$out" && pwd)

if [ -x "$out/registry" ] && [ "$(cat "$out/.registry.version" 2>/dev/null)" = "$REGISTRY_VERSION" ]; then
  exit 0
fi
command -v go >/dev/null || { echo "registry-tool: go is not installed" >&2; exit 1; }
t0=$(date +%s)
# Two cores are shared with other work: keep the compiler from taking both.
GOBIN="$out/.gobin" CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-buildvcs=false -p=2" \
  nice -n 10 go install -trimpath -ldflags "-s -w" \
  "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION"
mv "$out/.gobin/registry" "$out/registry"
echo "$REGISTRY_VERSION" >"$out/.registry.version"
echo "registry-tool: built registry $REGISTRY_VERSION in $(( $(date +%s) - t0 ))s" >&2
