#!/usr/bin/env bash
# Build every Go tool the test suite runs, one after another, in the order the suite
# needs them (tests/conftest.py runs the tests that need none first, then the others by
# the position here of the last tool they need):
#   registry                tests/registry, tests/audit     (dev/registry-tool.sh)
#   etcd, kube-apiserver    tests/audit, tests/cluster, tests/kube
#   helm                    tests/deploy, the node's install
#   node                    kubelet, controller-manager, scheduler: tests/node
#   kwok                    simulated nodes: tests/fleet
#   prometheus              tests/node/test_story_prometheus.py
#   rollouts                tests/node/test_story_rollout.py
#   prometheus-operator     tests/monitoring (the chart's ServiceMonitors and PrometheusRule)
#
#   dev/go-tools.sh [RUN]
#
# With RUN (a directory), each tool's output goes to RUN/TOOL.log and its outcome to
# RUN/TOOL.ready or RUN/TOOL.failed, and RUN/done marks the end: `make test` runs this in
# the background and the tests that need a tool wait for its stamp (tests/gotools.py).
# A tool that fails does not stop the others; the exit status is 1 if any failed.
# Output directories: $EXECWATCH_K8S_BIN (default .cache/k8s-bin) and the directory of
# $EXECWATCH_REGISTRY_BIN (default .cache/registry-bin/registry), as the tests read them.
set -uo pipefail
cd "$(dirname "$0")/.."

TOOLS=(registry etcd kube-apiserver helm node kwok prometheus rollouts prometheus-operator)

run=${1:-}
k8s_bin=${EXECWATCH_K8S_BIN:-$PWD/.cache/k8s-bin}
registry_bin=$(dirname "${EXECWATCH_REGISTRY_BIN:-$PWD/.cache/registry-bin/registry}")
mkdir -p "$k8s_bin" ${run:+"$run"}

build_one() { # tool
  case $1 in
    registry) dev/registry-tool.sh "$registry_bin" ;;
    *) dev/k8s-tools.sh "$k8s_bin" "$1" ;;
  esac
}

# Clones share .cache, and k8s-tools.sh rebuilds its throw-away modules in place:
# one chain at a time.
[ -n "$run" ] && echo $$ >"$run/pid"
exec 9>"$k8s_bin/.go-tools.lock"
flock -n 9 || { echo "go-tools: waiting for another run to finish ($k8s_bin/.go-tools.lock)" >&2; flock 9; }

failed=0
t0=$(date +%s)
for tool in "${TOOLS[@]}"; do
  if [ -z "$run" ]; then
    build_one "$tool" || { failed=1; echo "go-tools: $tool failed" >&2; }
    continue
  fi
  status=0
  build_one "$tool" >"$run/$tool.log" 2>&1 || status=$?
  if [ "$status" = 0 ]; then
    touch "$run/$tool.ready"
    echo "go-tools: $tool ready at $(( $(date +%s) - t0 ))s" >&2
  else
    failed=1
    echo "exit $status" >"$run/$tool.failed"
    echo "go-tools: $tool FAILED (exit $status) at $(( $(date +%s) - t0 ))s" >&2
  fi
done
[ -n "$run" ] && echo "$failed" >"$run/done"
exit "$failed"
