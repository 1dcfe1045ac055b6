#!/usr/bin/env bash
# `make test`: set the machine up and run the suite, with the Go tools (dev/go-tools.sh,
# about half of a fresh machine's time) built in the background from the start. pytest
# runs the tests that need no Go tool first; a test that needs one waits for its stamp
# in build/go-tools/ and fails, with the tail of that tool's log, if its build failed
# (tests/gotools.py). The exit status is pytest's, or 1 if a Go build failed.
# Tests are chosen with pytest's arguments (`make test PYTEST_ARGS=...`).
#
#   dev/test.sh [PYTEST_ARG...]
set -euo pipefail
cd "$(dirname "$0")/.."

run=$PWD/build/go-tools
dev/setup.sh --link-cache
rm -rf "$run"
mkdir -p "$run"

# Its own process group (job control), so that one kill stops the go builds too. Niced
# below the setup and the tests (the compiler to 19): it takes what they leave.
set -m
nice -n 9 dev/go-tools.sh "$run" >"$run/log" 2>&1 &
builder=$!
set +m
stop_builder() { kill -- "-$builder" 2>/dev/null || true; }
trap stop_builder EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
echo "test: building the Go tools in the background (pid $builder, log $run/log)"

dev/setup.sh --test --no-go-tools
status=0
EXECWATCH_GO_TOOLS_RUN=$run .venv/bin/pytest "$@" || status=$?

# pytest failed: no need for the rest of the builds. Else a build still running (only
# some tests chosen) is awaited, and its failure fails `make test`.
[ "$status" = 0 ] || stop_builder
echo "test: waiting for the Go builds"
built=0
wait "$builder" || built=$?
trap - EXIT
cat "$run/log"
if [ "$built" != 0 ]; then
  for f in "$run"/*.failed; do
    [ -e "$f" ] || continue
    tool=$(basename "$f" .failed)
    echo "test: the $tool build failed; the end of $run/$tool.log:"
    tail -n 20 "$run/$tool.log"
  done
  [ "$status" = 0 ] && status=1
fi
exit "$status"
