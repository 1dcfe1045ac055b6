#!/usr/bin/env bash
# Start the private containerd (CRI plugin, images built and imported locally, no
# registry) that tests/attribution uses, and keep it until Ctrl-C; it prints its
# CRI socket. The tests start their own: this is for poking at it by hand.
#   usage: dev/containerd-test-env.sh        (root; after `dev/setup.sh --test`)
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m tests.support.runtime.containerd
