#!/usr/bin/env bash
# Builds the real KEDA operator and metrics adapter (cmd/operator, cmd/adapter) that the
# end-to-end loop scenario runs as processes, and unpacks KEDA's CRDs beside them, into a cache
# directory keyed by the KEDA version, so that warm runs build nothing. Idempotent.
#
# `go install` refuses KEDA (its go.mod has replace lines), so this generates a wrapper module
# that requires github.com/kedacore/keda/v2 and copies KEDA's own `replace (...)` block and go.sum
# verbatim (they only pin versions), then builds both commands from it with CGO_ENABLED=0 as
# upstream does. Cold: about a minute of downloads (1.5 GB module cache) and about 10 min of CPU
# on 2 cores (2.4 GB peak RSS); warm: nothing.
#
# Output: $NIGHTSHIFT_CACHE/keda-<version>/ with bin/keda-operator, bin/keda-adapter and crd/*.yaml
# (default cache ~/.cache/nightshift). Prints that directory on its last line of stdout. With
# --print-dir, only prints it (builds nothing).
set -euo pipefail

KEDA_VERSION=v2.20.2

cache="${NIGHTSHIFT_CACHE:-$HOME/.cache/nightshift}"
out="$cache/keda-$KEDA_VERSION"
if [[ "${1:-}" == "--print-dir" ]]; then echo "$out"; exit 0; fi

if [[ -x "$out/bin/keda-operator" && -x "$out/bin/keda-adapter" && -f "$out/crd/keda.sh_scaledobjects.yaml" ]]; then
  echo "$out"
  exit 0
fi

if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then PATH="/usr/local/go/bin:$PATH"; fi
command -v go >/dev/null || { echo "build-keda: Go toolchain not found" >&2; exit 1; }

total=$SECONDS
mod="github.com/kedacore/keda/v2"
keda_dir="$(go mod download -json "$mod@$KEDA_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[[ -n "$keda_dir" && -f "$keda_dir/go.mod" ]] || { echo "build-keda: cannot download $mod@$KEDA_VERSION" >&2; exit 1; }
echo "build-keda: KEDA $KEDA_VERSION source at $keda_dir (downloaded after $((SECONDS - total)) s)" >&2

wrapper="$out/wrapper"
rm -rf "$wrapper"
mkdir -p "$wrapper" "$out/bin" "$out/crd"
{
  echo "module nightshift.test/keda-build"
  echo
  sed -n 's/^go \([0-9.]*\)$/go \1/p' "$keda_dir/go.mod" | head -n 1
  echo
  echo "require $mod $KEDA_VERSION"
  echo
  awk '/^replace \($/,/^\)$/' "$keda_dir/go.mod"
} >"$wrapper/go.mod"
grep -q '^replace ($' "$wrapper/go.mod" || { echo "build-keda: no replace block found in KEDA's go.mod" >&2; exit 1; }
cp "$keda_dir/go.sum" "$wrapper/go.sum"
chmod u+w "$wrapper/go.sum"

flags=(-trimpath -buildvcs=false -ldflags='-s -w')
build() { # output name, package
  local name="$1" pkg="$2"
  if [[ -x "$out/bin/$name" ]]; then return 0; fi
  echo "build-keda: building $name ($pkg)" >&2
  local start=$SECONDS
  (cd "$wrapper" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build "${flags[@]}" -o "$out/bin/$name.tmp" "$pkg")
  mv "$out/bin/$name.tmp" "$out/bin/$name"
  echo "build-keda: $name built in $((SECONDS - start)) s" >&2
}
build keda-operator "$mod/cmd/operator"
build keda-adapter "$mod/cmd/adapter"

# The CRDs of exactly this version, from the module zip.
install -m 0644 "$keda_dir"/config/crd/bases/*.yaml "$out/crd/"
echo "build-keda: all present after $((SECONDS - total)) s" >&2
echo "$out"
