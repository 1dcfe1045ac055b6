#!/usr/bin/env bash
# Build the real Kubernetes control plane the cluster tests run against, at pinned
# releases, from source fetched through the Go module proxy (there is no other way to
# get these binaries here: no release downloads, no container registry).
#
#   dev/k8s-tools.sh [DIR [TOOL...]]   build into DIR (default: $EXECWATCH_K8S_BIN or
#                                      .cache/k8s-bin) every tool, or only the TOOLs named
#   TOOL: etcd kube-apiserver helm kubectl node kwok rollouts prometheus prometheus-operator
# (dev/go-tools.sh runs it once per tool, in the order the tests need them.)
#
# Builds kube-apiserver, etcd and helm; kubectl too when K8S_TOOLS_KUBECTL=1. With
# K8S_TOOLS_NODE=1 (the default) also what one real node needs: kubelet,
# kube-controller-manager and kube-scheduler at $KUBE_NODE_VERSION, the Argo Rollouts
# controller with its CRDs, a Prometheus with kubernetes_sd (tests/node, docs/agent.md),
# and prometheus-operator with its CRDs (tests/monitoring: the chart's ServiceMonitors).
# A binary already built at the pinned version is kept (a stamp file records the
# version), so a second run costs nothing.
#
# Why not `go install k8s.io/kubernetes/cmd/kube-apiserver@vX`? k8s.io/kubernetes's
# go.mod replaces every k8s.io/* staging module with a ./staging directory that the
# module zip does not contain, and `go install pkg@version` refuses modules with
# replace directives. So each tool gets a tiny throw-away main module in the cache
# that requires the tool's module and maps each staging module to its published
# k8s.io/<name> v0.<minor>.<patch> tag. etcd's server module has the same shape
# (replaces onto ../api etc.), and helm is built the same way for uniformity.
set -euo pipefail
cd "$(dirname "$0")/.."

# The node's components are 1.35, not 1.36: kubelet 1.36 refuses containerd 1.x (Debian
# ships 1.6), and 1.35.4 is the only 1.35 release the module proxy serves. The API server
# is the same release: its packages are then a subset of the node components' (1,764 of
# its 1,769 non-standard packages), so one build cache serves both and a fresh machine
# compiles 80 MB of Go source instead of 136 MB. Either may be set
# apart (a kubelet may be one minor older than its API server).
KUBE_NODE_VERSION=${KUBE_NODE_VERSION:-v1.35.4}
KUBERNETES_VERSION=${KUBERNETES_VERSION:-$KUBE_NODE_VERSION}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
HELM_VERSION=${HELM_VERSION:-v3.20.2}
# v1.10.2 needs Go >= 1.26.10; v1.10.1 builds with this machine's Go.
ARGO_ROLLOUTS_VERSION=${ARGO_ROLLOUTS_VERSION:-v1.10.1}
# Prometheus 3.16 (its Go module is tagged v0.316.0). Debian's prometheus is built
# without kubernetes_sd, which scraping the chart's Services needs. Only that discovery
# is compiled in (plugins/plugin_kubernetes.go: `!remove_all_sd || enable_kubernetes_sd`;
# file and http discovery always are), and no UI assets (they need the `builtinassets`
# tag): the cold build is cheaper (docs/handler.md, Tests).
# KWOK simulates nodes for tests/fleet (its go.mod has no replace directives: go install).
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
PROMETHEUS_VERSION=${PROMETHEUS_VERSION:-v0.316.0}
PROMETHEUS_TAGS=${PROMETHEUS_TAGS-remove_all_sd,enable_kubernetes_sd}  # "": every discovery
# The only release the module proxy serves. Only the operator itself is built (no
# config-reloader, no admission webhook): the tests read the configuration it generates.
PROMETHEUS_OPERATOR_VERSION=${PROMETHEUS_OPERATOR_VERSION:-v0.85.0}
# Two cores are shared with other work: keep the compiler from taking both.
GO_BUILD_PARALLEL=${GO_BUILD_PARALLEL:-2}

