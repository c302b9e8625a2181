#!/usr/bin/env bash
# Flux's helm-controller and source-controller built from their Go modules, pinned, for the
# bench's comparison with Flux (SPEC P4); make test does not use them. Prints the directory
# holding the two binaries and Flux's CRDs (crds/). The modules' `replace ./api` points at a
# directory their published zips do not hold: it is dropped for the published api module of
# the same version.
set -euo pipefail
HELM_CONTROLLER=v1.6.4
SOURCE_CONTROLLER=v1.9.3
out=${KRYPTON_FLUX_DIR:-$HOME/.cache/krypton/flux-hc-$HELM_CONTROLLER-sc-$SOURCE_CONTROLLER}
mkdir -p "$out/crds"

build() {  # module version binary
    local module=$1 version=$2 binary=$3 src work
    [ -x "$out/$binary" ] && return 0
    src=$(go mod download -json "$module@$version" |
          python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
    work=$(mktemp -d)
    trap 'rm -rf "$work"' RETURN
    cp -r "$src/." "$work"
    chmod -R u+w "$work"
    (cd "$work" &&
     go mod edit -dropreplace "$module/api" &&
     go get "$module/api@$version" >/dev/null 2>&1 &&
     CGO_ENABLED=0 go build -trimpath -o "$out/$binary.tmp" .)
    cp "$src"/config/crd/bases/*.yaml "$out/crds/"
    mv "$out/$binary.tmp" "$out/$binary"
}

build github.com/fluxcd/source-controller "$SOURCE_CONTROLLER" source-controller >&2
build github.com/fluxcd/helm-controller "$HELM_CONTROLLER" helm-controller >&2
echo "$out"
