#!/usr/bin/env bash
# Renders every kustomization under manifests/ into OUT_DIR/<path with / as _>.yaml, e.g. for
# `kubectl apply --dry-run=server -f OUT_DIR/`. The self-signed overlay is rendered only when its
# certs/ directory holds ca.crt, tls.crt and tls.key.
#
#   manifests/render.sh /tmp/rendered     (kustomize from $NIGHTSHIFT_KUSTOMIZE, the .ci/test cache, or PATH)
set -euo pipefail
out="${1:?usage: manifests/render.sh OUT_DIR}"
root="$(cd "$(dirname "$0")/.." && pwd)"
kustomize="${NIGHTSHIFT_KUSTOMIZE:-}"
[ -n "$kustomize" ] || { [ -x "${NIGHTSHIFT_CACHE:-$HOME/.cache/nightshift}/bin/kustomize" ] && kustomize="${NIGHTSHIFT_CACHE:-$HOME/.cache/nightshift}/bin/kustomize"; } || true
[ -n "$kustomize" ] || kustomize="$(command -v kustomize || true)"
[ -n "$kustomize" ] || { echo "kustomize not found: run bash .ci/test or set NIGHTSHIFT_KUSTOMIZE" >&2; exit 1; }
mkdir -p "$out"
cd "$root"
find manifests -name kustomization.yaml -printf '%h\n' | sort | while read -r dir; do
  if [ "$dir" = manifests/overlays/self-signed ] && [ ! -f "$dir/certs/tls.key" ]; then
    echo "skip $dir (no certs; run nightshift certs generate --dir $dir/certs)" >&2
    continue
  fi
  "$kustomize" build "$dir" > "$out/${dir//\//_}.yaml"
  echo "$out/${dir//\//_}.yaml"
done