out=${1:-${EXECWATCH_K8S_BIN:-$PWD/.cache/k8s-bin}}
shift $(( $# > 0 ? 1 : 0 ))
only=" $* "
mkdir -p "$out"
out=$(cd "$out" && pwd)
work="$out/.build"
mkdir -p "$work"

command -v go >/dev/null || { echo "k8s-tools: go is not installed" >&2; exit 1; }
export GOFLAGS="-mod=mod -buildvcs=false"
export CGO_ENABLED=0
export GOTOOLCHAIN=local

log() { printf 'k8s-tools: %s\n' "$*" >&2; }

up_to_date() { # name version
  [ -x "$out/$1" ] && [ "$(cat "$out/.$1.version" 2>/dev/null)" = "$2" ]
}

# mod_dir MODULE@VERSION -> the extracted module directory in the module cache
mod_dir() {
  go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
}

# new_module NAME: an empty main module in $work/NAME
new_module() {
  rm -rf "${work:?}/$1"
  mkdir -p "$work/$1"
  (cd "$work/$1" && go mod init "execwatch.dev/k8s-tools/$1" >/dev/null 2>&1)
}

build() { # name module-dir package ldflags [tags]
  local name=$1 dir=$2 pkg=$3 ldflags=$4 tags=${5:-} t0
  t0=$(date +%s)
  (cd "$dir" && nice -n 10 go build -p "$GO_BUILD_PARALLEL" -trimpath -tags "$tags" \
    -ldflags "-s -w $ldflags" -o "$out/$name.tmp" "$pkg")
  mv "$out/$name.tmp" "$out/$name"
  log "built $name in $(( $(date +%s) - t0 ))s"
}

# kubernetes_module VERSION: the throw-away main module for k8s.io/kubernetes@VERSION in
# $work/kubernetes-VERSION, with every component this script builds in its tools.go, so
# that the API server and the node's components share one module (and one build cache)
# when they are at the same release.
kubernetes_module() {
  local version=$1 src minor dir=$work/kubernetes-$1
  [ -f "$dir/.ready" ] && return 0
  log "resolving k8s.io/kubernetes@$version"
  src=$(mod_dir "k8s.io/kubernetes@$version")
  [ -n "$src" ] || { log "cannot download k8s.io/kubernetes@$version"; exit 1; }
  minor=${version#v1.}
  new_module "kubernetes-$version"
  {
    echo "require k8s.io/kubernetes $version"
    echo "replace ("
    # Every `k8s.io/x => ./staging/src/k8s.io/x` becomes `k8s.io/x => k8s.io/x v0.<minor>`.
    sed -n 's#^[[:space:]]*\(k8s\.io/[^ ]*\) => \./staging/src/.*#\t\1 => \1 v0.'"$minor"'#p' "$src/go.mod"
    echo ")"
  } >>"$dir/go.mod"
  {
    printf 'package tools\n\nimport (\n'
    for app in kube-apiserver kubelet kube-controller-manager kube-scheduler; do
      printf '\t_ "k8s.io/kubernetes/cmd/%s/app"\n' "$app"
    done
    printf ')\n'
  } >"$dir/tools.go"
  (cd "$dir" && go mod tidy >/dev/null)
  touch "$dir/.ready"
}

k8s_ldflags() { # version
  local v=$1 minor
  minor=${v#v1.}; minor=${minor%%.*}
  printf -- '-X k8s.io/component-base/version.gitVersion=%s -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=%s -X k8s.io/component-base/version.gitTreeState=clean' "$v" "$minor"
}

# build_k8s VERSION COMPONENT...: the components not yet built at VERSION, in one
# `go build` (their links overlap, and the package graph is loaded once).
build_k8s() {
  local version=$1 name todo=() pkgs=() t0
  shift
  for name in "$@"; do
    up_to_date "$name" "$version" || todo+=("$name")
  done
  [ ${#todo[@]} -gt 0 ] || return 0
  kubernetes_module "$version"
  for name in "${todo[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$name"); done
  t0=$(date +%s)
  rm -rf "$out/.tmp-k8s"
  mkdir -p "$out/.tmp-k8s"
  (cd "$work/kubernetes-$version" && nice -n 10 go build -p "$GO_BUILD_PARALLEL" -trimpath \
    -ldflags "-s -w $(k8s_ldflags "$version")" -o "$out/.tmp-k8s/" "${pkgs[@]}")
  for name in "${todo[@]}"; do
    mv "$out/.tmp-k8s/$name" "$out/$name"
    echo "$version" >"$out/.$name.version"
  done
  rmdir "$out/.tmp-k8s"
  log "built ${todo[*]} $version in $(( $(date +%s) - t0 ))s"
}

build_kube_apiserver() {
  build_k8s "$KUBERNETES_VERSION" kube-apiserver
}

build_kubectl() {
  up_to_date kubectl "$KUBERNETES_VERSION" && return 0
  kubernetes_module "$KUBERNETES_VERSION"
  (cd "$work/kubernetes-$KUBERNETES_VERSION" && go get "k8s.io/kubectl@v0.${KUBERNETES_VERSION#v1.}" >/dev/null)
  build kubectl "$work/kubernetes-$KUBERNETES_VERSION" k8s.io/kubernetes/cmd/kubectl \
    "$(k8s_ldflags "$KUBERNETES_VERSION")"
  echo "$KUBERNETES_VERSION" >"$out/.kubectl.version"
}

build_etcd() {
  up_to_date etcd "$ETCD_VERSION" && return 0
  log "resolving go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  new_module etcd
  printf 'package tools\n\nimport (\n\t_ "go.etcd.io/etcd/server/v3/etcdmain"\n)\n' >"$work/etcd/tools.go"
  (cd "$work/etcd" && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null 2>&1 && go mod tidy >/dev/null)
  build etcd "$work/etcd" go.etcd.io/etcd/server/v3 ""
  echo "$ETCD_VERSION" >"$out/.etcd.version"
}

build_helm() {
  up_to_date helm "$HELM_VERSION" && return 0
  log "resolving helm.sh/helm/v3@$HELM_VERSION"
  new_module helm
  printf 'package tools\n\nimport (\n\t_ "helm.sh/helm/v3/pkg/action"\n)\n' >"$work/helm/tools.go"
  (cd "$work/helm" && go get "helm.sh/helm/v3@$HELM_VERSION" >/dev/null 2>&1 && go mod tidy >/dev/null)
  build helm "$work/helm" helm.sh/helm/v3/cmd/helm \
    "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  echo "$HELM_VERSION" >"$out/.helm.version"
}

# -- one real node: kubelet, controller-manager, scheduler (KUBE_NODE_VERSION) -------------

build_node() {
  build_k8s "$KUBE_NODE_VERSION" kubelet kube-controller-manager kube-scheduler
}

# -- Argo Rollouts: the controller and its CRDs ----------------------------------------------

# Its go.mod pins Kubernetes modules with replace directives, which `go install pkg@v`
# refuses: the throw-away module copies them.
build_argo_rollouts() {
  local src dir=$work/argo-rollouts
  up_to_date rollouts-controller "$ARGO_ROLLOUTS_VERSION" && return 0
  log "resolving github.com/argoproj/argo-rollouts@$ARGO_ROLLOUTS_VERSION"
  src=$(mod_dir "github.com/argoproj/argo-rollouts@$ARGO_ROLLOUTS_VERSION")
  [ -n "$src" ] || { log "cannot download argo-rollouts@$ARGO_ROLLOUTS_VERSION"; exit 1; }
  new_module argo-rollouts
  {
    echo "require github.com/argoproj/argo-rollouts $ARGO_ROLLOUTS_VERSION"
    # Both forms: `replace a => b v` lines and the lines of a `replace (...)` block.
    echo "replace ("
    awk '/^replace \(/{b=1; next} b && /^\)/{b=0} b && /=>/{print} /^replace [^(]/{sub(/^replace /,""); print}' \
      "$src/go.mod" | grep -v '=> \.' | sed 's/^[[:space:]]*/\t/'
    echo ")"
  } >>"$dir/go.mod"
  printf 'package tools\n\nimport (\n\t_ "github.com/argoproj/argo-rollouts/cmd/rollouts-controller"\n)\n' \
    >"$dir/tools.go"
  (cd "$dir" && go mod tidy >/dev/null)
  build rollouts-controller "$dir" github.com/argoproj/argo-rollouts/cmd/rollouts-controller \
    "-X github.com/argoproj/argo-rollouts/utils/version.version=$ARGO_ROLLOUTS_VERSION"
  rm -rf "$out/argo-rollouts-crds"
  mkdir -p "$out/argo-rollouts-crds"
  cp "$src"/manifests/crds/*-crd.yaml "$out/argo-rollouts-crds/"
  chmod -R u+w "$out/argo-rollouts-crds"
  echo "$ARGO_ROLLOUTS_VERSION" >"$out/.rollouts-controller.version"
}

# -- Prometheus with service discovery for Kubernetes -------------------------------------

build_prometheus() {
  local v=${PROMETHEUS_VERSION#v0.}  # v0.316.0 is Prometheus 3.16.0
  local stamp="$PROMETHEUS_VERSION tags=$PROMETHEUS_TAGS"
  up_to_date prometheus "$stamp" && return 0
  log "resolving github.com/prometheus/prometheus@$PROMETHEUS_VERSION"
  new_module prometheus
  printf 'package tools\n\nimport (\n\t_ "github.com/prometheus/prometheus/discovery/kubernetes"\n)\n' \
    >"$work/prometheus/tools.go"
  (cd "$work/prometheus" && go get "github.com/prometheus/prometheus@$PROMETHEUS_VERSION" >/dev/null 2>&1 &&
    go mod tidy >/dev/null)
  build prometheus "$work/prometheus" github.com/prometheus/prometheus/cmd/prometheus \
    "-X github.com/prometheus/common/version.Version=$((${v%%.*} / 100)).$((${v%%.*} % 100)).${v#*.}" \
    "$PROMETHEUS_TAGS"
  echo "$stamp" >"$out/.prometheus.version"
}

# -- prometheus-operator: the operator and its CRDs ----------------------------------------

# Its go.mod replaces its nested pkg/apis/monitoring and pkg/client modules with
# directories (`go install pkg@v` refuses that). In a throw-away module its requirements
# name the published modules of the same release, so no replace is needed.
build_prometheus_operator() {
  local src mod=github.com/prometheus-operator/prometheus-operator
  up_to_date prometheus-operator "$PROMETHEUS_OPERATOR_VERSION" && return 0
  log "resolving $mod@$PROMETHEUS_OPERATOR_VERSION"
  src=$(mod_dir "$mod@$PROMETHEUS_OPERATOR_VERSION")
  [ -n "$src" ] || { log "cannot download $mod@$PROMETHEUS_OPERATOR_VERSION"; exit 1; }
  new_module prometheus-operator
  printf 'package tools\n\nimport (\n\t_ "%s/pkg/prometheus/server"\n)\n' "$mod" \
    >"$work/prometheus-operator/tools.go"
  (cd "$work/prometheus-operator" && go get "$mod@$PROMETHEUS_OPERATOR_VERSION" >/dev/null 2>&1 &&
    go mod tidy >/dev/null)
  build prometheus-operator "$work/prometheus-operator" "$mod/cmd/operator" \
    "-X github.com/prometheus/common/version.Version=${PROMETHEUS_OPERATOR_VERSION#v}"
  rm -rf "$out/prometheus-operator-crds"
  mkdir -p "$out/prometheus-operator-crds"
  cp "$src"/example/prometheus-operator-crd/*.yaml "$out/prometheus-operator-crds/"
  chmod -R u+w "$out/prometheus-operator-crds"
  echo "$PROMETHEUS_OPERATOR_VERSION" >"$out/.prometheus-operator.version"
}

# -- KWOK: simulated nodes -----------------------------------------------------------------

build_kwok() {
  up_to_date kwok "$KWOK_VERSION" && return 0
  local t0
  t0=$(date +%s)
  log "building kwok $KWOK_VERSION"
  (cd "$work" && GOBIN="$out" nice -n 10 go install -p "$GO_BUILD_PARALLEL" -trimpath \
    "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION")
  echo "$KWOK_VERSION" >"$out/.kwok.version"
  log "built kwok in $(( $(date +%s) - t0 ))s"
}

wanted() { # tool [default]: named on the command line, or no tool named and default 1
  case $only in
    "  ") [ "${2:-1}" = 1 ] ;;
    *" $1 "*) true ;;
    *) false ;;
  esac
}

t_start=$(date +%s)
wanted etcd && build_etcd
wanted kube-apiserver && build_kube_apiserver
wanted helm && build_helm
wanted kubectl "${K8S_TOOLS_KUBECTL:-0}" && build_kubectl
wanted node "${K8S_TOOLS_NODE:-1}" && build_node
wanted kwok "${K8S_TOOLS_NODE:-1}" && build_kwok
wanted prometheus "${K8S_TOOLS_NODE:-1}" && build_prometheus
wanted rollouts "${K8S_TOOLS_NODE:-1}" && build_argo_rollouts
wanted prometheus-operator "${K8S_TOOLS_NODE:-1}" && build_prometheus_operator
log "tools ready in $out ($(( $(date +%s) - t_start ))s)"
