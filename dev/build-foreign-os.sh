#!/usr/bin/env bash
# Build real executables of other operating systems: Go cross-compiles of a small program
# (the Go toolchain already on these machines, no network: the program has no module
# dependencies). Mach-O for macOS, PE for Windows, ELF for FreeBSD, NetBSD and OpenBSD:
# what a `go build` without GOOS=linux puts into an image.
#   usage: dev/build-foreign-os.sh [CACHE_DIR]   (default: .cache/foreign-os)
# Result: CACHE_DIR/hello-<goos>-<goarch>[.exe] for each target below.
set -euo pipefail
cache=$(realpath -m "${1:-.cache/foreign-os}")
targets=(darwin/amd64 darwin/arm64 windows/amd64 freebsd/amd64 netbsd/amd64 openbsd/amd64)
stamp="$cache/.complete-v1"
[ -f "$stamp" ] && exit 0

src="$cache/src"
mkdir -p "$src"
printf 'module hello\n\ngo 1.21\n' >"$src/go.mod"
printf 'package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("hello") }\n' >"$src/main.go"
for target in "${targets[@]}"; do
  goos=${target%/*} goarch=${target#*/}
  out="$cache/hello-$goos-$goarch"
  [ "$goos" = windows ] && out="$out.exe"
  [ -s "$out" ] && continue
  (cd "$src" && GOTOOLCHAIN=local CGO_ENABLED=0 GOOS=$goos GOARCH=$goarch \
    go build -trimpath -ldflags=-s -o "$out.tmp" . && mv "$out.tmp" "$out")
done
touch "$stamp"
echo "other operating systems' executables in $cache"
