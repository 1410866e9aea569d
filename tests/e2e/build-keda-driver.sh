#!/usr/bin/env bash
# Builds the KEDA-protocol driver of the end-to-end tests (tests/e2e/keda-driver, a small Go module
# using KEDA's generated external-scaler client) into a cache directory keyed by the KEDA version
# and a hash of the driver's sources, so that warm runs skip the build. Idempotent.
#
# Output: $NIGHTSHIFT_CACHE/keda-driver-<version>-<hash>/keda-driver (default cache
# ~/.cache/nightshift); prints the binary's path on its last line of stdout. With --print-bin,
# only prints it (builds nothing), so that the tests find the binary without repeating the key.
set -euo pipefail

KEDA_VERSION=v2.21.0  # must match tests/e2e/keda-driver/go.mod

src="$(cd "$(dirname "${BASH_SOURCE[0]}")/keda-driver" && pwd)"
cache="${NIGHTSHIFT_CACHE:-$HOME/.cache/nightshift}"
hash="$(cat "$src/go.mod" "$src/go.sum" "$src"/*.go | sha256sum | cut -c1-12)"
out="$cache/keda-driver-$KEDA_VERSION-$hash/keda-driver"
if [[ "${1:-}" == "--print-bin" ]]; then echo "$out"; exit 0; fi

if [[ ! -x "$out" ]]; then
  if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then PATH="/usr/local/go/bin:$PATH"; fi
  command -v go >/dev/null || { echo "build-keda-driver: Go toolchain not found" >&2; exit 1; }
  echo "build-keda-driver: building the KEDA driver (KEDA $KEDA_VERSION client)" >&2
  start=$SECONDS
  mkdir -p "$(dirname "$out")"
  (cd "$src" && go build -trimpath -buildvcs=false -ldflags='-s -w' -o "$out.tmp" .)
  mv "$out.tmp" "$out"
  echo "build-keda-driver: built in $((SECONDS - start)) s" >&2
fi
echo "$out"
