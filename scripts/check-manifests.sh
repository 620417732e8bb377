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

files=()
for f in deploy/kubernetes/*.yaml; do
  [ "$(basename "$f")" = kustomization.yaml ] && continue
  files+=("$f")
done
[ "${#files[@]}" -gt 0 ] || { echo "check-manifests: no manifests in deploy/kubernetes" >&2; exit 1; }

# Resources per file (non-empty YAML documents), to compare with what passed.
expected="$("$PY" - "${files[@]}" <<'PYEOF'
import sys, yaml
print(sum(1 for f in sys.argv[1:] for d in yaml.safe_load_all(open(f)) if d))
PYEOF
)"

status=0
for v in $KUBE_VERSIONS; do
  out="$("$VALIDATE" --strict -k "$v" "${files[@]}" 2>&1)" || status=1
  printf '%s\n' "$out" | grep -Ev '^INFO ' || true
  if printf '%s\n' "$out" | grep -Eq '^(ERROR|WARN|FATAL)'; then
    status=1
  fi
  passed="$(printf '%s\n' "$out" | grep -c '^INFO .* passed ' || true)"
  echo "check-manifests: Kubernetes $v: $passed of $expected resources passed (strict)"
  [ "$passed" -eq "$expected" ] || status=1
done
if [ "$status" -ne 0 ]; then
  echo "check-manifests: FAILED" >&2
fi
exit "$status"
