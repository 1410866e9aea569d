#!/usr/bin/env bash
# Builds the control-plane binaries the end-to-end tests run (etcd, kube-apiserver,
# kube-scheduler, kube-controller-manager, kubectl, kwok) into a cache directory keyed by
# version, so that warm runs skip the build entirely. Idempotent: a binary that exists is kept.
#
# Output: $NIGHTSHIFT_CACHE/k8s-<version>/bin (default cache ~/.cache/nightshift).
# Prints the bin directory on its last line of stdout. With --print-bin-dir, only prints it
# (builds nothing), so that the tests find the binaries without repeating the versions.
set -euo pipefail

K8S_VERSION=v1.36.3   # must match tests/e2e/scripts/k8s/go.mod
ETCD_VERSION=v3.6.16  # must match tests/e2e/scripts/etcd/go.mod
KWOK_VERSION=v0.8.0

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${NIGHTSHIFT_CACHE:-$HOME/.cache/nightshift}"
bin="$cache/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION/bin"
if [[ "${1:-}" == "--print-bin-dir" ]]; then echo "$bin"; exit 0; fi
mkdir -p "$bin"

# CI's environment may lack Go on PATH although the toolchain is installed.
if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then PATH="/usr/local/go/bin:$PATH"; fi
command -v go >/dev/null || { echo "build-control-plane: Go toolchain not found (needed to build the control plane)" >&2; exit 1; }

# Small binaries, no paths from this machine; the machine is small, so one binary at a time
# (go build itself still compiles packages in parallel).
flags=(-trimpath -buildvcs=false -ldflags='-s -w')

build() { # name, module dir, package
  local name="$1" dir="$2" pkg="$3"
  if [[ -x "$bin/$name" ]]; then return 0; fi
  echo "build-control-plane: building $name ($pkg)" >&2
  local start=$SECONDS
  (cd "$dir" && go build "${flags[@]}" -o "$bin/$name.tmp" "$pkg")
  mv "$bin/$name.tmp" "$bin/$name"
  echo "build-control-plane: $name built in $((SECONDS - start)) s" >&2
}

total=$SECONDS
build etcd "$here/etcd" go.etcd.io/etcd/server/v3
build kube-apiserver "$here/k8s" k8s.io/kubernetes/cmd/kube-apiserver
build kube-scheduler "$here/k8s" k8s.io/kubernetes/cmd/kube-scheduler
build kube-controller-manager "$here/k8s" k8s.io/kubernetes/cmd/kube-controller-manager
build kubectl "$here/k8s" k8s.io/kubernetes/cmd/kubectl
if [[ ! -x "$bin/kwok" ]]; then
  echo "build-control-plane: building kwok $KWOK_VERSION" >&2
  start=$SECONDS
  GOBIN="$bin" go install "${flags[@]}" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  echo "build-control-plane: kwok built in $((SECONDS - start)) s" >&2
fi
echo "build-control-plane: all binaries present after $((SECONDS - total)) s" >&2
echo "$bin"
