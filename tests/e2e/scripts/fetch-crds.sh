#!/usr/bin/env bash
# Fetches the real CustomResourceDefinitions of the projects whose kinds the manifests and
# examples use (KEDA, cert-manager, prometheus-operator, Argo Workflows), so that the end-to-end
# suite can validate those objects with the API server's server-side dry-run.
#
# The CRDs come from the projects' own repositories as the Go module proxy serves them (a module
# zip holds the repository's files): `go mod download` of one pinned version each, then the few
# CRD files are copied into $NIGHTSHIFT_CACHE/crds/<versions>/. Idempotent: a warm run does
# nothing. Takes a few seconds cold (a few MB of zips).
#
#   tests/e2e/scripts/fetch-crds.sh               fetch if missing; prints the directory last
#   tests/e2e/scripts/fetch-crds.sh --print-dir   only print the directory
set -euo pipefail

# Pinned versions. Argo Workflows v3 is refused by the Go module proxy (403), v4 is served and
# keeps the argoproj.io/v1alpha1 API.
KEDA=v2.21.0
CERT_MANAGER=v1.21.2
PROMETHEUS_OPERATOR=v0.85.0
ARGO_WORKFLOWS=v4.0.5

cache="${NIGHTSHIFT_CACHE:-$HOME/.cache/nightshift}"
dir="$cache/crds/keda-$KEDA-cert-manager-$CERT_MANAGER-prometheus-operator-$PROMETHEUS_OPERATOR-argo-$ARGO_WORKFLOWS"
if [ "${1:-}" = --print-dir ]; then
  echo "$dir"
  exit 0
fi
if [ -f "$dir/.complete" ]; then
  echo "$dir"
  exit 0
fi

go_bin="$(command -v go || true)"
[ -n "$go_bin" ] || [ ! -x /usr/local/go/bin/go ] || go_bin=/usr/local/go/bin/go
if [ -z "$go_bin" ]; then
  echo "Go is needed to fetch the CRDs for the end-to-end dry-run (or set NIGHTSHIFT_E2E_CRD_DIR)" >&2
  exit 1
fi

# module@version, then the CRD files inside it.
fetch() {
  local module="$1"
  shift
  local src
  # Run outside any module: `go mod download m@v` then only fills the module cache.
  src="$(cd "$tmp" && "$go_bin" mod download -json "$module" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
  [ -n "$src" ] || { echo "go mod download $module gave no directory" >&2; exit 1; }
  for f in "$@"; do
    cp "$src/$f" "$tmp/"
  done
}

mkdir -p "$(dirname "$dir")"
tmp="$(mktemp -d "$dir.tmp.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
fetch "github.com/kedacore/keda/v2@$KEDA" \
  config/crd/bases/keda.sh_scaledobjects.yaml \
  config/crd/bases/keda.sh_triggerauthentications.yaml \
  config/crd/bases/keda.sh_clustertriggerauthentications.yaml
fetch "github.com/cert-manager/cert-manager@$CERT_MANAGER" \
  deploy/crds/cert-manager.io_issuers.yaml \
  deploy/crds/cert-manager.io_clusterissuers.yaml \
  deploy/crds/cert-manager.io_certificates.yaml
fetch "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR" \
  example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml \
  example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml \
  example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml
fetch "github.com/argoproj/argo-workflows/v4@$ARGO_WORKFLOWS" \
  manifests/base/crds/full/argoproj.io_workflowtemplates.yaml
chmod 755 "$tmp"
chmod 644 "$tmp"/*.yaml
touch "$tmp/.complete"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "$dir"
