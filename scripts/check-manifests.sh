#!/usr/bin/env bash
# Schema check of deploy/kubernetes: every resource in every manifest is
# validated by kubernetes-validate (PyPI; it bundles the Kubernetes JSON
# schemas, so this runs offline) in strict mode, which also rejects fields the
# schema does not know (a typo such as `readinesProbe` would otherwise pass).
#
# Usage: scripts/check-manifests.sh            (from anywhere)
#   KUBE_VERSIONS="1.33.0 1.37.0" scripts/check-manifests.sh
#
# Fails on any ERROR, on any WARN (a kind or apiVersion without a schema, e.g.
# a misspelt apiVersion), and when fewer resources passed than the files hold.
# kustomization.yaml is not a Kubernetes resource and is skipped here;
# crates/kvgate/tests/deploy_manifests.rs checks that it lists every file.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# The oldest Kubernetes minor still commonly run, and the newest the package
# bundles (kubernetes-validate 1.37.0 in scripts/setup-test-env.sh).
KUBE_VERSIONS="${KUBE_VERSIONS:-1.31.0 1.37.0}"

PY="$(bash scripts/setup-test-env.sh)"
VALIDATE="$(dirname "$PY")/kubernetes-validate"
[ -x "$VALIDATE" ] || { echo "check-manifests: $VALIDATE is missing" >&2; exit 1; }

status=0

# validate LABEL FILE...: every resource in the files, strictly, for each
# Kubernetes version; fails on any ERROR or WARN and when fewer resources
# passed than the files hold (non-empty YAML documents).
validate() {
  local label="$1"
  shift
  [ "$#" -gt 0 ] || { echo "check-manifests: no manifests in $label" >&2; status=1; return; }
  local expected out passed v
  expected="$("$PY" - "$@" <<'PYEOF'
import sys, yaml
print(sum(1 for f in sys.argv[1:] for d in yaml.safe_load_all(open(f)) if d))
PYEOF
)"
  for v in $KUBE_VERSIONS; do
    out="$("$VALIDATE" --strict -k "$v" "$@" 2>&1)" || status=1
    printf '%s\n' "$out" | grep -Ev '^INFO ' || true
    if printf '%s\n' "$out" | grep -Eq '^(ERROR|WARN|FATAL)'; then
      status=1
    fi
    passed="$(printf '%s\n' "$out" | grep -c '^INFO .* passed ' || true)"
    echo "check-manifests: $label, Kubernetes $v: $passed of $expected resources passed (strict)"
    [ "$passed" -eq "$expected" ] || status=1
  done
}

files=()
for f in deploy/kubernetes/*.yaml; do
  [ "$(basename "$f")" = kustomization.yaml ] && continue
  files+=("$f")
done
validate deploy/kubernetes "${files[@]}"

# deploy/gateway-api: the Kubernetes kinds as above; the InferencePool
# against its CRD's schema (scripts/schemas/, strict). The HTTPRoute's
# Gateway API CRDs are not bundled anywhere offline:
# crates/kvgate/tests/deploy_gateway_api.rs checks its references instead.
files=()
for f in deploy/gateway-api/*.yaml; do
  case "$(basename "$f")" in kustomization.yaml|inferencepool.yaml|httproute.yaml) continue ;; esac
  files+=("$f")
done
validate deploy/gateway-api "${files[@]}"
"$PY" scripts/check-inferencepool.py scripts/schemas/inference.networking.k8s.io_inferencepools.yaml \
  deploy/gateway-api/inferencepool.yaml || status=1

if [ "$status" -ne 0 ]; then
  echo "check-manifests: FAILED" >&2
fi
exit "$status"
