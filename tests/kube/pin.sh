#!/usr/bin/env bash
# Pins a Go module to one Kubernetes release. k8s.io/kubernetes requires every staging module
# (k8s.io/api, k8s.io/apiserver, ...) at v0.0.0 and replaces it with its own ./staging folder,
# which a consumer cannot see; the module proxy serves them as v0.MINOR.PATCH. So this reads the
# release's own go.mod and adds one `replace` per staging module to the published version.
# Usage: tests/kube/pin.sh [RELEASE [MODULE_DIR [TOOL_PACKAGE]]]
#   then tests/go-align.py (the beds' shared modules at one version), and commit go.mod and go.sum
#   tests/kube/pin.sh v1.36.3                       this module (kube-testbed)
#   tests/kube/pin.sh v1.36.1 tests/kubelet/v1.36.1 k8s.io/kubernetes/cmd/kubelet
# A TOOL_PACKAGE is recorded as a `tool` of the module, so that `go build PACKAGE` builds that
# release's own main package (the kubelet) with every module it needs pinned in go.sum.
set -euo pipefail
release=${1:-v1.36.3}
staging="v0.${release#v1.}"
here=$(cd "$(dirname "$0")" && pwd)
dir=${2:-$here}
tool=${3:-}
mkdir -p "$dir"
cd "$dir"
[[ -f go.mod ]] || { go mod init "inplace.dev/tests/kubelet/${release//./_}" && go mod edit -go=1.26.0; } 2>/dev/null
release_gomod=$(go mod download -json "k8s.io/kubernetes@${release}" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
modules=$(go mod edit -json "$release_gomod" | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    if r["New"]["Path"].startswith("./staging/"):
        print(r["Old"]["Path"])')
args=()
for module in $modules; do
    args+=("-replace=${module}=${module}@${staging}")
done
go mod edit "${args[@]}"
go mod edit -require="k8s.io/kubernetes@${release}"
[[ -z $tool ]] || go mod edit -tool="$tool"
go mod tidy
echo "pinned k8s.io/kubernetes ${release} in $dir, $(wc -w <<<"$modules") staging modules at ${staging}"
